"""A node is not ready from a rebalance's revoke to the group's answer: its partitions
closing, nothing given, it owns nothing (it said ready then, and a rollout went on while
no partition of it was worked)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from fakes import RunningNode, wait_until
from test_node_memory import PARTITIONS, SERVICE, schedule

from app.kafka.memory import MemoryLog


async def test_a_node_whose_partitions_are_revoked_is_not_ready_until_the_group_answers(
    tmp_path: Path,
) -> None:
    log = MemoryLog()
    a = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    b: RunningNode | None = None
    try:
        await wait_until(a.runs)
        await schedule(log, "o1", int(time.time() * 1000) + 3_600_000)
        await schedule(log, "o2", int(time.time() * 1000) + 3_600_000)

        async def slow_commit(transactional_id: str) -> None:
            await asyncio.sleep(0.5)  # a slow broker: each commit, the closes' too

        log.before_commit = slow_commit
        seen: list[tuple[bool, tuple[int, ...]]] = []

        async def sample() -> None:
            while True:
                h = a.node.health()
                seen.append((bool(h["ready"]), tuple(h["owned"])))
                await asyncio.sleep(0.005)

        sampler = asyncio.create_task(sample())
        b = await RunningNode(log, tmp_path, "b", SERVICE, PARTITIONS).start()
        await wait_until(lambda: a.runs(1) and b is not None and b.runs(1), within=20)
        sampler.cancel()
        assert (True, ()) not in seen, "ready owning nothing"
        assert (False, ()) in seen  # the rebalance's closes were seen
    finally:
        log.before_commit = None
        if b is not None:
            await b.stop()
        await a.stop()
