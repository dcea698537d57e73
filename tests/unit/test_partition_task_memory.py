"""Partition tasks on the in-memory log: a fault in one partition's task closes it dirty
and revives it, never touching another task, whose partition keeps firing meanwhile; a
take cut short (a revoke, a stop) closes dirty, never marking an unrestored copy clean."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from fakes import T0, FakeClock, RunningNode, running, wait_until
from test_node_memory import PARTITIONS, SERVICE, TOPICS, events, schedule, task_of, timer_rows

from app.commands.processor import CommandProcessor
from app.errors import KafkaUnavailable
from app.kafka import LogReader
from app.kafka.memory import MemoryLog
from app.kafka.records import RestoreProgress
from app.node.partition_task import PartitionTask
from app.node.partition_transaction import PartitionTransaction
from app.node.task_state import TaskState
from tables import AggregateRef, CommandSpec, OnceRule, StoreError, Timer, TimerStatus
from tables.partitioner import partition_of


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[RunningNode]:
    n = await RunningNode(MemoryLog(), tmp_path, "a", SERVICE, PARTITIONS).start()
    yield n
    await n.stop()


def state_of(task: PartitionTask) -> TaskState:
    return task.state  # read afresh (not narrowed by an earlier assert)


def owner_in(p: int) -> str:
    return next(f"o{i}" for i in range(1, 99) if partition_of(f"o{i}", PARTITIONS) == p)


async def test_a_fault_in_one_task_closes_and_revives_it_alone_while_another_fires(
    node: RunningNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = node.node.clients
    assert isinstance(log, MemoryLog)
    await wait_until(node.runs)
    tasks = {key.p: task for key, task in node.node._tasks.items()}  # one type: by p
    assert sorted(tasks) == list(range(PARTITIONS))
    assert all(t.state is TaskState.RUNNING and t.takes == 1 for t in tasks.values())
    bad, good = 0, 1
    moves: list[tuple[int, TaskState]] = []
    to = PartitionTask._to

    def recording(task: PartitionTask, target: TaskState) -> None:
        to(task, target)
        moves.append((task.p, target))

    monkeypatch.setattr(PartitionTask, "_to", recording)
    kept = node.node.types[TOPICS.type_name]
    # Under `put_many`, which the store's and its partition handles' (the cycles') share.
    put_many, open_ = kept.store._put_many, kept.transactions.open  # type: ignore[attr-defined]
    faulty = True

    async def put_failing(timers: list[Timer], serving: int | None) -> list[Timer]:
        if faulty and any(t.partition == bad for t in timers):
            raise StoreError("the disk under partition 0 is gone")
        return await put_many(timers, serving)  # type: ignore[no-any-return]

    async def open_failing(partition: int) -> PartitionTransaction:
        if faulty and partition == bad:
            raise KafkaUnavailable("partition 0's coordinator is away")
        return await open_(partition)

    monkeypatch.setattr(kept.store, "_put_many", put_failing)
    monkeypatch.setattr(kept.transactions, "open", open_failing)
    # The bad partition's cycle meets the fault; its retakes fail while `faulty` holds.
    await schedule(log, owner_in(bad), int(time.time() * 1000) + 200)
    await wait_until(lambda: moves.count((bad, TaskState.CREATED)) >= 2)
    assert tasks[bad].state is not TaskState.RUNNING
    assert str(bad) in node.node.health()["stalled"]
    # Meanwhile the other partition's task decides and fires, untouched.
    await schedule(log, owner_in(good), int(time.time() * 1000) + 200)
    await wait_until(lambda: [e.aggregate.id for e in events(log, "Fired")] == [owner_in(good)])
    assert tasks[bad].state is not TaskState.RUNNING
    assert [p for p, _ in moves if p == good] == []
    assert node.node._tasks[task_of(good)] is tasks[good]
    assert tasks[good].state is TaskState.RUNNING and tasks[good].takes == 1
    # Closed dirty, then revived: the same task, taken afresh.
    mine = [s for p, s in moves if p == bad]
    assert mine[:4] == [
        TaskState.SUSPENDED,
        TaskState.CLOSED,
        TaskState.CREATED,
        TaskState.RESTORING,
    ]
    faulty = False
    await wait_until(node.runs, within=15)
    assert node.node._tasks[task_of(bad)] is tasks[bad]
    assert tasks[bad].state is TaskState.RUNNING and tasks[bad].takes == 2
    assert [s for p, s in moves if p == bad][-1] is TaskState.RUNNING
    # Taken afresh from the committed log, its own timer fires too, once.
    await wait_until(lambda: len(events(log, "Fired")) == 2, within=15)
    assert sorted(e.aggregate.id for e in events(log, "Fired")) == sorted(
        [owner_in(bad), owner_in(good)]
    )
    assert len(timer_rows(log)) == 2
    assert [p for p, _ in moves if p == good] == []


async def test_a_revoked_task_is_closed_clean_and_forgotten(node: RunningNode) -> None:
    """A revoke closes the task (committing what its transactions hold) and the node keeps
    no task of the partition; the group giving it back creates a new task."""
    await wait_until(node.runs)
    before = node.node._tasks[task_of(1)]
    await node.node._revoked({(TOPICS.events, 1)})
    assert before.state is TaskState.CLOSED
    assert task_of(1) not in node.node._tasks and node.node.owned == {0}
    kept = node.node.types[TOPICS.type_name]
    assert not kept.transactions.owns(1) and 1 not in kept.store.assigned
    assert node.node._consumer is not None
    await node.node._assigned(node.node._consumer.assignment())
    await wait_until(lambda: node.node.owned == {0, 1})
    assert node.node._tasks[task_of(1)] is not before and node.node._tasks[task_of(1)].takes == 1


async def test_a_task_holds_its_partitions_firing_from_its_run_to_its_close(
    node: RunningNode,
) -> None:
    """A running task holds its partition's timer firing (the runner keeps a reference to
    it for its rounds); its close stops and drops it; a new task of the partition runs a
    new one."""
    await wait_until(node.runs)
    kept = node.node.types[TOPICS.type_name]
    task = node.node._tasks[task_of(1)]
    firing = task.firing
    assert firing is not None and firing.partition == 1 and firing.live
    assert kept.runner.start_partition(1) is firing, "the runner's is the task's"
    await node.node._revoked({(TOPICS.events, 1)})
    assert task.firing is None and firing.stopped and kept.runner.partitions == {0}
    assert node.node._consumer is not None
    await node.node._assigned(node.node._consumer.assignment())
    await wait_until(lambda: node.node.owned == {0, 1})
    again = node.node._tasks[task_of(1)].firing
    assert (
        again is not None
        and again is not firing
        and again.live
        and kept.runner.start_partition(1) is again
    )


async def test_a_revoke_whose_commit_hangs_holds_up_no_other_partition(node: RunningNode) -> None:
    """A revoke closes its task clean, committing what its transaction holds, and that
    commit hangs (a broker that takes it and never answers). Meanwhile another partition
    is revoked and closed, and the group giving both back creates their tasks: the node
    holds no lock across a task's close. The partition whose close hangs is taken again
    only once that close is done, and what it committed is there."""
    log = node.node.clients
    assert isinstance(log, MemoryLog)
    await wait_until(node.runs)
    kept = node.node.types[TOPICS.type_name]
    hung, release = asyncio.Event(), asyncio.Event()

    async def hanging(transactional_id: str) -> None:
        if transactional_id == f"g.{TOPICS.timers_changelog}.0":
            hung.set()
            await release.wait()

    log.before_commit = hanging
    first, second = (
        node.node._tasks[task_of(0)],
        node.node._tasks[task_of(1)],
    )
    kept.transactions.of(0).stage([(TOPICS.events, 0, b"last", b"committed by the close")], {})
    revoking = asyncio.create_task(node.node._revoked({(TOPICS.events, 0)}))
    try:
        await wait_until(hung.is_set)
        other = asyncio.create_task(node.node._revoked({(TOPICS.events, 1)}))
        await wait_until(lambda: state_of(second) is TaskState.CLOSED)
        await other
        assert node.node._consumer is not None
        await node.node._assigned(node.node._consumer.assignment())
        await wait_until(lambda: node.node.owned == {1})
        assert node.node._tasks[task_of(1)] is not second
        assert not revoking.done() and state_of(first) is not TaskState.CLOSED
        assert node.node._tasks[task_of(0)] is not first and node.node._tasks[task_of(0)].taking
    finally:
        release.set()
    await revoking
    assert state_of(first) is TaskState.CLOSED
    assert [r.value for r in log.records(TOPICS.events, 0) if r.key == b"last"] == [
        b"committed by the close"
    ]
    await wait_until(node.runs)
    assert node.node._tasks[task_of(0)].takes == 1


@pytest.mark.parametrize("hanging", ["its own", "in flight"])
async def test_a_revoke_whose_commit_never_answers_is_given_up_at_its_deadline(
    node: RunningNode, hanging: str
) -> None:
    """A revoke's close commits what its transaction holds (its own last commit, or the
    one in flight it waits for), and that commit never answers. It is given up at its
    deadline rather than hold the rebalance (and the node's stop) for ever: the task is
    closed, its local copy rolled back to what its landed commits left and marked clean
    (read on from its changelog next), nothing of the hung transaction committed; the group
    giving the partition back takes it afresh."""
    log = node.node.clients
    assert isinstance(log, MemoryLog)
    await wait_until(node.runs)
    kept = node.node.types[TOPICS.type_name]
    shared = node.node.tasks.shared
    assert shared is not None
    shared.close_deadline_s = node.node.commits.deadline_s = 0.3
    hung = asyncio.Event()

    async def never(transactional_id: str) -> None:
        if transactional_id == f"g.{TOPICS.timers_changelog}.0":
            hung.set()
            await asyncio.Event().wait()

    # A timer row committed first: the copy is read on from it (else restored whole).
    owner = next(f"o{i}" for i in range(1, 99) if partition_of(f"o{i}", PARTITIONS) == 0)
    await schedule(log, owner, int(time.time() * 1000) + 3_600_000)
    await wait_until(lambda: bool(timer_rows(log)))
    log.before_commit = never
    task = node.node._tasks[task_of(0)]
    # A timer row in the hung transaction: written to the local copy, never committed.
    ref = AggregateRef(context="mem", aggregate="counter", id=owner)
    hung_timer = Timer(
        id="hung", owner=ref, key="hung", version=1, partition=0, rule=OnceRule(at=T0),
        target=ref, command=CommandSpec(type="Fire"), slot_due_at=T0 + 3_600_000,
        due_at=T0 + 3_600_000,
    )  # fmt: skip
    # Held: the committer does not take what waits (the close's own commit hangs); or
    # let go once the committer's commit hangs in flight.
    lock = node.node.tasks.running[task_of(0)].lock
    async with lock:
        assert task.store is not None and await task.store.put(hung_timer)
        kept.transactions.of(0).stage([(TOPICS.events, 0, b"hung", b"never committed")], {})
        if hanging == "in flight":
            lock.release()
            await wait_until(hung.is_set)
            await lock.acquire()
            assert node.node.commits.in_flight(kept, 0)
        revoking = asyncio.create_task(node.node._revoked({(TOPICS.events, 0)}))
        await wait_until(hung.is_set)
        await wait_until(revoking.done)
    assert state_of(task) is TaskState.CLOSED and not kept.transactions.owns(0)
    assert kept.marks._path(0).exists(), "rolled back to its landed commits: clean"
    log.before_commit = None
    assert node.node._consumer is not None
    await node.node._assigned(node.node._consumer.assignment())
    await wait_until(node.runs)
    assert [r for r in log.records(TOPICS.events, 0) if r.key == b"hung"] == []
    # Read on from the landed commits: the row never committed is not in the copy.
    assert await kept.store.find(ref, "hung") is None


async def test_a_task_that_fails_while_it_is_revoked_is_closed_dirty_and_never_retaken(
    node: RunningNode,
) -> None:
    """A failure between the revoke's start and the task's close: what its transaction
    holds may be half a cycle, so nothing of it commits, and no retake of a partition the
    group took away starts."""
    log = node.node.clients
    assert isinstance(log, MemoryLog)
    await wait_until(node.runs)
    task = node.node._tasks[task_of(1)]
    kept = node.node.types[TOPICS.type_name]
    await task.stop_taking()  # as `_revoked` does first
    kept.transactions.of(1).stage([(TOPICS.events, 1, b"half", b"a half cycle")], {})
    node.node.tasks.running[task_of(1)].failed("a cycle", StoreError("the disk is gone"))
    assert task.state is TaskState.SUSPENDED and not task.taking
    await node.node._revoked({(TOPICS.events, 1)})
    assert state_of(task) is TaskState.CLOSED and not task.taking
    assert task_of(1) not in node.node._tasks and node.node.owned == {0}
    assert [r for r in log.records(TOPICS.events, 1) if r.key == b"half"] == []


async def test_a_take_revoked_while_restoring_leaves_no_clean_mark_on_a_dirty_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local copy left dirty (a cancel written locally whose transaction was thrown away)
    is taken again; the group revokes p while the take folds its states, before the timer
    table was restored. That close must not mark the dirty copy clean: the next take
    restores p from the changelog, where the timer is still due, and it fires."""
    log, clock = MemoryLog(), FakeClock(T0)
    async with running(RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS, clock=clock)) as n:
        node, p = n.node, 1
        owner = owner_in(p)
        kept = node.types[TOPICS.type_name]
        await schedule(log, owner, T0 + 60_000)
        await wait_until(lambda: [t.owner.id for t in timer_rows(log)] == [owner])
        # Taken afresh once, so that the local copy holds the changelog up to the timer's row
        # (a copy that holds none of it is restored from the changelog whatever its mark).
        node.tasks.running[task_of(p)].failed("a cycle", StoreError("the disk is gone"))
        await wait_until(lambda: node._tasks[task_of(p)].state is TaskState.RUNNING)
        assert node._tasks[task_of(p)].takes == 2 and kept.store.changelog_offset(p) is not None
        ref = AggregateRef(context="mem", aggregate="counter", id=owner)
        timer = await kept.store.find(ref, "k")
        assert timer is not None and timer.status is TimerStatus.PENDING
        # Every take from here folds its states until `folded` is set.
        folding, folded = asyncio.Event(), asyncio.Event()
        restore = CommandProcessor.restore

        async def held_restore(
            processor: CommandProcessor,
            reader: LogReader,
            progress: RestoreProgress | None = None,
            *,
            misplaced: Callable[[int], None] | None = None,
        ) -> int:
            if processor.partition == p:
                folding.set()
                await folded.wait()
            return await restore(processor, reader, progress, misplaced=misplaced)

        monkeypatch.setattr(CommandProcessor, "restore", held_restore)
        # Written locally, never committed: the task's failure throws the transaction away
        # (closed dirty, no clean mark), and its retake is held folding the states.
        assert await kept.store.cancel(ref, "k", timer.version)
        node.tasks.running[task_of(p)].failed("a cycle", StoreError("the disk is gone"))
        await wait_until(folding.is_set)
        task = node._tasks[task_of(p)]
        assert task.state is TaskState.RESTORING and not kept.marks._path(p).exists()
        await node._revoked({(TOPICS.events, p)})
        assert state_of(task) is TaskState.CLOSED
        assert not kept.marks._path(p).exists()
        # The group gives p back: taken afresh, from the changelog.
        folded.set()
        assert node._consumer is not None
        await node._assigned(node._consumer.assignment())
        await wait_until(
            lambda: p in node.owned and node._tasks[task_of(p)].state is TaskState.RUNNING
        )
        found = await kept.store.find(ref, "k")
        assert found is not None and found.status is TimerStatus.PENDING
        clock.set(T0 + 60_000)
        await wait_until(lambda: [e.aggregate.id for e in events(log, "Fired")] == [owner])


async def test_a_node_stopped_during_a_take_marks_only_what_ran_clean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node stopping lets its partitions go as a revoke does: the one that ran is marked
    clean, the one whose take was still folding its states is not (its copy never was
    restored)."""
    held, folding = 1, asyncio.Event()
    restore = CommandProcessor.restore

    async def held_restore(
        processor: CommandProcessor,
        reader: LogReader,
        progress: RestoreProgress | None = None,
        *,
        misplaced: Callable[[int], None] | None = None,
    ) -> int:
        if processor.partition == held:
            folding.set()
            await asyncio.Event().wait()  # till the stop cancels the take
        return await restore(processor, reader, progress, misplaced=misplaced)

    monkeypatch.setattr(CommandProcessor, "restore", held_restore)
    n = await RunningNode(MemoryLog(), tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(lambda: folding.is_set() and n.node.owned == {0})
        task = n.node._tasks[task_of(held)]
        assert task.state is TaskState.RESTORING
    finally:
        await n.stop()
    marks = n.node.types[TOPICS.type_name].marks
    assert state_of(task) is TaskState.CLOSED
    assert marks._path(0).exists() and not marks._path(held).exists()
