"""The cluster's status under bad input (#22 review): a long failure text, a store that
fails its census, a report that cannot be made; forged reports on `<context>.nodes`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from fakes import PAGE_PARTITIONS, T0, TYPE, FakeNode

import app.ops.cluster_status as cluster_status
from app.kafka.memory import MemoryLog
from app.node.kept import node_topics
from app.ops.cluster_status import ClusterStatus
from app.ops.node_report import TEXT_IN_REPORT, collect_report
from app.protocol.topics import ContextTopics, parse_aggregate_type
from tables import StoreError

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
