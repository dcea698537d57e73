"""The runner's wheel: the rows due up to one poll interval ahead, by (due, id), loaded with
one `due_rows()` and kept current with what this node writes (puts offered, settles), so that
the loop wakes at each due instant. A row in it may be stale (cancelled meanwhile): its claim,
a conditional write, then fails, so the wheel never decides what the store refuses. A row's
Timer is built when it is taken (most of a load's cost): one dropped by a reload before it
fell due is never built.

Rows are kept per partition, so that a take hands each partition at most what it has room
for (`Room`: a partition firing in-process takes its timers in chunks, as fast as its
transactions commit them) and leaves the rest of it, unbuilt, for a later take. A take
serves partitions in the order of their earliest due row, each as much as it has room for
(not one row of each in turn): a partition's chunk, decided in one cycle, commits in one
transaction, and the broker's cost is per transaction. A load holds `LOAD_ROUNDS` takes'
worth (rows are cheap until built), so that each partition's share is a large chunk.

A full load (as many rows as `limit`) holds every row due before its last row's due time:
its rows are taken before it is loaded again, so that a burst loaded just before it falls
due is not loaded a second time at its due instant."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Awaitable, Callable, Iterable, Set

from tables import DueRow, Timer, TimerStatus

__all__ = ["Load", "Room", "Wheel"]

Load = Callable[[set[int], int, int], Awaitable[list[DueRow]]]
"""`(partitions, until, limit) -> rows due by until`: the store's `due_rows()`."""

Room = Callable[[int], int | None]
"""How many of a partition's due rows a take may hand out now (None: as many as due)."""

_Entry = tuple[int, str, int, DueRow]

LOAD_ROUNDS = 4
"""A load reads this many takes' worth of rows (`limit` each)."""


class Wheel:
    def __init__(self, load: Load, horizon_ms: int, limit: int) -> None:
        self._load = load
        self._horizon = horizon_ms
        self._limit = limit
        self._heaps: dict[int, list[_Entry]] = {}
        # The last tiebreak: one timer offered twice never compares its rows.
        self._seq = itertools.count()
        self.until: int | None = None
        """It holds the rows due until then; None: it is loaded again at the next take."""
        # The last load was full: rows due at `until` or later may be missing from it.
        self._full = False
        # Partitions whose due rows the last take left for want of room: their room's
        # owner wakes the loop when it has some (`next_due` leaves them out).
        self._held: frozenset[int] = frozenset()
        self._partitions: frozenset[int] = frozenset()

    async def take_due(
        self, partitions: frozenset[int], now: int, room: Room | None = None
    ) -> tuple[list[Timer], bool]:
        """The rows due now (at most `limit`, and of each partition at most its `room`),
        loaded again (one due_rows() for every partition) when it ran out, was invalidated
        or the partitions changed; and whether more may be taken now (in the wheel, or
        beyond a full load)."""
        budget: dict[int, int | None] = {}

        def left(p: int) -> int | None:
            if p not in budget:
                budget[p] = None if room is None else room(p)
            return budget[p]

        if self._stale(partitions, now):
            until = now + self._horizon
            rows = await self._load(set(partitions), until, self._limit * LOAD_ROUNDS)
            self._heaps = {}
            for r in rows:
                self._heaps.setdefault(r.partition, []).append((r.due_at, r.id, next(self._seq), r))
            for heap in self._heaps.values():
                heapq.heapify(heap)
            self._partitions = partitions
            self._full = len(rows) >= self._limit * LOAD_ROUNDS
            self.until = max(r.due_at for r in rows) if self._full else until
        by_id: dict[str, DueRow] = {}
        held: set[int] = set()
        heads: list[tuple[_Entry, int]] = []
        for p, heap in self._heaps.items():
            if heap and heap[0][0] <= now:
                if left(p) == 0:
                    held.add(p)
                else:
                    heads.append((heap[0], p))
        heapq.heapify(heads)
        while heads and len(by_id) < self._limit:
            _, p = heapq.heappop(heads)
            heap = self._heaps[p]
            while heap and heap[0][0] <= now and left(p) != 0 and len(by_id) < self._limit:
                r = heapq.heappop(heap)[3]
                if r.id not in by_id:
                    n = left(p)
                    if n is not None:
                        budget[p] = n - 1
                by_id[r.id] = r  # a row offered again: the later offer is the newer row
            if heap and heap[0][0] <= now:
                if left(p) == 0:
                    held.add(p)
                else:
                    heapq.heappush(heads, (heap[0], p))
        self._held = frozenset(held)
        try:
            taken = DueRow.built(by_id.values())
        except Exception:
            self.invalidate()  # the rows taken are loaded again, as after a failed load
            raise
        beyond = self._full and self.until is not None and now >= self.until
        return taken, bool(heads) or (beyond and not held and bool(taken))

    def _stale(self, partitions: frozenset[int], now: int) -> bool:
        """Whether it must be loaded before a take: invalidated, other partitions, or
        past what it holds (after a full load: once none of its rows is due, but for
        rows held for want of room: loading again would read the same rows, thousands,
        at every round until their partitions have room)."""
        if self.until is None or partitions != self._partitions:
            return True
        if now < self.until:
            return False
        if not self._full:
            return True
        due = [p for p, h in self._heaps.items() if h and h[0][0] <= now]
        return not due

    @property
    def next_due(self) -> int | None:
        """The earliest due time in it but of the partitions held (woken by their room)."""
        heads = [h[0][0] for p, h in self._heaps.items() if h and p not in self._held]
        return min(heads, default=None)

    @property
    def held(self) -> frozenset[int]:
        """The partitions whose due rows the last take left for want of room."""
        return self._held

    def due(self, now: int, partitions: Set[int]) -> dict[str, int]:
        """The rows in it due by `now` of `partitions`, by id (O(wheel): for metrics)."""
        return {
            r.id: d
            for p, heap in self._heaps.items()
            if p in partitions
            for d, _, _, r in heap
            if d <= now
        }

    def offer(self, timers: Iterable[Timer], partitions: Set[int]) -> None:
        """Puts rows just written (PENDING) in it, when they fall within it."""
        until = self.until
        if until is None:
            return
        for t in timers:
            if t.status is TimerStatus.PENDING and t.due_at < until and t.partition in partitions:
                heap = self._heaps.setdefault(t.partition, [])
                heapq.heappush(heap, (t.due_at, t.id, next(self._seq), DueRow.of(t)))

    def invalidate(self) -> None:
        """Loaded again at the next take (rows changed behind its back)."""
        self.until = None
