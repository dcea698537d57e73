"""A partition's timer rounds that keep raising something other than `StoreError` (as
rocksdict raises on a read that meets an I/O error or a checksum mismatch): its task is
closed and taken afresh after `FAILED_ROUNDS` in a row, never a partition that stops
firing while the other goes on; `/healthz` names that partition alone meanwhile."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fakes import RunningNode, wait_until
from test_node_memory import PARTITIONS, SERVICE, TOPICS, events, schedule, task_of

from app.errors import NodeFailed
from app.kafka.memory import MemoryLog
from app.node.failing import RETAKE_BACKOFF_S, Failing, retake_after
from app.node.node import Node
from app.node.partition_timers import FAILED_ROUNDS
from app.node.task_id import TaskId
from tables.partitioner import partition_of
from tables.rocksdb_reads import RocksDBReads

BAD, GOOD = 0, 1


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[RunningNode]:
    n = await RunningNode(MemoryLog(), tmp_path, "a", SERVICE, PARTITIONS).start()
    yield n
    await n.stop()


def owner_in(p: int) -> str:
    return next(f"o{i}" for i in range(1, 99) if partition_of(f"o{i}", PARTITIONS) == p)


def failing_reads(monkeypatch: pytest.MonkeyPatch, times: int) -> list[int]:
    """The due reads of partition BAD raise a plain Exception `times` times; the calls."""
    found = RocksDBReads._found
    raised: list[int] = []

    def reads(self: Any, partitions: Any, until: Any, limit: Any) -> Any:
        if BAD in partitions and len(raised) < times:
            raised.append(BAD)
            raise Exception("Corruption: block checksum mismatch")  # as rocksdict raises
        return found(self, partitions, until, limit)

    monkeypatch.setattr(RocksDBReads, "_found", reads)
    return raised


async def test_rounds_that_keep_raising_take_the_partition_afresh(
    node: RunningNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = node.node.clients
    assert isinstance(log, MemoryLog)
    await wait_until(node.runs)
    raised = failing_reads(monkeypatch, FAILED_ROUNDS)
    at = int(time.time() * 1000) + 300
    await schedule(log, owner_in(BAD), at)
    await schedule(log, owner_in(GOOD), at)

    def fired() -> set[str]:
        return {e.aggregate.id for e in events(log, "Fired")}

    await wait_until(lambda: {owner_in(BAD), owner_in(GOOD)} <= fired())
    assert len(raised) == FAILED_ROUNDS
    task = node.node._tasks[task_of(BAD)]
    assert task.takes == 2  # closed dirty and taken afresh, once
    assert node.node._tasks[task_of(GOOD)].takes == 1  # never touched
    assert node.node._failure is None
    await wait_until(lambda: node.node.health()["ready"])


async def test_health_names_the_failing_partition_alone(
    node: RunningNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the rounds of BAD fail (fewer in a row than retake it), only BAD is stalled."""
    log = node.node.clients
    assert isinstance(log, MemoryLog)
    await wait_until(node.runs)
    monkeypatch.setattr("app.node.partition_timers.FAILED_ROUNDS", 1_000)
    raised = failing_reads(monkeypatch, 1_000)
    await schedule(log, owner_in(BAD), int(time.time() * 1000))
    typed: Node = node.node

    def failing() -> set[int]:
        return {key.p for key, task in typed._tasks.items() if task.rounds_failing}

    await wait_until(lambda: bool(failing()))
    assert raised and failing() == {BAD}
    health = typed.health()
    assert health["stalled"] == {str(BAD): f"{TOPICS.type_name}: timer rounds failing"}
    assert TaskId(TOPICS.type_name, BAD) in typed._tasks


async def test_a_fault_that_never_passes_is_retaken_ever_later(
    node: RunningNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At once after its first failure, then after `RETAKE_BACKOFF_S` doubling: a fault
    that never passes costs a restore every few seconds, not four a second."""
    log = node.node.clients
    assert isinstance(log, MemoryLog)
    await wait_until(node.runs)
    monkeypatch.setattr("app.node.partition_timers.FAILED_ROUNDS", 1)  # failed at once
    failing_reads(monkeypatch, 10**9)
    task = node.node._tasks[task_of(BAD)]

    def failures() -> int:
        report = task.failing.report().get(str(BAD))
        return 0 if report is None else int(str(report["failures"]))

    began = time.monotonic()
    await schedule(log, owner_in(BAD), int(time.time() * 1000))
    await wait_until(lambda: failures() >= 4, within=30)
    # Retaken at once after the first failure, then after 0.5 s, then after 1 s.
    assert time.monotonic() - began >= RETAKE_BACKOFF_S * 3
    assert [retake_after(Failing({}, "x", n)) for n in range(1, 8)] == [0, 0.5, 1, 2, 4, 8, 10]
    assert node.node._failure is None


async def test_a_round_that_raises_a_base_exception_takes_the_partition_afresh(
    node: RunningNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel leaking out of a call in a round is no `Exception`: the loop's run ended
    with it, quietly, and the partition's timers never fired again while its commands were
    decided and `/healthz` said ready (failure-path hunt, finding 2)."""
    log = node.node.clients
    assert isinstance(log, MemoryLog)
    await wait_until(node.runs)
    found = RocksDBReads._found
    raised: list[int] = []

    def reads(self: Any, partitions: Any, until: Any, limit: Any) -> Any:
        if BAD in partitions and not raised:
            raised.append(BAD)
            raise asyncio.CancelledError  # leaked out of a call, not a cancel of the loop
        return found(self, partitions, until, limit)

    monkeypatch.setattr(RocksDBReads, "_found", reads)
    at = int(time.time() * 1000) + 300
    await schedule(log, owner_in(BAD), at)
    await schedule(log, owner_in(GOOD), at)
    await wait_until(lambda: {owner_in(BAD), owner_in(GOOD)} <= fired(log))
    assert raised == [BAD]
    assert node.node._tasks[task_of(BAD)].takes == 2  # closed dirty and taken afresh
    assert node.node._tasks[task_of(GOOD)].takes == 1
    assert node.node._failure is None


async def test_a_broker_watch_that_ends_stops_the_node(tmp_path: Path) -> None:
    """Ended, it would say the broker is up through an outage (or down for good)."""
    node = await RunningNode(MemoryLog(), tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(node.runs)
        watch = node.node.broker.task
        assert watch is not None and node.task is not None
        watch.cancel()
        with pytest.raises(NodeFailed, match="the broker watch"):
            await asyncio.wait_for(asyncio.shield(node.task), 5)
    finally:
        try:
            await node.stop()
        except NodeFailed:
            await node.node.stop()  # its run raised before `stop` could stop the node


def fired(log: MemoryLog) -> set[str]:
    return {e.aggregate.id for e in events(log, "Fired")}
