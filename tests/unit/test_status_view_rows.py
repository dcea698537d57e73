"""What a node holds of `<context>.nodes`, which any producer may write (F3): a report is
held decoded, many times its bytes (a ~40-byte row of a partition takes ~600), so the
reader refuses rows no node writes (a partition listed twice), drops the bodies of the
timers listed, bounds the rows it holds across all its keys (`MAX_HELD_ROWS`, each record
counted by its rows and its bytes), and lets the event loop go between the records it
applies."""

from __future__ import annotations

import asyncio
import gc
import itertools
import tracemalloc
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
    NodeReport,
    PartitionReport,
    decode_report,
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


def test_a_report_listing_a_partition_twice_is_refused() -> None:
    view = StatusView("g1", PARTITIONS, lambda: T0)
    # The hunt's record: ~9,800 copies of one tiny row, within MAX_REPORT_BYTES.
    row = {"type": "abc", "partition": 0, "state": ""}
    raw = orjson.loads(encode_report(report()))
    copies = orjson.dumps(raw | {"partitions": [row] * 9_000})
    assert len(copies) <= MAX_REPORT_BYTES
    assert not view.apply(TOPIC, b"node-b", 0, copies)
    assert view.bad == 1 and view.rows == 0 and view.reports(T0) == []
    # What a real node writes: each of its types' partitions once.
    real = encode_report(fit_report(report(partitions=rows(3, PARTITIONS))))
    assert view.apply(TOPIC, b"node-b", 2, real)
    assert view.rows == 1 + 3 * PARTITIONS + -(-5 * len(real) // 600)
    # And a node never writes what readers refuse.
    with pytest.raises(ValueError, match="twice"):
        fit_report(report(partitions=rows(1, 2) * 2))


def test_the_view_holds_at_most_so_many_rows_across_its_keys_dropping_the_oldest() -> None:
    view = StatusView("g1", PARTITIONS, lambda: T0)
    big = rows(3, PARTITIONS)
    for n in range(70):  # 70 keys, far under MAX_HELD_KEYS, ~310,000 rows
        node = f"node-{n:02}"
        assert view.apply(TOPIC, node.encode(), n, encode_report(report(node=node, partitions=big)))
    held = view.reports(T0)
    each = held_rows(held[0], len(encode_report(held[0])))  # all of one size
    assert view.rows == each * len(held) <= MAX_HELD_ROWS
    kept = MAX_HELD_ROWS // each
    assert view.dropped == 70 - kept
    assert sorted(r.node for r in held) == [f"node-{n:02}" for n in range(70 - kept, 70)]
    view.apply(TOPIC, b"node-69", 70, None)  # a tombstone lets its rows go
    assert view.rows == (kept - 1) * each


def test_a_node_of_many_types_writes_its_report() -> None:
    """No bound on a context's types: a node of 101 writes its report, which is read."""
    many = encode_report(fit_report(report(partitions=rows(101, 2))))
    view = StatusView("g1", PARTITIONS, lambda: T0)
    assert view.apply(TOPIC, b"node-b", 0, many)
    assert len(view.reports(T0)[0].partitions) == 202


def with_job(value: bytes, body: object) -> bytes:
    """`value` listing a job's timer whose command's body is `body` (an older node's)."""
    job = orjson.loads(timer(owner_in(2), "k", T0).model_dump_json())
    job["command"]["body"] = body
    return orjson.dumps(orjson.loads(value) | {"jobs": [job]})


def held_by(view: StatusView, values: list[bytes]) -> int:
    """The bytes `view` holds once it applied `values` (each its own node's)."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for n, value in enumerate(values):
            assert view.apply(TOPIC, f"node-{n}".encode(), n, value)
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()


def test_a_listed_timers_body_is_dropped_as_read() -> None:
    """Another producer's body is any JSON: one timer's `{"a": [{}, {}, …]}` within
    `MAX_REPORT_BYTES` was held decoded at 9.4 MB (24 times its bytes), counted 8 rows."""
    values = []
    for n in range(10):
        value = encode_report(report(node=f"node-{n}"))
        room = MAX_REPORT_BYTES - len(with_job(value, {})) - 100
        values.append(with_job(value, {"a": [{}] * (room // 3)}))
        assert len(values[-1]) <= MAX_REPORT_BYTES
    view = StatusView("g1", PARTITIONS, lambda: T0)
    held = held_by(view, values)
    assert view.dropped == 0
    assert held <= view.rows * 600  # what a row stands for
    assert held < 10 * MAX_REPORT_BYTES  # was ~94 MB
    assert [r.jobs[0].command.body for r in view.reports(T0)] == [{}] * 10
    # An older node's report, its bodies in: read, its timers listed, their bodies left out.
    older = decode_report(b"node-b", with_job(encode_report(report()), {"x": 1}))
    assert older is not None and older.jobs[0].command.body == {}
    assert older.jobs[0].command.type == "Remind"
    # And a node writes none: a report made of its timers lists them without.
    t = timer(owner_in(2), "k", T0)
    t = t.model_copy(update={"command": t.command.model_copy(update={"body": {"x": 1}})})
    made = NodeReport(node="node-b", group="g1", at=T0, interval_ms=INTERVAL, parked=(t,))
    assert made.parked[0].command.body == {} and made.parked[0].key == "k"


def test_what_a_record_holds_past_its_rows_counts_by_its_bytes() -> None:
    """A row's `why` of 2,000 characters, one of them past U+FFFF, is held at 4 bytes a
    character: 190 such rows in one record held 1.6 MB, counted 191 rows (~115 KB)."""
    why = "\U0001f600" + "a" * 1_999
    parts = tuple(
        PartitionReport(type=TYPE, partition=p, state="failed", why=why) for p in range(190)
    )
    values = [encode_report(report(node=f"node-{n}", partitions=parts)) for n in range(5)]
    assert all(len(v) <= MAX_REPORT_BYTES for v in values)
    view = StatusView("g1", PARTITIONS, lambda: T0)
    held = held_by(view, values)
    assert held <= view.rows * 600


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
