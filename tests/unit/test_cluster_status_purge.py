"""The `<context>.nodes` topic follows the live nodes (`ClusterStatus.purge`): a node that
died without its tombstone (killed; every pod a new node id) is tombstoned by the live nodes
once its last report is older than `PURGE_MS`, whatever its group, so the compacted topic
and every reader's view do not keep every node id that ever ran. A node forgotten by the
pages but silent for less is left, a record that is no report is left, a node that writes
again is back, and a topic of many dead ids is tombstoned a batch per publish."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from fakes import PAGE_PARTITIONS, T0, TYPE, FakeNode

from app.kafka.memory import MemoryLog
from app.node.kept import node_topics
from app.ops.cluster_status import FORGET_MS, PURGE_BATCH, PURGE_MS, ClusterStatus
from app.ops.node_report import NodeReport, encode_report
from app.ops.status_view import StatusView
from app.protocol.topics import ContextTopics, parse_aggregate_type

TOPIC = ContextTopics("shop").nodes
INTERVAL = 1_000


@pytest.fixture
def log() -> MemoryLog:
    return MemoryLog(node_topics([parse_aggregate_type(TYPE)], PAGE_PARTITIONS))


@pytest.fixture
async def running() -> AsyncIterator[list[ClusterStatus]]:
    started: list[ClusterStatus] = []
    yield started
    for status in started:
        await status.stop()


async def join(
    log: MemoryLog, name: str, at: int, running: list[ClusterStatus] | None, group: str = "g1"
) -> tuple[FakeNode, ClusterStatus]:
    """A node started at `at` (it publishes its first report); `running` None: one that
    dies without its tombstone (never stopped)."""
    node = FakeNode(owned=[0])
    node.clock.t = at
    node.settings = node.settings.model_copy(update={"group_id": group})
    status = ClusterStatus(log, log.publisher(), node, name, interval_ms=INTERVAL)
    await status.start()
    if running is not None:
        running.append(status)
    return node, status


def last_records(log: MemoryLog) -> dict[bytes, bytes | None]:
    """Each key's newest record on the topic: what compaction leaves."""
    newest: dict[bytes, bytes | None] = {}
    for r in log.records(TOPIC, 0):
        assert r.key is not None
        newest[r.key] = r.value
    return newest


async def test_nodes_silent_past_the_window_are_tombstoned_whatever_their_group(
    log: MemoryLog, running: list[ClusterStatus]
) -> None:
    await join(log, "dead-1", T0, None)
    await join(log, "dead-other-group", T0, None, group="g2")
    await join(log, "forgotten", T0 + PURGE_MS - FORGET_MS, None)
    later = T0 + PURGE_MS + 1
    a_node, a = await join(log, "node-a", later, running)  # its start publishes
    # Nothing purged in its first hour: a report it read is a day old by its clock alone.
    assert last_records(log)[b"dead-1"] is not None
    later += FORGET_MS + 1
    a_node.clock.t = later
    assert await a.publish()  # and purges

    newest = last_records(log)
    assert newest[b"dead-1"] is None and newest[b"dead-other-group"] is None
    assert newest[b"forgotten"] is not None  # no page shows it, but only an hour ago
    assert newest[b"node-a"] is not None
    assert [r.node for r in a.reports()] == ["node-a"]
    assert a.view.silent(later) == []
    # A node started now reads the topic whole: the dead ids are gone from its view too.
    b_node, b = await join(log, "node-b", later, running)
    assert {r.node for r in b.reports()} == {"node-a", "node-b"}
    assert b.view.silent(later) == []
    assert await a.purge() == 0  # nothing left to tombstone: nothing written again
    assert await b.purge() == 0

    # A day later "forgotten" goes too, and the live nodes stay.
    a_node.clock.t = b_node.clock.t = T0 + 2 * PURGE_MS
    assert await b.publish()
    for r in await a._contexts["shop"].follower.poll(timeout_ms=10):
        a.view.apply(r.topic, r.key, r.offset, r.value)  # b heard a minute ago
    assert await a.publish()
    newest = last_records(log)
    assert newest[b"forgotten"] is None
    assert newest[b"node-a"] is not None and newest[b"node-b"] is not None


async def test_a_node_that_writes_again_is_back_and_records_that_are_no_report_stay(
    log: MemoryLog, running: list[ClusterStatus]
) -> None:
    dead_node, dead = await join(log, "node-d", T0, None)
    await join(log, "node-e", T0, None)
    await log.publisher().send(TOPIC, b"someone-else", b"not a report", 0)
    await log.publisher().send(TOPIC, b"node-e", b"another producer's, under its key", 0)
    later = T0 + PURGE_MS + 1
    a_node, a = await join(log, "node-a", later, running)
    later += FORGET_MS + 1
    a_node.clock.t = later
    assert await a.publish()
    assert last_records(log)[b"node-d"] is None
    assert last_records(log)[b"someone-else"] == b"not a report"  # not ours to delete
    assert last_records(log)[b"node-e"] == b"another producer's, under its key"

    dead_node.clock.t = later  # back (its process never stopped: a long pause)
    assert await dead.publish()
    for r in await a._contexts["shop"].follower.poll(timeout_ms=10):
        a.view.apply(r.topic, r.key, r.offset, r.value)
    assert {r.node for r in a.reports()} == {"node-a", "node-d"}
    assert await a.purge() == 0
    assert last_records(log)[b"node-d"] is not None


async def test_many_dead_ids_are_tombstoned_a_batch_per_publish(
    log: MemoryLog, running: list[ClusterStatus]
) -> None:
    dead = PURGE_BATCH * 2 + 5
    for n in range(dead):
        await join(log, f"pod-{n:03}", T0, None)
    later = T0 + PURGE_MS + 1
    a_node, a = await join(log, "node-a", later, running)
    assert a.view.silent(later) == []  # its first hour
    later += FORGET_MS + 1
    a_node.clock.t = later
    assert await a.publish()
    assert len(a.view.silent(later)) == dead - PURGE_BATCH
    assert await a.publish() and await a.publish()
    assert a.view.silent(later) == []
    newest = last_records(log)
    assert [k for k, v in newest.items() if v is not None] == [b"node-a"]
    tombstones = [r for r in log.records(TOPIC, 0) if r.value is None]
    assert len(tombstones) == dead  # each once


def test_the_view_picks_the_keys_silent_past_the_window_in_the_order_written() -> None:
    view = StatusView("g1", PAGE_PARTITIONS)

    def report(name: str, at: int, group: str = "g1") -> bytes:
        return encode_report(NodeReport(node=name, group=group, at=at, interval_ms=INTERVAL))

    view.apply(TOPIC, b"b", 0, report("b", T0))
    view.apply(TOPIC, b"a", 1, report("a", T0, group="other"))
    view.apply(TOPIC, b"c", 2, report("c", T0 + 10))
    assert view.silent(T0 + PURGE_MS) == []
    assert view.silent(T0 + PURGE_MS + 1) == [(TOPIC, b"b"), (TOPIC, b"a")]
    view.apply(TOPIC, b"b", 0, report("b", T0))  # read again: changes nothing
    view.apply(TOPIC, b"a", 3, None)  # its tombstone
    view.apply(TOPIC, b"b", 4, report("b", T0 + PURGE_MS))  # it wrote again
    assert view.silent(T0 + PURGE_MS + 11) == [(TOPIC, b"c")]
    view.max_keys = 1
    view.apply(TOPIC, b"d", 5, report("d", T0))
    assert view.silent(T0 + 2 * PURGE_MS) == [(TOPIC, b"d")]  # held at most max_keys


async def test_a_reader_whose_clock_runs_a_day_ahead_purges_no_live_node(
    log: MemoryLog, running: list[ClusterStatus]
) -> None:
    """A live node's report is a day old by a reader whose clock runs a day ahead; but it
    was read a moment ago, by that reader's own clock: never tombstoned (a review found
    every live node tombstoned at each of such a reader's publishes)."""
    live_node, live = await join(log, "live", T0, running)
    ahead_node, ahead = await join(log, "ahead", T0 + PURGE_MS + 1, running)
    for step in range(1, 4):
        live_node.clock.t = T0 + step * FORGET_MS
        ahead_node.clock.t = T0 + PURGE_MS + 1 + step * FORGET_MS
        assert await live.publish()
        for r in await ahead._contexts["shop"].follower.poll(timeout_ms=10):
            ahead.view.apply(r.topic, r.key, r.offset, r.value)
        assert await ahead.publish()
        assert last_records(log)[b"live"] is not None
