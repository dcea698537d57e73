"""The cluster's status on the in-memory log (#22): each node publishes its report to
`<context>.nodes`, every node reads them all; stale reports, unowned partitions, a
clean stop's tombstone and records that are no report, with a fake clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from fakes import PAGE_PARTITIONS, T0, TYPE, FakeNode, Kept, ref
from pydantic import ValidationError

from app.cli.worker import _run_node
from app.errors import KafkaUnavailable, NodeFailed
from app.kafka import TopicSpec
from app.kafka.admin import topic_configs
from app.kafka.memory import MemoryLog
from app.kafka.records import Replication
from app.node.kept import node_topics
from app.node.settings import Settings
from app.ops.cluster_page import cluster_view
from app.ops.cluster_status import FORGET_MS, ClusterStatus
from app.ops.node_report import (
    STALE_INTERVALS,
    NodeReport,
    PartitionReport,
    collect_report,
    encode_report,
)
from app.ops.status_for_node import web_address
from app.protocol.topics import ContextTopics, parse_aggregate_type
from tables import AggregateRef, CommandSpec, OnceRule, Timer, TimerChange, TimerStatus
from tables.census import TimerCensus
from tables.keys import encode_timer, row_key
from tables.memory_store import MemoryTimerStore
from tables.partitioner import partition_of

TOPIC = ContextTopics("shop").nodes
INTERVAL = 1_000


@dataclass
class Group:
    log: MemoryLog
    nodes: dict[str, tuple[FakeNode, ClusterStatus]] = field(default_factory=dict)
    bad: list[int] = field(default_factory=list)

    async def join(self, name: str, owned: list[int]) -> tuple[FakeNode, ClusterStatus]:
        node = FakeNode(owned=owned)
        status = ClusterStatus(
            self.log,
            self.log.publisher(),
            node,
            name,
            web=f"http://{name}",
            interval_ms=INTERVAL,
            on_bad=lambda: self.bad.append(1),
        )
        await status.start()
        self.nodes[name] = (node, status)
        return node, status


@pytest.fixture
async def group() -> AsyncIterator[Group]:
    log = MemoryLog(node_topics([parse_aggregate_type(TYPE)], PAGE_PARTITIONS))
    g = Group(log)
    yield g
    for _, status in g.nodes.values():
        await status.stop()


async def follow(status: ClusterStatus) -> None:
    """One round of reading the topic (what `run` does without end)."""
    for c in status._contexts.values():
        for r in await c.follower.poll(timeout_ms=10):
            status.view.apply(r.topic, r.key, r.offset, r.value)


def owner_in(p: int) -> str:
    return next(f"o{n}" for n in range(1000) if partition_of(f"o{n}", PAGE_PARTITIONS) == p)


def _in(owner: str, p: int) -> bool:
    return partition_of(owner, PAGE_PARTITIONS) == p


def timer(owner: str, key: str, due: int, target: AggregateRef | None = None) -> Timer:
    return Timer(
        id=f"{owner}/{key}",
        owner=ref(owner),
        key=key,
        version=1,
        partition=partition_of(owner, PAGE_PARTITIONS),
        rule=OnceRule(at=due),
        target=target or ref(owner),
        command=CommandSpec(type="Remind"),
        slot_due_at=due,
        due_at=due,
    )


def test_the_status_topic_is_one_compacted_partition_per_context() -> None:
    specs = {s.name: s for s in node_topics([parse_aggregate_type(TYPE)], 12)}
    # Rolled hourly: the segment being written is never compacted, and every node's start
    # reads the topic whole.
    assert specs[TOPIC] == TopicSpec(TOPIC, 1, compacted=True, segment_ms=3_600_000)
    assert topic_configs(specs[TOPIC], Replication(3, 2))["segment.ms"] == "3600000"


async def test_a_report_counts_each_owned_partitions_timers(group: Group) -> None:
    node = FakeNode(owned=[0, 1], restoring=[2])
    store = node.store
    o0 = owner_in(0)
    late, soon = timer(o0, "late", T0 - 5_000), timer(o0, "soon", T0 + 2_000)
    stuck = timer(o0, "stuck", T0 - 60_000, target=ref("dead"))
    held = timer(o0, "held", T0 - 1_000)
    for t in (late, soon, stuck, held):
        assert await store.put(t)
    parked = stuck.model_copy(update={"status": TimerStatus.PARKED, "attempts": 3})
    assert await store.settle([TimerChange(loaded=stuck, next=parked)]) == 1
    assert await store.pause(held.owner, held.key, 2)  # counted, never listed as due
    report = await collect_report(node, "n1", web=None, interval_ms=INTERVAL)
    rows = {(r.type, r.partition): r for r in report.partitions}
    assert set(rows) == {(TYPE, 0), (TYPE, 1), (TYPE, 2)}
    zero = rows[(TYPE, 0)]
    assert (zero.state, zero.pending, zero.parked, zero.paused) == ("running", 2, 1, 1)
    assert (zero.oldest_overdue, zero.next_due) == (T0 - 5_000, T0 + 2_000)
    assert rows[(TYPE, 2)].state == "restoring"
    assert [t.key for t in report.parked] == ["stuck"]
    assert [t.key for t in report.upcoming] == ["late", "soon"]
    assert report.at == T0 and report.group == node.settings.group_id


class _Logged:
    """A store whose census calls are written to `events` (a partition at a time)."""

    def __init__(self, inner: MemoryTimerStore, events: list[str]) -> None:
        self._inner, self._events = inner, events

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def census(self, partition: int, now: int, **kwargs: Any) -> TimerCensus:
        self._events.append(f"census {partition}")
        return await self._inner.census(partition, now, **kwargs)


async def test_a_report_lets_the_loop_run_between_partitions_censuses() -> None:
    # The census of every partition in one piece held the loop (the runners' firing)
    # for the whole report, every status interval.
    node = FakeNode(owned=[0, 1, 2, 3])
    events: list[str] = []
    node.types[TYPE] = Kept(_Logged(node.store, events))  # type: ignore[arg-type]
    done = False

    async def other() -> None:
        while not done:
            events.append("other")
            await asyncio.sleep(0)

    ticking = asyncio.create_task(other())
    await asyncio.sleep(0)
    try:
        await collect_report(node, "n1", web=None, interval_ms=INTERVAL)
    finally:
        done = True
        await ticking
    censuses = [n for n, e in enumerate(events) if e.startswith("census")]
    assert [events[n] for n in censuses] == [f"census {p}" for p in range(4)]
    for a, b in itertools.pairwise(censuses):
        assert "other" in events[a + 1 : b], events


class _Revoking(_Logged):
    """A store whose partitions are revoked from the node at a census, as a rebalance lets
    them go while the report yields: `at[p]` is revoked once partition p's census ran."""

    def __init__(self, node: FakeNode, at: dict[int, int], events: list[str]) -> None:
        super().__init__(node.store, events)
        self._node, self._at = node, at
        self.revoking: list[asyncio.Task[None]] = []

    async def census(self, partition: int, now: int, **kwargs: Any) -> TimerCensus:
        got = await super().census(partition, now, **kwargs)
        if (gone := self._at.get(partition)) is not None:
            self.revoking.append(asyncio.create_task(self._revoke(gone)))  # in the yield
        return got

    async def _revoke(self, partition: int) -> None:
        self._node.owned = [q for q in self._node.owned if q != partition]  # a new health()
        await self._inner.revoke([partition])
        self._events.append(f"revoked {partition}")


async def test_a_partition_revoked_during_a_report_is_left_out_alone() -> None:
    # One partition revoked after its census made the type's `due()` fail: every upcoming
    # fire and job of the type was left out of the report, for one partition gone.
    node = FakeNode(owned=[0, 1, 2, 3])
    for p in range(PAGE_PARTITIONS):
        assert await node.store.put(timer(owner_in(p), f"k{p}", T0 + 1_000 * p))
    events: list[str] = []
    # 2 is revoked before its census (in the yield after 0's), 0 after the last census.
    store = _Revoking(node, {0: 2, 3: 0}, events)
    node.types[TYPE] = Kept(store)  # type: ignore[arg-type]
    report = await collect_report(node, "n1", web=None, interval_ms=INTERVAL)
    assert events == ["census 0", "revoked 2", "census 1", "census 2", "census 3", "revoked 0"]
    # 2's row is left out (not this node's any more); 0's was read before it went.
    assert [(r.partition, r.state, r.pending) for r in report.partitions] == [
        (0, "running", 1),
        (1, "running", 1),
        (3, "running", 1),
    ]
    assert [t.key for t in report.upcoming] == ["k1", "k3"], "the others' fires still listed"
    await asyncio.gather(*store.revoking)


async def test_a_partition_closed_and_taken_again_during_a_report_keeps_its_row() -> None:
    # Its census met a closed store and its row vanished, though the node still has it.
    node = FakeNode(owned=[0, 1, 2, 3])
    events: list[str] = []

    class Retaken(_Revoking):
        async def _revoke(self, partition: int) -> None:
            await super()._revoke(partition)
            node.restoring = [partition]  # failed, and being restored here again

    store = Retaken(node, {0: 1}, events)
    node.types[TYPE] = Kept(store)  # type: ignore[arg-type]
    report = await collect_report(node, "n1", web=None, interval_ms=INTERVAL)
    await asyncio.gather(*store.revoking)
    rows = {r.partition: (r.state, r.pending) for r in report.partitions}
    assert rows == {0: ("running", 0), 1: ("restoring", 0), 2: ("running", 0), 3: ("running", 0)}


async def test_each_node_reads_every_nodes_report(group: Group) -> None:
    a_node, a = await group.join("node-a", [0, 1])
    _, b = await group.join("node-b", [2, 3])
    # b started after a's first report: it read it from the topic's start.
    assert {r.node for r in b.reports()} == {"node-a", "node-b"}
    await follow(a)
    assert {r.node for r in a.reports()} == {"node-a", "node-b"}
    own = await collect_report(a_node, "node-a", web=None, interval_ms=INTERVAL)
    view = cluster_view(own, a.reports(), PAGE_PARTITIONS, T0)
    assert [(r.partition, r.state, r.node, r.stale) for r in view.partitions] == [
        (0, "running", "node-a", ""),
        (1, "running", "node-a", ""),
        (2, "running", "node-b", ""),
        (3, "running", "node-b", ""),
    ]
    assert view.partitions[2].web == "http://node-b"
    assert [(r.partition, r.node) for r in view.census] == [
        (0, "node-a"),
        (1, "node-a"),
        (2, "node-b"),
        (3, "node-b"),
    ]


async def test_a_silent_node_goes_stale_and_its_partitions_move_to_a_fresh_report(
    group: Group,
) -> None:
    a_node, a = await group.join("node-a", [0, 1])
    b_node, _ = await group.join("node-b", [2, 3])
    await follow(a)
    bound = STALE_INTERVALS * INTERVAL
    a_node.clock.t = b_node.clock.t = T0 + bound  # just within the bound: fresh
    own = await collect_report(a_node, "node-a", web=None, interval_ms=INTERVAL)
    assert not any(r.stale for r in cluster_view(own, a.reports(), 4, T0 + bound).partitions)
    a_node.clock.t = T0 + bound + 1
    own = await collect_report(a_node, "node-a", web=None, interval_ms=INTERVAL)
    view = cluster_view(own, a.reports(), PAGE_PARTITIONS, T0 + bound + 1)
    assert [r.node for r in view.partitions] == ["node-a", "node-a", "node-b", "node-b"]
    assert view.partitions[2].stale.startswith("stale: last report 3.0 s ago")
    assert view.nodes[1].stale and not view.nodes[0].stale
    # The group moved partition 3 to a: its fresh report wins over b's stale one.
    a_node.owned = [0, 1, 3]
    await a.publish()
    own = await collect_report(a_node, "node-a", web=None, interval_ms=INTERVAL)
    view = cluster_view(own, a.reports(), PAGE_PARTITIONS, a_node.clock.t)
    assert [(r.node, bool(r.stale)) for r in view.partitions] == [
        ("node-a", False),
        ("node-a", False),
        ("node-b", True),
        ("node-a", False),
    ]
    assert [(r.partition, r.node) for r in view.census][-1] == (3, "node-a")
    # An hour on, b's report is forgotten: its partition is nobody's.
    a_node.clock.t = T0 + FORGET_MS + 1
    own = await collect_report(a_node, "node-a", web=None, interval_ms=INTERVAL)
    view = cluster_view(own, a.reports(), PAGE_PARTITIONS, a_node.clock.t)
    assert (view.partitions[2].state, view.partitions[2].node) == ("unowned", "no node reports it")


async def test_a_clean_stop_writes_the_nodes_tombstone(group: Group) -> None:
    _, a = await group.join("node-a", [0, 1])
    _, b = await group.join("node-b", [2, 3])
    await b.stop()
    del group.nodes["node-b"]
    await follow(a)
    assert [r.node for r in a.reports()] == ["node-a"]
    records = group.log.records(TOPIC, 0)
    assert (records[-1].key, records[-1].value) == (b"node-b", None)


async def test_records_that_are_no_report_are_counted_and_skipped(group: Group) -> None:
    _, a = await group.join("node-a", [0, 1])
    publisher = group.log.publisher()
    good = NodeReport(
        node="node-c",
        group=a._node.settings.group_id,
        at=T0,
        interval_ms=INTERVAL,
        partitions=(PartitionReport(type=TYPE, partition=2, state="running"),),
    )
    other_group = good.model_copy(update={"node": "node-d", "group": "another-cluster"})
    past = good.model_copy(
        update={"partitions": (PartitionReport(type=TYPE, partition=9, state="running"),)}
    )
    for key, value in [
        (b"junk", b"not json"),
        (b"node-x", orjson.dumps({"node": "node-x"})),  # not a whole report
        (b"someone-else", encode_report(good)),  # the report of another key
        (None, encode_report(good)),
        (b"node-c", encode_report(past)),  # a partition the group has not
        (b"node-c", encode_report(good)),
        (b"node-d", encode_report(other_group)),  # another group's: not shown, not bad
    ]:
        await publisher.send(TOPIC, key, value, 0)
    await follow(a)
    assert a.bad_reports == 5 and len(group.bad) == 5
    assert [r.node for r in a.reports()] == ["node-a", "node-c"]
    # A node started now reads the same topic whole: the same count, no failure.
    _, b = await group.join("node-b", [3])
    assert b.bad_reports == 5


async def test_a_node_publishes_when_its_partitions_change(group: Group) -> None:
    node, a = await group.join("node-a", [0])
    a.interval_ms = 60_000  # the interval alone would not publish within the test
    task = asyncio.create_task(a.run())
    try:
        node.owned = [0, 1]

        for _ in range(500):  # the loop looks every 0.2 s: within 5 s
            if a.published >= 2:
                break
            await asyncio.sleep(0.01)
        assert a.published == 2
        [report] = a.reports()
        assert sorted({p.partition for p in report.partitions}) == [0, 1]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_write_the_broker_does_not_take_is_tried_again(
    group: Group, caplog: pytest.LogCaptureFixture
) -> None:
    node, a = await group.join("node-a", [0])
    group.log.down = True
    caplog.set_level(logging.INFO, logger="app.ops.cluster_status")
    assert not await a.publish()
    assert not await a.publish()
    # One warning for the run of failures (the broker watch says the broker is away).
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "publishing the node's status" in warned[0].getMessage()
    group.log.down = False
    node.owned = [0, 2]
    assert await a.publish()
    [report] = a.reports()
    assert sorted(p.partition for p in report.partitions) == [0, 2]


async def test_an_owners_timers_elsewhere_are_read_from_the_changelog(group: Group) -> None:
    _, a = await group.join("node-a", [0])
    owner = owner_in(2)
    t1, t2 = timer(owner, "k1", T0), timer(owner, "k2", T0)
    other = timer(owner, "k3", T0)
    publisher = group.log.publisher()
    changelog = parse_aggregate_type(TYPE).timers_changelog
    for t in (t1, t2, other):
        await publisher.send(
            changelog, row_key(t.owner, t.key), orjson.dumps(t.model_dump(mode="json")), 2
        )
    await publisher.send(changelog, row_key(t2.owner, t2.key), None, 2)  # k2 deleted since
    await publisher.send(changelog, row_key(ref(owner), "k4"), b"not a row", 2)
    await publisher.send(changelog, b"bad", b"not a row", 2)
    found = await a.changelog_timers(TYPE, 2, ref(owner), 10)
    assert ([t.key for t in found.timers], found.total) == (["k1", "k3"], 2)
    # Bounded (F2), live ones first: a finished k0 comes after them, and past the limit.
    fired = timer(owner, "k0", T0).model_copy(update={"status": TimerStatus.FIRED})
    await publisher.send(changelog, row_key(fired.owner, "k0"), encode_timer(fired), 2)
    found = await a.changelog_timers(TYPE, 2, ref(owner), 2)
    assert ([t.key for t in found.timers], found.total, found.cut) == (["k1", "k3"], 3, True)
    found = await a.changelog_timers(TYPE, 2, ref(owner), 3)
    assert [t.key for t in found.timers] == ["k1", "k3", "k0"]
    group.log.down = True
    with pytest.raises(KafkaUnavailable):
        await a.changelog_timers(TYPE, 2, ref(owner), 10)
    group.log.down = False


def test_the_web_address_is_the_settings_or_the_host_and_port() -> None:
    assert web_address(Settings(web_url="https://tw-1.example/"), 8080) == "https://tw-1.example"
    assert web_address(Settings(web_host="10.0.0.5"), 8080) == "http://10.0.0.5:8080"
    assert web_address(Settings(web_host="0.0.0.0"), 8080) is None
    assert web_address(Settings(), 0) is None
    for bad in ("javascript:alert(1)//http://x", 'http://x"onclick="y', "https:///x"):
        with pytest.raises(ValidationError):
            Settings(web_url=bad)


class _Runs:
    """Stands in for the node and the cluster status in the worker's run."""

    def __init__(self, fails: BaseException | None = None) -> None:
        self.fails = fails
        self.cancelled = False

    async def run(self) -> None:
        if self.fails is not None:
            raise self.fails
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise


async def test_a_status_task_that_ends_stops_the_worker_loudly() -> None:
    node, status = _Runs(), _Runs(RuntimeError("a bug"))
    with pytest.raises(NodeFailed, match="status stopped: failed: RuntimeError"):
        await _run_node(node, status)  # type: ignore[arg-type]
    assert node.cancelled


async def test_a_node_that_fails_stops_its_status_publishing() -> None:
    node, status = _Runs(NodeFailed("partition 1 could not be taken")), _Runs()
    with pytest.raises(NodeFailed, match="partition 1"):
        await _run_node(node, status)  # type: ignore[arg-type]
    assert status.cancelled
