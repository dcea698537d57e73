"""Two real nodes on the in-memory log, each with its cluster status as the worker runs it
(`for_node`, `run`, `stop`): each sees the other's partitions, a hand-over shows at once,
and a record that is no report is counted in the node's Prometheus registry (#22)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fakes import RunningNode, wait_until
from test_node_memory import SERVICE

from app.kafka.memory import MemoryLog
from app.ops.cluster_status import ClusterStatus
from app.ops.status_for_node import for_node
from app.protocol.topics import ContextTopics

PARTITIONS = 2


class Member:
    def __init__(self, log: MemoryLog, data: Path, name: str) -> None:
        self.running = RunningNode(log, data, name, SERVICE, PARTITIONS)
        self.status: ClusterStatus | None = None
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> Member:
        await self.running.start()
        self.status = for_node(self.running.node, self.running.name, 0)
        self.status.interval_ms = 200
        await self.status.start()
        self.task = asyncio.create_task(self.status.run())
        return self

    def sees(self) -> dict[int, str]:
        """Partition → the node whose report claims it, as this node reads the topic."""
        assert self.status is not None
        return {p.partition: r.node for r in self.status.reports() for p in r.partitions}

    def nodes(self) -> list[str]:
        assert self.status is not None
        return sorted(r.node for r in self.status.reports())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        if self.status is not None:
            await self.status.stop()
        await self.running.stop()


@pytest.fixture
async def members(tmp_path: Path) -> AsyncIterator[tuple[MemoryLog, list[Member]]]:
    log = MemoryLog()
    started: list[Member] = []
    yield log, started
    for m in reversed(started):
        await m.stop()


async def test_two_nodes_see_the_whole_group_and_a_hand_over(
    members: tuple[MemoryLog, list[Member]], tmp_path: Path
) -> None:
    log, started = members
    a = await Member(log, tmp_path, "node-a").start()
    started.append(a)
    await wait_until(lambda: a.running.runs(), what=lambda: str(a.running.node.health()))
    await wait_until(lambda: a.sees() == {0: "node-a", 1: "node-a"}, what=lambda: str(a.sees()))
    b = await Member(log, tmp_path, "node-b").start()
    started.append(b)

    def split() -> bool:
        seen = b.sees()
        return (
            a.sees() == seen
            and sorted(seen) == [0, 1]
            and set(seen.values())
            == {
                "node-a",
                "node-b",
            }
        )

    await wait_until(split, what=lambda: f"a sees {a.sees()}, b sees {b.sees()}")
    # b stops cleanly: its tombstone, and a's report of both partitions once it has them.
    await b.stop()
    started.remove(b)
    await wait_until(
        lambda: a.sees() == {0: "node-a", 1: "node-a"} and a.nodes() == ["node-a"],
        what=lambda: str(a.sees()),
    )
    # Another producer's record: counted in the node's registry, the reading goes on.
    topic = ContextTopics(SERVICE.aggregates[0].context).nodes
    await log.publisher().send(topic, b"x", b"not a report", 0)
    registry = a.running.node.metrics.registry
    await wait_until(
        lambda: registry.get_sample_value("tickwheel_cluster_status_bad_records_total") == 1
    )
    assert a.task is not None and not a.task.done()
