"""What a node holds of `<context>.nodes`, which any producer may write (F3): a report is
held decoded, many times its bytes (a ~40-byte row of a partition takes ~600), so the
reader refuses rows no node writes (a partition listed twice, past `TYPES_IN_REPORT`
types), bounds the rows it holds across all its keys (`MAX_HELD_ROWS`), and lets the
event loop go between the records it applies."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import orjson
import pytest
from fakes import T0, TYPE, FakeNode
from test_cluster_status import owner_in, timer
from test_cluster_status_bad_input import INTERVAL, TOPIC, report

from app.kafka.memory import MemoryLog
from app.node.kept import node_topics
from app.ops.cluster_status import ClusterStatus
from app.ops.node_report import (
    MAX_HELD_ROWS,
    MAX_REPORT_BYTES,
    TYPES_IN_REPORT,
    PartitionReport,
    encode_report,
    fit_report,
    held_rows,
)
from app.ops.status_view import StatusView
from app.protocol.topics import parse_aggregate_type

PARTITIONS = 1024  # a topic's most: the largest reports a real node writes


def rows(types: int, partitions: int) -> tuple[PartitionReport, ...]:
    return tuple(
        PartitionReport(type=f"shop.t{t}", partition=p, state="running")
        for t in range(types)
        for p in range(partitions)
    )


def test_a_listed_timer_counts_as_six_rows() -> None:
    parked = timer(owner_in(2), "k", T0)
    assert held_rows(report(parked=(parked,) * 2)) == 1 + 1 + 2 * 6


def test_a_report_listing_a_partition_twice_or_too_many_types_is_refused() -> None:
    view = StatusView("g1", PARTITIONS, lambda: T0)
    # The hunt's record: ~9,800 copies of one tiny row, within MAX_REPORT_BYTES.
    row = {"type": "abc", "partition": 0, "state": ""}
    raw = orjson.loads(encode_report(report()))
    copies = orjson.dumps(raw | {"partitions": [row] * 9_000})
    assert len(copies) <= MAX_REPORT_BYTES
    assert not view.apply(TOPIC, b"node-b", 0, copies)
    many_types = report(partitions=rows(TYPES_IN_REPORT + 1, 1))
    assert not view.apply(TOPIC, b"node-b", 1, encode_report(many_types))
    assert view.bad == 2 and view.rows == 0 and view.reports(T0) == []
    # What a real node writes: each of its types' partitions once.
    real = fit_report(report(partitions=rows(3, PARTITIONS)))
    assert view.apply(TOPIC, b"node-b", 2, encode_report(real))
    assert view.rows == held_rows(real) == 1 + 3 * PARTITIONS
    # And a node never writes what readers refuse.
    with pytest.raises(ValueError, match="twice"):
        fit_report(report(partitions=rows(1, 2) * 2))


def test_the_view_holds_at_most_so_many_rows_across_its_keys_dropping_the_oldest() -> None:
    view = StatusView("g1", PARTITIONS, lambda: T0)
    big = rows(3, PARTITIONS)
    for n in range(70):  # 70 keys, far under MAX_HELD_KEYS, ~215,000 rows
        node = f"node-{n:02}"
        assert view.apply(TOPIC, node.encode(), n, encode_report(report(node=node, partitions=big)))
    held = view.reports(T0)
    assert view.rows == sum(held_rows(r) for r in held) <= MAX_HELD_ROWS
    kept = MAX_HELD_ROWS // (1 + len(big))
    assert view.dropped == 70 - kept
    assert sorted(r.node for r in held) == [f"node-{n:02}" for n in range(70 - kept, 70)]
    view.apply(TOPIC, b"node-69", 70, None)  # a tombstone lets its rows go
    assert view.rows == (kept - 1) * (1 + len(big))


@pytest.fixture
async def log() -> AsyncIterator[MemoryLog]:
    yield MemoryLog(node_topics([parse_aggregate_type(TYPE)], 16))


async def test_the_records_read_are_applied_letting_the_loop_go_between_them(
    log: MemoryLog,
) -> None:
    """Decoding a report of hundreds of KiB takes tens of ms: a batch of them is not
    applied in one go of the loop."""
    publisher = log.publisher()
    for n in range(5):
        node = f"node-{n}"
        await publisher.send(TOPIC, node.encode(), encode_report(report(node=node)), 0)
    status = ClusterStatus(log, publisher, FakeNode(), "node-a", web=None, interval_ms=INTERVAL)
    ticks = 0
    seen: list[int] = []
    apply = status.view.apply

    def counted(topic: str, key: bytes | None, offset: int, value: bytes | None) -> bool:
        seen.append(ticks)
        return apply(topic, key, offset, value)

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    status.view.apply = counted  # type: ignore[method-assign]
    ticker = asyncio.create_task(tick())
    try:
        await status.start()
    finally:
        ticker.cancel()
        await status.stop()
    assert len(seen) >= 5
    assert all(a < b for a, b in itertools.pairwise(seen))
