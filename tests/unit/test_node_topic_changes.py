"""Topics changed under running nodes (on the in-memory log): partitions added to a
context's topics. The range assignor then gives p of each topic to whichever member its
own count puts it on, so a node could be given a type's commands without its log (it
passed them over, committed, never decided: no result), or a partition past the count its
tables are kept with. The node stops loudly instead, and takes nothing of it.

And a timer changelog made again under a node's clean copy of it: restored from what is
left, the table lost its timers for good while the node said it was ready. It stops
loudly, unless the log is read again from its start (a rebuild's replay); so it does when
its copy is not clean, or when the changelog is made again while it runs."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from fakes import RunningNode, wait_until
from test_node_memory import PARTITIONS, SERVICE, TOPICS, results, schedule, timer_rows

from app.errors import KafkaUnavailable, NodeFailed
from app.kafka.memory import MemoryLog
from app.node import partition_tasks
from app.timers.sender import ResultsReader
from tables.partitioner import partition_of


def owner_in(p: int, nth: int = 0) -> str:
    """The `nth` owner id "x<i>" in partition p."""
    i, found = 0, -1
    while True:
        if partition_of(f"x{i}", PARTITIONS) == p:
            found += 1
            if found == nth:
                return f"x{i}"
        i += 1


async def failure_of(node: RunningNode) -> str:
    """What the node stopped on (its run ends raising `NodeFailed`)."""
    await wait_until(lambda: node.task is not None and node.task.done(), within=10)
    assert node.task is not None
    exc = node.task.exception()
    node.task = None  # its end read: `stop` stops the node alone
    assert isinstance(exc, NodeFailed), exc
    return str(exc)


@pytest.fixture(autouse=True)
def short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(partition_tasks, "SPLIT_GRACE_S", 0.3)


async def test_a_partition_split_between_members_stops_them_and_decides_nothing(
    tmp_path: Path,
) -> None:
    log = MemoryLog()
    a = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    b = await RunningNode(log, tmp_path, "b", SERVICE, PARTITIONS).start()
    try:
        await wait_until(lambda: a.runs(1) and b.runs(1), within=10)
        # The events topic alone grows: a keeps events[0, 1], b gets events[2, 3] with
        # commands[1] and timer-ops[1], whose log stays a's.
        await log.add_partitions([TOPICS.events], 2)
        why = await failure_of(b)
        assert "split co-partitioned topics" in why and f"{TOPICS.type_name}[1]" in why
        assert "split co-partitioned topics" in await failure_of(a)
        cmd = await schedule(log, owner_in(1), int(time.time() * 1000) + 3_600_000)
        await asyncio.sleep(0.2)  # what a node that took the partition would have done
        assert log.committed("g", TOPICS.commands, 1) in (None, 0)
        assert cmd.request_id not in results(log)
    finally:
        await b.stop()
        await a.stop()


async def test_partitions_added_to_every_topic_stop_the_node_at_once(tmp_path: Path) -> None:
    log = MemoryLog()
    a = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(a.runs, within=10)
        await log.add_partitions([TOPICS.events, TOPICS.commands, TOPICS.timer_ops], 1)
        why = await failure_of(a)
        assert f"partition(s) [{PARTITIONS}]" in why and "TICKWHEEL_PARTITIONS" in why
        assert a.node.health()["failed"] == why and not a.node.health()["ready"]
    finally:
        await a.stop()


async def test_commands_given_without_their_log_are_never_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Should such an assignment be run all the same, the task given p's commands without
    its log fails its cycles rather than commit past commands nobody decided."""
    monkeypatch.setattr(partition_tasks, "_unrunnable", lambda *args: None)
    log = MemoryLog()
    a = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    b = await RunningNode(log, tmp_path, "b", SERVICE, PARTITIONS).start()
    try:
        await wait_until(lambda: a.runs(1) and b.runs(1), within=10)
        await log.add_partitions([TOPICS.events], 2)
        await schedule(log, owner_in(1), int(time.time() * 1000) + 3_600_000)
        await wait_until(lambda: "1" in b.node.health().get("failing", {}), within=10)
        assert log.committed("g", TOPICS.commands, 1) in (None, 0)
    finally:
        await b.stop()
        await a.stop()


async def stopped_with_a_timer(log: MemoryLog, tmp_path: Path) -> None:
    """Node "a" sets a timer an hour ahead on p0, has its log's offset committed past the
    event that set it, and stops clean."""
    a = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(a.runs, within=10)
        await schedule(log, owner_in(0), int(time.time() * 1000) + 3_600_000)
        await wait_until(lambda: len(timer_rows(log)) == 1, within=10)
        await wait_until(lambda: (log.committed("g", TOPICS.events, 0) or 0) >= 1, within=10)
    finally:
        await a.stop()


async def test_a_recreated_changelog_stops_the_node_instead_of_losing_its_timers(
    tmp_path: Path,
) -> None:
    log = MemoryLog()
    await stopped_with_a_timer(log, tmp_path)
    log.recreate(TOPICS.timers_changelog)  # deleted and made again (or by `ensure_topics`)
    # Started again and again (as a supervisor does), it never runs without the timer.
    for _ in range(2):
        a = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
        try:
            why = await failure_of(a)
            assert f"{TOPICS.timers_changelog}[0]" in why and "tickwheel rebuild" in why
            assert not a.node.health()["ready"]
        finally:
            await a.stop()
    # Once the log is read from its start again (what a rebuild does), it runs, the timer
    # made again by the replay.
    log.commit_group_offsets("g", {(TOPICS.events, 0): 0})
    a = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(a.runs, within=10)
        await wait_until(lambda: len(timer_rows(log)) == 1, within=10)
    finally:
        await a.stop()


async def test_a_changelog_recreated_under_a_copy_not_clean_stops_the_node_too(
    tmp_path: Path,
) -> None:
    """The copy is not clean when the node stopped on its partition failing (its commits
    failed while the topic was gone, then made again empty by the next start's
    `ensure_topics`), or was killed: the offset it applied through still tells the loss."""
    log = MemoryLog()
    await stopped_with_a_timer(log, tmp_path)
    for mark in (tmp_path / "a").rglob("clean-p*"):
        mark.unlink()
    log.recreate(TOPICS.timers_changelog)
    a = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        why = await failure_of(a)
        assert f"{TOPICS.timers_changelog}[0]" in why and "tickwheel rebuild" in why
    finally:
        await a.stop()


async def test_a_changelog_recreated_under_a_running_node_stops_it_at_its_next_write(
    tmp_path: Path,
) -> None:
    """Made again while the node runs, the changelog takes its next rows at offsets it had
    passed: the rows written before are in the node's copy alone, and a restore anywhere
    (another node, a retake) would lose those timers quietly, the node ready meanwhile."""
    log = MemoryLog()
    a = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(a.runs, within=10)
        await schedule(log, owner_in(0), int(time.time() * 1000) + 3_600_000)
        await wait_until(lambda: len(timer_rows(log)) == 1, within=10)
        log.recreate(TOPICS.timers_changelog)
        await schedule(log, owner_in(0, 1), int(time.time() * 1000) + 3_600_000)
        why = await failure_of(a)
        assert f"{TOPICS.timers_changelog}[0]" in why and "tickwheel rebuild" in why
        assert not a.node.health()["ready"]
    finally:
        await a.stop()
    # Started again, it still refuses: the loss is noted beside its copy.
    a = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        assert "tickwheel rebuild" in await failure_of(a)
    finally:
        await a.stop()


@pytest.mark.parametrize("emptied", ["deleted", "recreated"])
async def test_a_changelog_emptied_for_a_replay_of_the_log_is_restored_from_it(
    tmp_path: Path, emptied: str
) -> None:
    """As a rebuild does (its records deleted), or an operator by hand (the topic made
    again): the changelog emptied and the log's offsets set back to its start, whose replay
    makes the timer again."""
    log = MemoryLog()
    await stopped_with_a_timer(log, tmp_path)
    _, end = log.offsets(TOPICS.timers_changelog, 0)
    if emptied == "deleted":
        log.delete_records(TOPICS.timers_changelog, 0, end)
    else:
        log.recreate(TOPICS.timers_changelog)
        end = 0
    log.commit_group_offsets("g", {(TOPICS.events, 0): 0})
    a = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(a.runs, within=10)
        await wait_until(lambda: log.offsets(TOPICS.timers_changelog, 0)[1] > end, within=10)
        assert [t.status for t in timer_rows(log)] == ["PENDING"]
    finally:
        await a.stop()


async def test_a_split_the_next_assignment_mends_does_not_stop_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A topic missing from the group leader's metadata for a moment (just made) splits one
    assignment: the node takes nothing of it, and runs once the next one is whole."""
    log = MemoryLog()
    a = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(a.runs, within=10)
        unrunnable = partition_tasks._unrunnable
        monkeypatch.setattr(partition_tasks, "_unrunnable", lambda *args: "split for a moment")
        await log.groups["g"].rebalance()
        assert not a.node.health()["ready"]
        monkeypatch.setattr(partition_tasks, "_unrunnable", unrunnable)
        await log.groups["g"].rebalance()
        await wait_until(a.runs, within=10)
        await asyncio.sleep(2 * partition_tasks.SPLIT_GRACE_S)
        assert a.runs() and a.task is not None and not a.task.done()
    finally:
        await a.stop()


async def test_a_loss_noted_goes_once_the_changelog_was_written_since(tmp_path: Path) -> None:
    """Another node ran the partition meanwhile (and wrote its changelog): the note of this
    node knows no more than that node did, and stops it no more."""
    log = MemoryLog()
    await stopped_with_a_timer(log, tmp_path)
    log.recreate(TOPICS.timers_changelog)
    a = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        assert "tickwheel rebuild" in await failure_of(a)
    finally:
        await a.stop()
    # A transaction aborted there (a fenced writer's) leaves a marker, no record: the
    # note stays.
    writer = log.transactional_writer("another")
    await writer.start()
    await writer.send([(TOPICS.timers_changelog, 0, b"aborted row", None)])
    await writer.abort()
    await writer.stop()
    a = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        assert "tickwheel rebuild" in await failure_of(a)
    finally:
        await a.stop()
    await log.publisher().send(TOPICS.timers_changelog, b"another node's row", None, 0)
    a = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(a.runs, within=10)
    finally:
        await a.stop()


async def test_a_split_assignment_lets_go_the_tasks_left_from_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A revoke after a lost membership may name none of the partitions: a split
    assignment that comes next lets every task go, none runs on, paused."""
    log = MemoryLog()
    a = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(a.runs, within=10)
        monkeypatch.setattr(partition_tasks, "_unrunnable", lambda *args: "split")
        assert a.node._consumer is not None
        a.node.tasks.assign(a.node._consumer.assignment())  # no revoke before it
        await wait_until(lambda: not a.node.tasks.owned, within=10)
        assert not a.node.tasks.tasks
    finally:
        await a.stop()


async def test_a_loss_found_by_a_take_cut_short_is_not_forgotten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The take that found the loss fails after its restore dropped the copy (the broker
    away for a moment): the next attempt must still refuse, the copy's clean mark gone."""
    log = MemoryLog()
    await stopped_with_a_timer(log, tmp_path)
    log.recreate(TOPICS.timers_changelog)
    add_partition = ResultsReader.add_partition
    failed: list[int] = []

    async def once_away(self: ResultsReader, partition: int) -> None:
        if partition == 0 and not failed:
            failed.append(partition)
            raise KafkaUnavailable("the broker is away for a moment")
        await add_partition(self, partition)

    monkeypatch.setattr(ResultsReader, "add_partition", once_away)
    a = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        assert "tickwheel rebuild" in await failure_of(a)
        assert failed
    finally:
        await a.stop()
