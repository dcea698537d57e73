"""A partition task's input (`PartitionInput`: its queue, the batches the poll loop kept
for it, its worker, lock and in-process wake-up) on the in-memory log: it is the task's,
one per take, and nothing of it outlives the task's close: a wake-up of the timer loop
that lands while (or after) the partition is let go starts no worker for a partition the
node no longer runs, and a retake starts with a fresh input, nothing of the previous
take's in it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import pytest
from fakes import RunningNode, wait_until
from test_node_memory import PARTITIONS, SERVICE, TOPICS, task_of

from app.errors import KafkaUnavailable
from app.kafka.memory import MemoryLog
from app.node.cycles import PartitionCycles
from app.node.partition_input import LOCAL, PartitionInput
from app.node.task_id import TaskId
from app.node.task_state import TaskState
from app.timers.runner import RoundStats
from tables import StoreError


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[RunningNode]:
    n = await RunningNode(MemoryLog(), tmp_path, "a", SERVICE, PARTITIONS).start()
    yield n
    await n.stop()


def workers(p: int) -> list[asyncio.Task[object]]:
    """The workers of partition p still alive (each named for its partition and type)."""
    name = f"partition {p} of {TOPICS.type_name}"
    return [t for t in asyncio.all_tasks() if t.get_name() == name and not t.done()]


def late_wake_ups(node: RunningNode, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Wakes p's cycles (as a timer round that claimed in-process timers of p does) as p's
    close stops its runner: the round's wake-up lands while p is let go."""
    kept = node.node.types[TOPICS.type_name]
    stop_partition, woken = kept.runner.stop_partition, list[int]()

    async def waking(p: int) -> RoundStats:
        node.node.cycles.fire_local(TOPICS.type_name, p)
        woken.append(p)
        return await stop_partition(p)

    monkeypatch.setattr(kept.runner, "stop_partition", waking)
    return woken


async def test_a_revoked_task_leaves_no_worker_or_queue_behind(
    node: RunningNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    await wait_until(node.runs)
    task = node.node.tasks.running[task_of(1)]
    inp = task.input
    assert isinstance(inp, PartitionInput) and inp.running and len(workers(1)) == 1
    woken = late_wake_ups(node, monkeypatch)
    await node.node._revoked({(TOPICS.events, 1)})
    assert woken == [1] and task.state is TaskState.CLOSED
    node.node.cycles.fire_local(TOPICS.type_name, 1)  # a round's, after the close
    await asyncio.sleep(0)
    assert workers(1) == [], "a worker of a partition the node no longer runs"
    assert task.input is None and not inp.running
    assert inp.queue.empty() and not inp.held.batches and not inp.local
    # The other partition's task and worker are untouched.
    assert len(workers(0)) == 1 and node.node.tasks.running[task_of(0)].state is TaskState.RUNNING


async def test_a_retake_starts_with_a_fresh_input(
    node: RunningNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure closes the task dirty and takes it afresh: the new take's input is a new
    one, empty (no batch, no wake-up of the previous take's); the old one's worker ended."""
    await wait_until(node.runs)
    task = node.node.tasks.running[task_of(1)]
    old = task.input
    assert old is not None
    woken = late_wake_ups(node, monkeypatch)
    node.node.tasks.running[task_of(1)].failed("a cycle", StoreError("the disk is gone"))
    assert task.state is TaskState.SUSPENDED and task_of(1) not in node.node.tasks.running
    await wait_until(lambda: task.state is TaskState.RUNNING and task.takes == 2)
    assert woken == [1]
    new = task.input
    assert new is not None and new is not old and not old.running
    assert new.queue is not old.queue and new.held is not old.held and new.lock is not old.lock
    assert not new.local and new.failed_at == {}
    assert workers(1) and len(workers(1)) == 1


class Cutting:
    """Cycles whose worker is in the middle of a cycle, and throws its half away (a step
    later) when it is stopped."""

    def __init__(self) -> None:
        self.in_cycle = asyncio.Event()
        self.thrown_away = False

    async def work(self, inp: PartitionInput) -> None:
        try:
            self.in_cycle.set()
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(0)  # the cycle's own clean-up takes a step
            self.thrown_away = inp.cut = True
            raise


async def test_every_stop_waits_for_the_worker_and_says_it_was_cut_short() -> None:
    """Two stops at once (the node's run ending while a revoke closes the task): neither
    returns before the worker threw its half cycle away, and both say it was cut short,
    so that no close commits what it staged."""
    cycles = Cutting()
    failures: list[str] = []
    inp = PartitionInput(
        TaskId("a.type", 0),
        cast(PartitionCycles, cycles),
        lambda what, _: failures.append(what),
        lambda: None,
    )
    await cycles.in_cycle.wait()
    inp.queue.put_nowait(("t", []))
    first, second = await asyncio.gather(inp.stop(), inp.stop())
    assert first and second and cycles.thrown_away
    assert not inp.running and inp.queue.empty() and failures == []
    inp.fire_local()  # stopped: nothing queued any more
    assert inp.queue.empty() and not inp.local


async def test_claims_a_cut_cycle_threw_away_do_not_count_as_committed(
    node: RunningNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A revoke cuts p's cycle short while the timer loop's claims of p wait for p's lock:
    the cut throws every row of p's transaction away, the claim rows included, so the
    claims must not count as committed (their commands would leave with no claim
    committed); `commit_claims` raises, and the round sends none of them."""
    await wait_until(node.runs)
    n = node.node
    task = n.tasks.running[task_of(1)]
    inp = task.input
    assert inp is not None
    kept = n.types[TOPICS.type_name]
    never = asyncio.Event()

    async def slow_cycle(key: TaskId, items: object, backlogs: object) -> bool:
        await never.wait()  # a cycle in progress: it holds p's lock
        return True

    monkeypatch.setattr(n.cycles, "_cycle", slow_cycle)
    inp.queue.put_nowait(LOCAL)
    await wait_until(lambda: inp.lock.locked())
    assert task.transaction is not None
    task.transaction.add(b"claim-row", b"claimed")  # the round's claim row
    claims = asyncio.create_task(n.commits.commit_claims(kept, {1}))
    for _ in range(3):
        await asyncio.sleep(0)
    assert not claims.done(), "it waits for p's lock"
    await n.tasks.revoke({task_of(1)})
    (result,) = await asyncio.gather(claims, return_exceptions=True)
    assert inp.cut, "the cycle was cut short"
    assert isinstance(result, KafkaUnavailable), result
