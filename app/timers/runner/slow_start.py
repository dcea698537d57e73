"""Slow start for a burst: how many due rows a round takes (`round_slice`).

A round's claims are decided, then fired by their partitions' cycles and committed in
their transactions, each in one turn of the event loop. When a thousand are due at once,
the round that takes them all makes every cycle and transaction large, and the first
timer fires only when its transaction's round trips have waited behind all that work.
So when a round would be full (`limit` or more due), it takes a small first slice, whose
cycles and transactions are small and commit at once, and each following round doubles
the slice while rows are left due (a full round), up to `limit`; a round that leaves
nothing due ends the burst. Fewer than `limit` due (steady load) is never sliced: such a
round takes them all, as without slow start. Rows not taken stay in the wheel.
"""

from __future__ import annotations

__all__ = ["FIRST_SLICE", "round_slice", "slice_after"]

FIRST_SLICE = 64
"""A burst's first round takes this many (spread over the partitions by due time and
id): a few per partition, so that their first cycles and transactions are tiny."""


def round_slice(due: int, burst: int | None, *, limit: int, first: int = FIRST_SLICE) -> int:
    """How many rows this round takes: `due` rows are due now (counted up to `limit`),
    `burst` the slice of the last round if it left rows due (None: no burst under way)."""
    if burst is not None:
        return min(limit, 2 * burst)
    if due >= limit:
        return max(1, min(first, limit))  # a burst begins
    return limit  # steady: all that is due, as many as a round may take


def slice_after(taken: int, more: bool) -> int | None:
    """The burst as the next round sees it: this round's slice (`round_slice`, what it
    might take) when it left rows due (`more`), else None (over, or there was none)."""
    return taken if more else None
