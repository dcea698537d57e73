"""A partition task's cycles write its timers through its own partition's handle of the
store (`PartitionHandle`, issue #19), on the in-memory log: a cancel that finds its row
nowhere waits for its own partition's lock alone, never for another partition's write
held in the changelog sink; and a partition let go and taken again is written through a
handle made by the new take (the old one refused); and its timers fire through the
handle too (its firing's store)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fakes import RunningNode, wait_until
from pydantic import BaseModel

from app.errors import KafkaUnavailable, node_fault
from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType, Command, Decision
from app.node.task_id import TaskId
from app.node.task_state import TaskState
from app.protocol.topics import AggregateTopics
from app.protocol.wire import CommandEnvelope, encode
from app.service import Service
from app.timers.runner.partition_store import PartitionStore
from app.timers.subscription import PutTimer, apply_all
from tables import AggregateRef, CommandSpec, OnceRule, Timer, TimerStatus
from tables.memory_store import MemoryTimerStore
from tables.partitioned import PartitionedStore
from tables.partitioner import partition_of
from tables.store import ChangelogRecord
from tables.tombstones import CancelMark

PARTITIONS = 2
TOPICS = AggregateTopics("h19", "clock")


def task_of(p: int) -> TaskId:
    """The task of p of the type these tests run (one task per type and partition)."""
    return TaskId(TOPICS.type_name, p)


class Clock(BaseModel):
    pass


clock = AggregateType("h19", "clock", Clock)


@clock.command("Set")
def _set(state: Clock, cmd: Command, d: Decision) -> None:
    d.schedule(str(cmd.body["key"]), OnceRule(at=int(cmd.body["at"])), CommandSpec(type="Noop"))


@clock.command("Cancel")
def _cancel(state: Clock, cmd: Command, d: Decision) -> None:
    d.cancel_schedule(str(cmd.body["key"]))


@clock.command("Noop")
def _noop(state: Clock, cmd: Command, d: Decision) -> None:
    pass


SERVICE = Service(aggregates=(clock,))
FAR = int(time.time() * 1000) + 3_600_000  # never due while a test runs


def owner_in(p: int) -> str:
    return next(f"c{i}" for i in range(1, 99) if partition_of(f"c{i}", PARTITIONS) == p)


async def command(log: MemoryLog, owner: str, type_: str, **body: object) -> None:
    cmd = CommandEnvelope(
        request_id=uuid.uuid4().hex,
        type=type_,
        aggregate=AggregateRef(context="h19", aggregate="clock", id=owner),
        body=body,
        issued_at=int(time.time() * 1000),
    )
    p = partition_of(owner, PARTITIONS)
    await log.publisher().send(TOPICS.commands, owner.encode(), encode(cmd), p)


def rows(log: MemoryLog, p: int) -> int:
    return len(log.records(TOPICS.timers_changelog, p))


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[RunningNode]:
    n = await RunningNode(MemoryLog(), tmp_path, "a", SERVICE, PARTITIONS).start()
    await wait_until(n.runs)
    yield n
    await n.stop()


async def test_a_cancel_in_one_partition_goes_on_while_anothers_write_is_held(
    node: RunningNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Partition 1's put waits in the changelog sink, under its lock; partition 0's cycle
    cancels a key it holds no row of. Through the whole store such a cancel locks every
    partition served (the row may be a put still in its sink), so it would wait for
    partition 1's; through partition 0's handle it looks in, and locks, partition 0 alone."""
    log = node.node.clients
    assert isinstance(log, MemoryLog)
    kept = node.node.types[TOPICS.type_name]
    store = kept.store
    assert isinstance(store, PartitionedStore)  # the node's (RocksDB), on the memory log
    # Partition 1's own sink: its transaction, attached to its handle by its take.
    serving, sink = store._sinks[1]
    entered, release = asyncio.Event(), asyncio.Event()

    async def holding(records: list[ChangelogRecord]) -> None:
        if any(r.partition == 1 for r in records) and not release.is_set():
            entered.set()
            await release.wait()
        await sink(records)

    monkeypatch.setitem(store._sinks, 1, (serving, holding))
    cancels: list[tuple[str, bool]] = []
    cancel = store._cancel

    async def counted(
        owner: AggregateRef,
        key: str,
        version: int,
        only: tuple[int, int] | None,
        mark: CancelMark | None = None,
    ) -> bool:
        done = await cancel(owner, key, version, only, mark)
        cancels.append((owner.id, done))
        return done

    monkeypatch.setattr(store, "_cancel", counted)
    try:
        await command(log, owner_in(1), "Set", key="k", at=FAR)
        await wait_until(entered.is_set, what=lambda: "partition 1's put never reached its sink")
        await command(log, owner_in(0), "Cancel", key="none")
        await wait_until(
            # It leaves the key a tombstone (`tables.tombstones`), in partition 0.
            lambda: (owner_in(0), True) in cancels,
            what=lambda: f"partition 0's cancel waited for partition 1's write: {cancels}",
        )
        assert not release.is_set() and rows(log, 1) == 0, "partition 1's write still held"
    finally:
        release.set()
    await wait_until(lambda: rows(log, 1) == 1, what=lambda: "partition 1's put never ended")


async def test_a_partition_taken_again_is_written_through_its_new_takes_handle(
    node: RunningNode,
) -> None:
    """A task's handle is its take's: let go (here by a failure, closed dirty and taken
    afresh), p is served again but the old handle is refused; the cycles write through
    the new take's, and what they write lands in the table and its changelog."""
    log = node.node.clients
    assert isinstance(log, MemoryLog)
    p = 1
    task = node.node._tasks[task_of(p)]
    old = task.store
    assert old is not None and old.partition == p and old.serving
    task.failed("a test", KafkaUnavailable("the coordinator is away"))
    # Firing again once its log is read to where it ended at the retake (its own events
    # read back may still wait then: `FailingPartitions.behind`).
    await wait_until(
        lambda: task.state is TaskState.RUNNING and task.takes == 2 and task.firing is not None,
        what=lambda: f"partition {p} never fired again: {task}",
    )
    new = task.store
    assert new is not None and new is not old and new.serving
    assert not old.serving, "the first take's handle is refused once p was let go"
    await command(log, owner_in(p), "Set", key="k", at=FAR)
    await wait_until(lambda: rows(log, p) == 1, what=lambda: f"{task.broken}")
    timer = await new.find(AggregateRef(context="h19", aggregate="clock", id=owner_in(p)), "k")
    assert timer is not None and timer.partition == p
    assert task.broken is None and task.takes == 2, "no write of it was refused"


async def test_another_partitions_timer_given_to_a_handle_is_a_records_error() -> None:
    """A timer of another partition through a handle is a `ValueError`, which a cycle
    dead-letters as its record's (not a node fault, which would close the task dirty);
    nothing of it is written."""
    store = MemoryTimerStore(PARTITIONS)
    await store.assign({0, 1})
    timer = Timer(
        id="e1",
        owner=AggregateRef(context="h19", aggregate="clock", id=owner_in(1)),
        key="k",
        version=1,
        partition=1,
        rule=OnceRule(at=FAR),
        target=AggregateRef(context="h19", aggregate="clock", id=owner_in(1)),
        command=CommandSpec(type="Noop"),
        slot=0,
        slot_due_at=FAR,
        due_at=FAR,
    )
    with pytest.raises(ValueError, match="partition 1") as raised:
        await apply_all(store.partition(0), [PutTimer(timer)])
    assert not node_fault(raised.value)
    assert await store.timers_of(timer.owner) == []
    await store.close()


async def test_a_tasks_timers_fire_through_its_own_takes_handle(
    node: RunningNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task's firing is given its take's handle (`PartitionStore`): a timer fired
    in-process (its claim handed over, checked still due, its outcome settled) reaches
    the timer store through p's handle alone, never the type's whole store; a retake's
    firing is given the retake's handle."""
    log = node.node.clients
    assert isinstance(log, MemoryLog)
    store = node.node.types[TOPICS.type_name].store
    whole: list[str] = []
    for name in ("settle", "find"):
        real = getattr(store, name)

        async def counted(*args: object, _name: str = name, _real: Any = real) -> object:
            whole.append(_name)
            return await _real(*args)

        monkeypatch.setattr(store, name, counted)
    p = 1
    task = node.node._tasks[task_of(p)]
    firing = task.firing
    handle = task.store
    assert handle is not None and firing is not None
    assert isinstance(firing.store, PartitionStore) and firing.store._handle is handle
    owner = AggregateRef(context="h19", aggregate="clock", id=owner_in(p))
    await command(log, owner.id, "Set", key="k", at=int(time.time() * 1000))

    async def fired() -> bool:
        timer = await handle.find(owner, "k")
        return timer is not None and timer.status is TimerStatus.FIRED

    await wait_until(fired, what=lambda: f"never fired: {task.broken}")
    assert whole == [], "the firing reached the type's whole store"
    task.failed("a test", KafkaUnavailable("the coordinator is away"))
    # Firing again once its log is read to where it ended at the retake (its own events
    # read back may still wait then: `FailingPartitions.behind`).
    await wait_until(
        lambda: task.state is TaskState.RUNNING and task.takes == 2 and task.firing is not None,
        what=lambda: f"partition {p} never fired again: {task}",
    )
    again = task.firing
    assert again is not None and again is not firing and isinstance(again.store, PartitionStore)
    assert again.store._handle is task.store is not handle


async def test_a_partitions_rows_go_to_its_takes_transaction_directly(
    node: RunningNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A take attaches p's transaction to p's handle: p's rows go to it directly, never
    through the type's sink (`TypeTransactions`, which would route them by partition);
    a retake's rows go to the retake's transaction."""
    log = node.node.clients
    assert isinstance(log, MemoryLog)
    kept = node.node.types[TOPICS.type_name]
    routed: list[ChangelogRecord] = []
    route = type(kept.transactions).__call__

    async def routing(self: Any, records: list[ChangelogRecord]) -> None:
        routed.extend(records)
        await route(self, records)

    monkeypatch.setattr(type(kept.transactions), "__call__", routing)
    p = 1
    task = node.node._tasks[task_of(p)]
    await command(log, owner_in(p), "Set", key="k", at=FAR)
    await wait_until(lambda: rows(log, p) == 1, what=lambda: f"{task.broken}")
    task.failed("a test", KafkaUnavailable("the coordinator is away"))
    # Firing again once its log is read to where it ended at the retake (its own events
    # read back may still wait then: `FailingPartitions.behind`).
    await wait_until(
        lambda: task.state is TaskState.RUNNING and task.takes == 2 and task.firing is not None,
        what=lambda: f"partition {p} never fired again: {task}",
    )
    await command(log, owner_in(p), "Set", key="j", at=FAR)
    await wait_until(lambda: rows(log, p) == 2, what=lambda: f"{task.broken}")
    assert routed == [], "a row went through the type's sink"
