"""`GET /timers/upcoming`'s reads of the node's stores (`upcoming_answer`).

Each partition's due index is read from where the page starts (`scan_start`: its cursor or
`due_from`), `UPCOMING_CHUNK` rows a store call at most and the first call no more than
the page shows plus two, and the event loop has a turn after every call: a read is
synchronous (RocksDB reads and decodes ~15-40 µs a row), and the loop that fires the
node's timers waited out whole partitions' scans of 10,000 rows (0.13-0.4 s each). A
partition is read no further once no row left in it can be on the page (`past_page`,
`read_until`), nor past `UPCOMING_SCAN` rows: the pages end where such a scan stopped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Final

from app.ops.json_answers import store_failed
from app.ops.upcoming import (
    SortKey,
    UpcomingAnswer,
    UpcomingQuery,
    past_page,
    read_until,
    scan_start,
    sort_key,
    taken,
    upcoming_page,
)
from tables import StoreClosed, StoreError, Timer, TimerStore
from tables.bounds import MAX_INT64
from tables.keys import row_key
from tables.store import DuePosition

__all__ = ["UPCOMING_CHUNK", "UPCOMING_SCAN", "upcoming_answer"]

UPCOMING_SCAN: Final = 10_000
"""A request reads at most this many timers per type and partition: it costs a bounded
scan however large a partition grows (the pages end where a scan stopped)."""

UPCOMING_CHUNK: Final = 250
"""Rows one store call of a request reads, at most (~12 ms on RocksDB, two cores loaded
2.4): the loop has a turn between two calls."""


async def upcoming_answer(
    parts: Iterable[tuple[str, TimerStore, Iterable[int]]],
    query: UpcomingQuery,
    owned: list[int],
) -> UpcomingAnswer:
    """The page of `query` of each `(type, store, partitions)` of `parts`, read one
    partition at a time; a partition whose store failed (a damaged block: its task
    restores it) is named in `unread`, the others answer; one let go meanwhile is left
    out. `BadQuery` for a cursor no page gave out."""
    start = scan_start(query)
    until = MAX_INT64 if query.due_until is None else query.due_until
    kept: list[Timer] = []
    horizon: SortKey | None = None
    unread: dict[str, str] = {}
    for name, store, partitions in parts:
        for p in sorted(partitions):
            try:
                kept, stopped = await _partition(store, p, query, start, kept, until)
            except StoreClosed:
                continue  # let go while this was read: no longer this node's
            except StoreError as exc:
                store_failed(exc)
                unread[f"{name}[{p}]"] = str(exc)[:500]
                continue
            if stopped is not None:
                horizon = stopped if horizon is None else min(horizon, stopped)
    page = upcoming_page(kept, query, horizon)
    return UpcomingAnswer(
        timers=page.timers,
        next_cursor=page.next_cursor,
        partitions=owned,
        scanned_all=horizon is None and not unread,
        unread=unread,
    )


async def _partition(
    store: TimerStore,
    p: int,
    query: UpcomingQuery,
    start: DuePosition | None,
    kept: list[Timer],
    until: int,
) -> tuple[list[Timer], SortKey | None]:
    """`kept` with what the page may take of partition `p`, read a chunk at a time; and
    where the read stopped when it stopped at `UPCOMING_SCAN` rows (None: it read all the
    page may need)."""
    after, read = start, 0
    size = min(UPCOMING_CHUNK, query.limit + 2)
    while True:
        bound = read_until(kept, query.limit, until)
        if after is not None and after[0] > bound:
            return kept, None  # the page starts past every row it may take
        want = min(size, UPCOMING_SCAN - read)
        got = await store.due_after({p}, bound, want, after)
        await asyncio.sleep(0)  # the loop's turn after each read (it held it throughout)
        read += len(got)
        kept = taken(kept, got, query)
        if len(got) < want:
            return kept, None  # read through to `bound`
        last = got[-1]
        if past_page(kept, last, query.limit):
            return kept, None
        if read >= UPCOMING_SCAN:
            return kept, sort_key(last)
        after, size = (last.due_at, last.id, row_key(last.owner, last.key)), UPCOMING_CHUNK
