"""The parts of the node's metrics (`app.node.metrics`) that hold no registry: the
histograms' buckets, a restore's progress callback bound to its partition's gauges
(`RestoreGauges`), and a histogram fed a batch of amounts at once (`observe_all`). May
import `prometheus_client` only."""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter as Tally
from collections.abc import Sequence

from prometheus_client import Gauge, Histogram

__all__ = [
    "COMMIT_BUCKETS",
    "LATENESS_BUCKETS",
    "RESTORE_BUCKETS",
    "RestoreGauges",
    "observe_all",
]

LATENESS_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0,
)  # fmt: skip
"""From the firing path's milliseconds (p50 in ms when healthy) to an hour (a node was down)."""

COMMIT_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip

RESTORE_BUCKETS = (0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)


class RestoreGauges:
    """A restore's progress callback, bound to its partition's two gauges."""

    def __init__(self, read: Gauge, to_read: Gauge) -> None:
        self._read = read
        self._to_read = to_read
        # Until it read all: a restore's partition shows no timers (a count mid-restore
        # would scan it, again after each batch).
        self.done = False

    def __call__(self, read: int, to_read: int) -> None:
        self._read.set(read)
        self._to_read.set(to_read)
        self.done = read >= to_read


def observe_all(histogram: Histogram, amounts: Sequence[float]) -> None:
    """`histogram.observe` of each of `amounts`, counted a bucket at a time: an
    observation takes a lock twice and walks the buckets in Python (~3 µs), once per fired
    timer otherwise. Through prometheus_client's own parts of a child; one by one when it
    has none of them (another version's, or a labelled parent, which refuses)."""
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for amount in amounts:
            histogram.observe(amount)
        return
    # The first bound at or above an amount is its bucket, as `observe` counts it (the
    # last bound is +Inf). Amounts are finite (latenesses of integer milliseconds).
    for i, n in Tally(bisect_left(bounds, a) for a in amounts).items():
        buckets[i].inc(n)
    total.inc(sum(amounts))
