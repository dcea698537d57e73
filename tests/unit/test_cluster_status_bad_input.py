"""The cluster's status under bad input (#22 review): a long failure text, a store that
fails its census, a report that cannot be made; forged reports on `<context>.nodes`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from fakes import PAGE_PARTITIONS, T0, TYPE, FakeNode
from hypothesis import given
from hypothesis import strategies as st
from test_cluster_status import owner_in, timer

import app.ops.cluster_status as cluster_status
from app.kafka.memory import MemoryLog
from app.node.kept import node_topics
from app.ops.cluster_page import cluster_view, when
from app.ops.cluster_status import FORGET_MS, ClusterStatus, StatusView
from app.ops.node_report import (
    AHEAD_INTERVALS,
    MAX_REPORT_BYTES,
    PARKED_IN_REPORT,
    TEXT_IN_REPORT,
    UPCOMING_IN_REPORT,
    NodeReport,
    PartitionReport,
    collect_report,
    decode_report,
    encode_report,
    fit_report,
)
from app.protocol.topics import ContextTopics, parse_aggregate_type
from tables import StoreError, TimerStatus
from tables.bounds import MAX_INSTANT, MAX_INT64

TOPIC = ContextTopics("shop").nodes
INTERVAL = 1_000


@pytest.fixture
async def log() -> AsyncIterator[MemoryLog]:
    yield MemoryLog(node_topics([parse_aggregate_type(TYPE)], PAGE_PARTITIONS))


async def started(log: MemoryLog, node: FakeNode, name: str = "node-a") -> ClusterStatus:
    status = ClusterStatus(log, log.publisher(), node, name, web=None, interval_ms=INTERVAL)
    await status.start()
    return status


async def test_a_failure_text_past_the_reports_limit_is_cut(log: MemoryLog) -> None:
    why = "RuntimeError('boom') reading " + ", ".join(f"t@{n}" for n in range(2000))
    node = FakeNode(owned=[0], stalled={"0": why, "3": why})
    report = await collect_report(node, "n1", web=None, interval_ms=INTERVAL)
    rows = {r.partition: r for r in report.partitions}
    assert rows[0].state == "stalled" and rows[3].state == "failed"
    assert len(rows[0].why) <= TEXT_IN_REPORT and rows[0].why.startswith("RuntimeError('boom')")
    assert "cut" in rows[0].why
    status = await started(log, node)  # publishes its first report
    assert status.published == 1 and status.report_errors == 0
    [mine] = status.reports()
    assert {p.partition for p in mine.partitions} == {0, 3}


class _Broken:
    """A store whose census fails (a disk error, a row it cannot read)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def census(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreError("the disk is gone")


async def test_a_partition_whose_census_fails_is_reported_unknown(log: MemoryLog) -> None:
    node = FakeNode(owned=[0, 1])
    kept = node.types[TYPE]
    node.types[TYPE] = type(kept)(_Broken(kept.store))  # type: ignore[arg-type]
    report = await collect_report(node, "n1", web=None, interval_ms=INTERVAL)
    assert [(r.partition, r.state) for r in report.partitions] == [(0, "unknown"), (1, "unknown")]
    assert "the disk is gone" in report.partitions[0].why
    status = await started(log, node)
    assert status.published == 1


async def test_a_report_that_cannot_be_made_never_ends_the_status_task(
    log: MemoryLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = FakeNode(owned=[0])
    status = await started(log, node)
    counted: list[int] = []
    status._on_report_error = lambda: counted.append(1)

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("a bug")

    monkeypatch.setattr(cluster_status, "collect_report", broken)
    assert not await status.publish()  # logged and counted, not raised
    assert (status.report_errors, counted) == (1, [1])
    monkeypatch.undo()
    node.clock.t = T0 + 1
    assert await status.publish()
    await status.stop()


# --- forged reports: dates and numbers past the bounds ------------------------------------


def report(**update: Any) -> NodeReport:
    base = NodeReport(
        node="node-b",
        group="g1",
        at=T0,
        interval_ms=INTERVAL,
        partitions=(PartitionReport(type=TYPE, partition=2, state="running"),),
    )
    return base.model_copy(update=update)


async def test_reports_past_the_bounds_or_dated_ahead_are_bad(log: MemoryLog) -> None:
    node = FakeNode(owned=[0])
    status = await started(log, node)
    raw = orjson.loads(encode_report(report()))
    part = raw["partitions"][0]
    forged = [
        raw | {"at": 10**15},  # past year 9999: no date, every page a 500
        raw | {"at": T0 + (AHEAD_INTERVALS + 1) * INTERVAL},  # would never go stale
        raw | {"interval_ms": 10**12},  # fresh for 30 years
        raw | {"lateness_p99_ms": -1},
        raw | {"partitions": [part | {"next_due": MAX_INT64 + 1}]},
        raw | {"partitions": [part | {"pending": -1}]},
    ]
    publisher = log.publisher()
    for value in forged:
        await publisher.send(TOPIC, b"node-b", orjson.dumps(value), 0)
    await follow(status)
    assert status.bad_reports == len(forged)
    assert [r.node for r in status.reports()] == ["node-a"]
    # A clock a little ahead is no forgery.
    ahead = report(at=T0 + AHEAD_INTERVALS * INTERVAL)
    await publisher.send(TOPIC, b"node-b", encode_report(ahead), 0)
    await follow(status)
    assert status.bad_reports == len(forged)
    assert [r.node for r in status.reports()] == ["node-b", "node-a"]
    node.clock.t = T0 - INTERVAL // 2  # its clock went back: no report owns from ahead
    assert [r.node for r in status.reports()] == ["node-a"]
    await status.stop()


async def follow(status: ClusterStatus) -> None:
    for c in status._contexts.values():
        for r in await c.follower.poll(timeout_ms=10):
            status.view.apply(r.topic, r.key, r.offset, r.value)


def test_the_view_of_the_farthest_values_a_report_holds_renders() -> None:
    """A due time may be a deadline (an instant plus a delay) past year 9999."""
    far = report(
        partitions=(
            PartitionReport(
                type=TYPE, partition=2, state="running", oldest_overdue=MAX_INT64, next_due=0
            ),
        ),
        lateness_p99_ms=1e308,
    )
    own = report(node="node-a", at=MAX_INSTANT, partitions=())
    view = cluster_view(own, [far], PAGE_PARTITIONS, MAX_INSTANT)
    [row] = view.census
    assert row.overdue.startswith("after 9999-12-31 UTC") and row.next_due.startswith("1970")
    assert when(MAX_INSTANT) == "9999-12-31 23:59:59.999 UTC"


@given(st.integers(0, MAX_INT64), st.integers(0, MAX_INSTANT))
def test_any_deadline_is_shown_at_any_time(ms: int, now: int) -> None:
    assert when(ms, now)


# --- memory: what a node holds of the topic -----------------------------------------------


def test_a_record_past_the_size_or_the_lists_bounds_is_bad() -> None:
    view = StatusView("g1", PAGE_PARTITIONS, lambda: T0)
    big = orjson.dumps(orjson.loads(encode_report(report())) | {"group": "g" * MAX_REPORT_BYTES})
    parked = timer(owner_in(2), "k", T0)
    many = report().model_copy(update={"parked": (parked,) * (PARKED_IN_REPORT + 1)})
    assert not view.apply(TOPIC, b"node-b", 0, big)
    assert not view.apply(TOPIC, b"node-b", 1, encode_report(many))
    assert view.bad == 2 and view.reports(T0) == []


def test_a_node_keeps_its_reports_under_what_every_reader_reads() -> None:
    parked = timer(owner_in(2), "k", T0).model_copy(update={"status": TimerStatus.PARKED})
    why = "x" * TEXT_IN_REPORT
    huge = report(
        partitions=tuple(
            PartitionReport(type=f"shop.t{n}", partition=p, state="stalled", why=why)
            for n in range(3)
            for p in range(100)
        ),
        parked=(parked,) * PARKED_IN_REPORT,
        upcoming=(parked,) * UPCOMING_IN_REPORT,
    )
    assert len(encode_report(huge)) > MAX_REPORT_BYTES
    fitted = fit_report(huge)
    assert len(encode_report(fitted)) <= MAX_REPORT_BYTES
    assert fitted.partitions == tuple(
        p.model_copy(update={"why": fitted.partitions[0].why}) for p in huge.partitions
    )
    assert decode_report(b"node-b", encode_report(fitted)) == fitted
    small = report(parked=(parked,))
    assert fit_report(small) == small


def test_the_view_lets_go_of_tombstones_other_groups_and_forgotten_reports() -> None:
    now = [T0]
    view = StatusView("g1", PAGE_PARTITIONS, lambda: now[0])
    view.apply(TOPIC, b"node-b", 0, encode_report(report()))
    view.apply(TOPIC, b"node-c", 1, encode_report(report(node="node-c", group="other")))
    assert len(view._held) == 1
    view.apply(TOPIC, b"node-b", 2, None)
    assert view._held == {}
    view.apply(TOPIC, b"node-d", 3, encode_report(report(node="node-d")))
    now[0] = T0 + FORGET_MS + 1
    view.sweep(now[0])
    assert view._held == {}


def test_the_view_holds_at_most_so_many_keys_dropping_the_oldest() -> None:
    view = StatusView("g1", PAGE_PARTITIONS, lambda: T0)
    view.max_keys = 10
    for n in range(15):
        node = f"node-{n:02}"
        assert view.apply(TOPIC, node.encode(), n, encode_report(report(node=node)))
    assert view.dropped == 5
    assert sorted(r.node for r in view.reports(T0)) == [f"node-{n:02}" for n in range(5, 15)]
