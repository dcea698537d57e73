"""A revoked task's close on the in-memory log (#19's review): bounded whole by one deadline
below the group's rebalance timeout, seen in /healthz while it lasts, never cut in half by
a revoke, and never overtaken by a new task of its partition when it crashed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fakes import RunningNode, wait_until
from test_node_memory import PARTITIONS, SERVICE, TOPICS, task_of

from app.errors import NodeFailed
from app.kafka.group_consumer import rebalance_timeout_ms
from app.kafka.memory import MemoryLog, MemoryWriter
from app.node.partition_task import PartitionTask
from app.node.partition_transaction import PartitionTransaction
from app.node.settings import Settings
from app.node.task_state import TaskState
from app.timers.runner import RoundStats
from tables import StoreError

ID0 = f"g.{TOPICS.timers_changelog}.0"


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[RunningNode]:
    n = await RunningNode(MemoryLog(), tmp_path, "a", SERVICE, PARTITIONS).start()
    yield n
    await n.stop()


def state_of(task: PartitionTask) -> TaskState:
    return task.state  # read afresh (not narrowed by an earlier assert)


@pytest.mark.parametrize("session_timeout_ms", [1_000, 10_000, 45_000, 300_000])
def test_the_close_deadline_is_well_below_the_rebalance_timeout(session_timeout_ms: int) -> None:
    settings = Settings(session_timeout_ms=session_timeout_ms)
    rebalance_s = rebalance_timeout_ms(session_timeout_ms) / 1000
    assert 0 < settings.close_deadline_s <= rebalance_s / 2


async def test_a_close_whose_commit_and_producer_stop_hang_ends_at_its_one_deadline(
    node: RunningNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A revoked task's commit in flight never answers (its own deadline is 30 s), and
    neither does its producer's stop. The close ends at the task's one close deadline (well
    below the group's rebalance timeout), whatever each part's own deadline: what is left
    is abandoned (the copy rolled back to its landed commits, and so marked clean), and the
    partition is taken again."""
    log = node.node.clients
    assert isinstance(log, MemoryLog)
    await wait_until(node.runs)
    kept = node.node.types[TOPICS.type_name]
    assert node.node.commits.deadline_s >= 30
    shared = node.node.tasks.shared
    assert shared is not None
    shared.close_deadline_s = 0.5
    hung, release = asyncio.Event(), asyncio.Event()

    async def never(transactional_id: str) -> None:
        if transactional_id == ID0:
            hung.set()
            await release.wait()

    stop = MemoryWriter.stop

    async def stop_hanging(writer: MemoryWriter) -> None:
        if writer.transactional_id == ID0:
            await release.wait()
        await stop(writer)

    log.before_commit = never
    monkeypatch.setattr(MemoryWriter, "stop", stop_hanging)
    task = node.node._tasks[task_of(0)]
    try:
        kept.transactions.of(0).stage([(TOPICS.events, 0, b"hung", b"never committed")], {})
        await wait_until(hung.is_set)
        assert node.node.commits.in_flight(kept, 0)
        began = time.monotonic()
        await asyncio.wait_for(node.node._revoked({(TOPICS.events, 0)}), 5)
        assert time.monotonic() - began < 2
        assert state_of(task) is TaskState.CLOSED and not kept.transactions.owns(0)
        assert kept.marks._path(0).exists(), "rolled back to its landed commits: clean"
        log.before_commit = None
        assert node.node._consumer is not None
        await node.node._assigned(node.node._consumer.assignment())
        await wait_until(node.runs)
    finally:
        release.set()
    assert [r for r in log.records(TOPICS.events, 0) if r.key == b"hung"] == []


@pytest.mark.parametrize("how", ["revoked", "not assigned"])
async def test_a_closing_partition_is_in_healthz_with_its_commit_age(
    node: RunningNode, how: str
) -> None:
    """While a revoked task's close waits for its commit, /healthz says the partition is
    closing (and since when), not that nobody took it, and counts that commit's age in
    the commit lag; so too for a close the group's assignment started (it no longer gives
    the partition here), which nothing waits for."""
    log = node.node.clients
    assert isinstance(log, MemoryLog)
    await wait_until(node.runs)
    kept = node.node.types[TOPICS.type_name]
    hung, release = asyncio.Event(), asyncio.Event()

    async def held(transactional_id: str) -> None:
        if transactional_id == ID0:
            hung.set()
            await release.wait()

    log.before_commit = held
    kept.transactions.of(0).stage([(TOPICS.events, 0, b"last", b"committed by the close")], {})
    consumer = node.node._consumer
    assert consumer is not None
    revoking: asyncio.Task[Any]
    if how == "revoked":
        revoking = asyncio.create_task(node.node._revoked({(TOPICS.events, 0)}))
    else:
        await node.node._assigned({(t, p) for t, p in consumer.assignment() if p != 0})
        (revoking,) = node.node.tasks.closing.values()
    try:
        await wait_until(hung.is_set)
        await wait_until(lambda: node.node.health()["commit_lag_s"] >= 0.2)
        body = node.node.health()
        assert body["closing"]["0"] >= 0.2 and body["owned"] == [1]
        if how == "revoked":  # still given by the group (as in a revoke's callback)
            assert body["stalled"]["0"].startswith("closing"), body
            assert not body["ready"]
    finally:
        release.set()
    await revoking
    body = node.node.health()
    assert "closing" not in body and body["commit_lag_s"] == 0
    assert [r.value for r in log.records(TOPICS.events, 0) if r.key == b"last"] == [
        b"committed by the close"
    ]


async def test_a_revoke_during_a_retakes_dirty_close_leaves_no_producer_half_stopped(
    node: RunningNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task fails; its retake closes it dirty and is stopping its producer when the group
    revokes the partition, which cancels the retake there. The producer's stop is not cut
    in half: it ends, and the revoke's close waits for it."""
    await wait_until(node.runs)
    kept = node.node.types[TOPICS.type_name]
    txn = kept.transactions.of(1)
    writer = txn.producer
    assert isinstance(writer, MemoryWriter)
    stopping, release = asyncio.Event(), asyncio.Event()
    stopped: list[MemoryWriter] = []
    stop = MemoryWriter.stop

    async def slow_stop(w: MemoryWriter) -> None:
        if w is writer:
            stopping.set()
            await release.wait()
        await stop(w)
        stopped.append(w)

    monkeypatch.setattr(MemoryWriter, "stop", slow_stop)
    task = node.node._tasks[task_of(1)]
    node.node.tasks.running[task_of(1)].failed("a cycle", StoreError("the disk is gone"))
    await wait_until(stopping.is_set)  # the retake's dirty close, stopping the producer
    assert task.taking
    revoking = asyncio.create_task(node.node._revoked({(TOPICS.events, 1)}))
    await wait_until(lambda: not task.taking)  # the retake was cancelled
    assert not revoking.done()
    release.set()
    await revoking
    assert writer in stopped, "a producer left half stopped"
    assert state_of(task) is TaskState.CLOSED and not kept.transactions.owns(1)


async def test_a_new_task_behind_a_close_that_crashed_never_takes_the_partition(
    node: RunningNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new task of p waits for the close of p's revoked task, which crashes (a bug: p may
    be half open, the node fails). The new task never opens p's transactional id."""
    await wait_until(node.runs)
    kept = node.node.types[TOPICS.type_name]
    first = node.node._tasks[task_of(0)]
    releasing, crash = asyncio.Event(), asyncio.Event()

    async def crashing(*, clean: bool, store: object = None) -> None:
        releasing.set()
        await crash.wait()
        raise RuntimeError("a bug in the close")

    monkeypatch.setattr(first, "_release", crashing)
    opened: list[int] = []
    open_ = kept.transactions.open

    async def opening(p: int) -> PartitionTransaction:
        opened.append(p)
        return await open_(p)

    monkeypatch.setattr(kept.transactions, "open", opening)
    revoking = asyncio.create_task(node.node._revoked({(TOPICS.events, 0)}))
    await wait_until(releasing.is_set)
    assert node.node._consumer is not None
    await node.node._assigned(node.node._consumer.assignment())
    second = node.node._tasks[task_of(0)]
    assert second is not first and second.taking
    crash.set()
    await revoking
    await wait_until(lambda: not second.taking)
    assert node.node._failure is not None and "closing partition 0" in str(node.node._failure)
    assert opened == [] and state_of(second) is not TaskState.RUNNING
    assert node.task is not None
    with pytest.raises(NodeFailed):
        await node.task
    node.task = None


@pytest.mark.parametrize("where", ["settle", "stop_partition"])
async def test_a_close_that_fails_partway_lets_everything_go_and_is_not_clean(
    node: RunningNode, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A revoked task's close fails partway (its commit's settling, or the runner's last
    write to a store whose disk is gone). The rest of p is let go all the same (its
    producer stopped, its store partition and processor released), its copy is never
    marked clean, and the close says it failed: the node stops loudly, and a new task of
    p never opens p's transactional id over the old producer."""
    await wait_until(node.runs)
    kept = node.node.types[TOPICS.type_name]
    txn = kept.transactions.of(0)
    writer = txn.producer
    assert isinstance(writer, MemoryWriter)
    stopped: list[MemoryWriter] = []
    stop = MemoryWriter.stop

    async def stop_noted(w: MemoryWriter) -> None:
        await stop(w)
        stopped.append(w)

    async def failing(*args: Any, **kwargs: Any) -> bool:
        raise StoreError("the disk is gone")

    monkeypatch.setattr(MemoryWriter, "stop", stop_noted)
    if where == "settle":
        monkeypatch.setattr(node.node._tasks[task_of(0)].commits, "settle", failing)
    else:
        monkeypatch.setattr(kept.runner, "stop_partition", failing)
    first = node.node._tasks[task_of(0)]
    assert kept.states is not None and first.processor is not None
    await asyncio.wait_for(node.node._revoked({(TOPICS.events, 0)}), 5)
    assert writer in stopped, "the producer of a close that failed never stopped"
    assert not kept.transactions.owns(0) and 0 not in kept.store.assigned
    assert first.processor is None
    assert not kept.marks._path(0).exists(), "a close that failed marked the copy clean"
    assert node.node._failure is not None and "closing partition 0" in str(node.node._failure)
    assert node.task is not None
    with pytest.raises(NodeFailed):
        await node.task
    node.task = None


async def test_a_producer_stop_left_by_a_close_is_awaited_when_the_node_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A close's deadline passes while p's producer is stopping: the stop is left to end on
    its own. The node's stop waits for it (not cancelled half way by the loop's end)."""
    n = await RunningNode(MemoryLog(), tmp_path, "a", SERVICE, PARTITIONS).start()
    await wait_until(n.runs)
    kept = n.node.types[TOPICS.type_name]
    shared = n.node.tasks.shared
    assert shared is not None
    shared.close_deadline_s = 0.1
    stopped: list[str] = []
    stop = MemoryWriter.stop

    async def slow_stop(writer: MemoryWriter) -> None:
        if writer.transactional_id == ID0:
            await asyncio.sleep(0.5)  # the broker slow to answer, past the close deadline
        await stop(writer)
        stopped.append(writer.transactional_id)

    monkeypatch.setattr(MemoryWriter, "stop", slow_stop)
    await asyncio.wait_for(n.node._revoked({(TOPICS.events, 0)}), 5)
    assert 0 in kept.transactions._stopping and ID0 not in stopped
    await n.stop()
    assert ID0 in stopped, "the node stopped before the producer's stop ended"
    assert not kept.transactions._stopping


async def test_a_producer_stop_that_never_ends_holds_the_node_stop_only_so_long(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A producer's stop left by a close never ends: the node's stop waits for it only up to
    its deadline, and says which producer it left."""
    n = await RunningNode(MemoryLog(), tmp_path, "a", SERVICE, PARTITIONS).start()
    await wait_until(n.runs)
    kept = n.node.types[TOPICS.type_name]
    shared = n.node.tasks.shared
    assert shared is not None
    shared.close_deadline_s = 0.1
    kept.transactions.stop_deadline_s = 0.3
    release = asyncio.Event()
    stop = MemoryWriter.stop

    async def hung_stop(writer: MemoryWriter) -> None:
        if writer.transactional_id == ID0:
            await release.wait()
        await stop(writer)

    monkeypatch.setattr(MemoryWriter, "stop", hung_stop)
    try:
        await asyncio.wait_for(n.node._revoked({(TOPICS.events, 0)}), 5)
        assert 0 in kept.transactions._stopping
        began = time.monotonic()
        await asyncio.wait_for(n.stop(), 5)
        assert time.monotonic() - began < 2
        left = [r.getMessage() for r in caplog.records if "when the node stops" in r.getMessage()]
        assert len(left) == 1 and "[0]" in left[0], left
    finally:
        release.set()
    await asyncio.wait_for(asyncio.gather(*kept.transactions._stopping.values()), 5)


async def test_a_retakes_close_that_fails_stops_the_producer_and_never_reopens_it(
    node: RunningNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task fails, and its retake's dirty close fails partway (the runner's last write to
    a store whose disk is gone): p's producer is stopped all the same, and the retake never
    opens p's transactional id over it; the node stops loudly."""
    await wait_until(node.runs)
    kept = node.node.types[TOPICS.type_name]
    txn = kept.transactions.of(1)
    writer = txn.producer
    assert isinstance(writer, MemoryWriter)
    stopped: list[MemoryWriter] = []
    stop = MemoryWriter.stop

    async def stop_noted(w: MemoryWriter) -> None:
        await stop(w)
        stopped.append(w)

    stop_partition = kept.runner.stop_partition

    async def failing(p: int) -> RoundStats:
        if p == 1:
            raise StoreError("the disk is gone")
        return await stop_partition(p)

    opened: list[int] = []
    open_ = kept.transactions.open

    async def opening(p: int) -> PartitionTransaction:
        opened.append(p)
        return await open_(p)

    monkeypatch.setattr(MemoryWriter, "stop", stop_noted)
    monkeypatch.setattr(kept.runner, "stop_partition", failing)
    monkeypatch.setattr(kept.transactions, "open", opening)
    task = node.node._tasks[task_of(1)]
    node.node.tasks.running[task_of(1)].failed("a cycle", StoreError("the disk is gone"))
    await wait_until(lambda: not task.taking)
    assert writer in stopped and not kept.transactions.owns(1)
    assert opened == [], "p's transactional id opened again behind a close that failed"
    assert node.node._failure is not None and "taking partition 1" in str(node.node._failure)
    assert node.task is not None
    with pytest.raises(NodeFailed):
        await node.task
    node.task = None
