"""Slow start for a burst: how many due rows a round takes (`round_slice`).

A round's claims are decided, then fired by their partitions' cycles and committed in
their transactions, each in one turn of the event loop. When a thousand are due at once,
the round that takes them all makes every cycle and transaction large, and the first
timer fires only when its transaction's round trips have each waited behind all that
work. So when a round would be full (`limit` or more due), it takes a small first slice,
whose cycles and transactions are small and commit at once; the next rounds take as many
until the burst may grow (`grow`: a node's loop, once the first of the burst's commits
landed, so that its round trips never wait behind large turns), then each doubles the
slice while rows are left due (a full round), up to `limit`; a round that leaves
nothing due ends the burst. Fewer than `limit` due (steady load) is never sliced: such a
round takes them all, as without slow start. Rows not taken stay in the wheel.

A node runs each partition's rounds on their own (`spread` of them side by side on one
loop): a burst of 10,000 over 12 partitions leaves ~830 due in each, under a round's
`limit`, so without `spread` no partition sliced its burst and every first transaction
waited behind the others' cycles of ~830 timers (first fire ~650 ms after due against
~120 ms with it, 2 workers, 2026-12-02).

A burst is rows falling due together: most of them (half or more) due less than
`STREAM_SPAN_MS` before the latest. Rows due spread wider are a steady stream's backlog
(its rounds were held up: a loop busy with other work), not a burst, and are taken whole:
at 5,000 timers/s such a stall left ~170 due in a partition, which began a burst of 5 a
round growing only as its commits landed, so its backlog grew for a second before it was
taken (the lateness tail, docs/performance.md). A few older rows beside a step (deferred
sends, a hand-off's gap, a timer set in the past) do not make it a stream.
"""

from __future__ import annotations

__all__ = [
    "FIRST_SLICE",
    "HELD_AT_MOST_MS",
    "STREAM_SPAN_MS",
    "burst_after",
    "may_begin_burst",
    "round_slice",
]

FIRST_SLICE = 32
"""A burst's first rounds take this many each (spread over the partitions by due time and
id): a few per partition, so that their cycles and first transactions are tiny."""


HELD_AT_MOST_MS = 300
"""How long a burst's slice is held at most while its first commits go: a broker slow to
commit them (seconds on a saturated machine) must not hold the burst's rate down long."""


STREAM_SPAN_MS = 100
"""A burst's step: its rows fall due less than this before the latest of them (at one
instant, or within jitter). Rows due now spread wider are a stream's backlog."""


def round_slice(
    due: int,
    burst: int | None,
    *,
    limit: int,
    first: int = FIRST_SLICE,
    grow: bool = True,
    spread: int = 1,
    before: int = 0,
    step: int | None = None,
) -> int:
    """How many rows this round takes: `due` rows are due now (counted up to `limit`);
    `burst` the slice of the burst under way (its last round left rows due), if any;
    `grow`: whether that slice may double now (else it is taken again). `spread`: how many
    partitions' rounds run side by side on this loop, each with its own slice (a node's
    partitions each run theirs): a burst then begins at their share of `limit` due, and
    each first slice is their share of `first`, so that the first turns of them all
    together stay as small as one round's over all of them. `before`: how many the last
    round found due: a burst begins only where that was under the mark (a step), never
    again and again under a steady load that keeps as many due (slow rounds, a backlog:
    restarting each at a small slice would only add round trips). `step`: how many of the
    rows due fall due less than `STREAM_SPAN_MS` before the latest (None: all of them):
    fewer than half, they are a stream's backlog, taken whole (`limit`), not a burst."""
    if burst is not None:
        return min(limit, 2 * burst if grow else burst)
    if may_begin_burst(due, limit=limit, spread=spread, before=before) and (
        step is None or 2 * step >= due
    ):
        return max(1, min(first // max(1, spread), limit))  # a burst begins
    return limit  # steady: all that is due, as many as a round may take


def may_begin_burst(due: int, *, limit: int, spread: int = 1, before: int = 0) -> bool:
    """Whether `due` rows due now (the last round found `before`) are a step over the mark,
    where a burst begins unless they are a stream's backlog (`round_slice`): only then is
    their step worth its scan of the wheels."""
    mark = max(1, limit // max(1, spread))
    return due >= mark and before < mark


def burst_after(taken: int, more: bool) -> int | None:
    """The burst as the next round sees it, after a round whose slice (`round_slice`, what
    it might take) was `taken`: None when it left nothing due (`more`)."""
    return taken if more else None
