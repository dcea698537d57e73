"""A node's status report of many partitions is published (found by a health hunt): three
types at 1,024 partitions each encoded their rows in full past `MAX_REPORT_BYTES`, so
`fit_report` refused it at every interval and every other node's page showed that node's
partitions stale or unowned while it ran."""

from __future__ import annotations

from app.ops.cluster_page import cluster_view
from app.ops.node_report import (
    MAX_REPORT_BYTES,
    NodeReport,
    PartitionReport,
    decode_report,
    encode_report,
    fit_report,
)


def _report(types: int) -> NodeReport:
    rows = tuple(
        PartitionReport(
            type=f"shop.type{t}",
            partition=p,
            state="running",
            pending=123,
            parked=1,
            next_due=1_800_000_000_000,
        )
        for t in range(types)
        for p in range(1024)
    )
    return NodeReport(
        node="worker-1:8080",
        group="tickwheel",
        at=1_800_000_000_000,
        interval_ms=5000,
        partitions=rows,
    )


def test_three_types_at_1024_partitions_fit_a_report_and_read_back_whole() -> None:
    report = _report(3)
    fitted = fit_report(report)
    encoded = encode_report(fitted)
    assert len(encoded) <= MAX_REPORT_BYTES
    assert decode_report(b"worker-1:8080", encoded) == report


def test_a_row_at_its_defaults_reads_back_the_same() -> None:
    bare = PartitionReport(type="shop.order", partition=0, state="running")
    report = NodeReport(node="n", group="g", at=1, interval_ms=1000, partitions=(bare,))
    assert decode_report(b"n", encode_report(report)) == report


def test_rows_of_long_type_names_with_every_count_set_fit_their_owners_and_states() -> None:
    """Past the bound with every field set (a review's finding: overdue and firing timers,
    longer type names), the rows keep their type, partition and state."""
    rows = tuple(
        PartitionReport(
            type=f"payments-eu-west.subscription-renewal{t}",
            partition=p,
            state="running",
            pending=123_456,
            firing=12,
            parked=3,
            paused=4,
            oldest_overdue=1_800_000_000_000,
            next_due=1_800_000_000_000,
        )
        for t in range(3)
        for p in range(1024)
    )
    report = NodeReport(node="n", group="g", at=1, interval_ms=1000, partitions=rows)
    fitted = fit_report(report)
    assert len(encode_report(fitted)) <= MAX_REPORT_BYTES
    assert [(p.type, p.partition, p.state) for p in fitted.partitions] == [
        (p.type, p.partition, p.state) for p in rows
    ]
    assert fitted.counts_cut and decode_report(b"n", encode_report(fitted)) == fitted
    # Its counts are not said, not zero: the page's census leaves its rows out.
    view = cluster_view(fitted, [], known=True, partitions=1024, now=1)
    assert view.census == [] and len(view.partitions) == 1024


def test_a_whole_report_says_nothing_of_cut_counts() -> None:
    """An older reader refuses a field it does not know: written only when true."""
    assert b"counts_cut" not in encode_report(_report(1))
