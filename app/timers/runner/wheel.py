"""The runner's wheel: the rows due up to one poll interval ahead, by (due, id), loaded with
one `due_rows()` and kept current with what this node writes (puts offered, settles), so that
the loop wakes at each due instant. A row in it may be stale (cancelled meanwhile): its claim,
a conditional write, then fails, so the wheel never decides what the store refuses. A row's
Timer is built when it is taken (most of a load's cost): one dropped by a reload before it
fell due is never built.

Rows are kept per partition, so that a take hands each partition at most what it has room
for (`Room`: a partition firing in-process takes its timers in chunks, as fast as its
transactions commit them) and leaves the rest of it, unbuilt, for a later take. Only rows
that take room (`Counts`: fired in-process) wait for it; those past it (sent over the
command topic, expired) are handed out as ever, and the rows they pass are set aside in
the partition's waiting heap, each built and asked once. A take
serves partitions in the order of their earliest due row, each as much as it has room for
(not one row of each in turn): a partition's chunk, decided in one cycle, commits in one
transaction, and the broker's cost is per transaction. A load holds `LOAD_ROUNDS` takes'
worth (rows are cheap until built), so that each partition's share is a large chunk.

A full load (as many rows as `limit`) holds every row due before its last row's due time:
its rows are taken before it is loaded again, so that a burst loaded just before it falls
due is not loaded a second time at its due instant.

What it holds is reckoned per partition (`until` of each), and a load reads only the
partitions that ran out: a partition whose due rows wait for room keeps them (never read,
nor handed out, twice) while the others are loaded past it, so that the slowest partition's
commits hold no other partition's timers up."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Awaitable, Callable, Iterable, Set

from tables import DueRow, Timer, TimerStatus

__all__ = ["Counts", "Load", "Room", "Wheel"]

Load = Callable[[set[int], int, int], Awaitable[list[DueRow]]]
"""`(partitions, until, limit) -> rows due by until`: the store's `due_rows()`."""

Room = Callable[[int], int | None]
"""How many of a partition's due rows a take may hand out now (None: as many as due)."""

Counts = Callable[[Timer], bool]
"""Whether a row due takes room when handed out (one fired in-process); others never wait."""

_Entry = tuple[int, str, int, DueRow]

LOAD_ROUNDS = 4
"""A load reads this many takes' worth of rows (`limit` each)."""


class Wheel:
    def __init__(self, load: Load, horizon_ms: int, limit: int) -> None:
        self._load = load
        self._horizon = horizon_ms
        self._limit = limit
        self._heaps: dict[int, list[_Entry]] = {}
        # Per partition: its due rows that take room, set aside while it has none.
        self._waiting: dict[int, list[_Entry]] = {}
        # The last tiebreak: one timer offered twice never compares its rows.
        self._seq = itertools.count()
        # Per partition: it holds its rows due until then (none: loaded at the next take).
        self._until: dict[int, int] = {}
        # Partitions whose last load was full: rows due at their `until` or later may be
        # missing from it.
        self._full: set[int] = set()
        # Partitions whose due rows the last take left for want of room: their room's
        # owner wakes the loop when it has some (`next_due` leaves them out).
        self._held: frozenset[int] = frozenset()
        self._partitions: frozenset[int] = frozenset()

    @property
    def until(self) -> int | None:
        """It holds every partition's rows due until then; None: loaded at the next take."""
        if not self._until or set(self._until) != self._partitions:
            return None
        return min(self._until.values())

    async def take_due(
        self,
        partitions: frozenset[int],
        now: int,
        room: Room | None = None,
        counts: Counts | None = None,
    ) -> tuple[list[Timer], bool]:
        """The rows due now (at most `limit`, and of each partition at most its `room` of
        those that `counts`, None: all), the partitions that ran out, were invalidated or
        changed loaded again first (one due_rows() for them all); and whether more may be
        taken now (in the wheel, or beyond a full load)."""
        budget: dict[int, int | None] = {}

        def left(p: int) -> int | None:
            if p not in budget:
                budget[p] = None if room is None else room(p)
            return budget[p]

        def sift(p: int) -> None:
            """With no room left, p's due rows that take room are set aside (each once, in
            its waiting heap), so that those that take none behind them are handed out."""
            if left(p) != 0:
                return
            heap, wait = self._heaps.setdefault(p, []), self._waiting.setdefault(p, [])
            while _due(heap, now) and (counts is None or counts(heap[0][3].timer())):
                heapq.heappush(wait, heapq.heappop(heap))

        def blocked(p: int) -> bool:
            """Every due row of p waits for room."""
            sift(p)
            return (
                left(p) == 0
                and not _due(self._heaps.get(p), now)
                and _due(self._waiting.get(p), now)
            )

        try:
            await self._reload(partitions, now, blocked)
        except Exception:
            self.invalidate()
            raise
        by_id: dict[str, DueRow] = {}
        held: set[int] = set()
        heads = [(e, p) for p in self._heaps if (e := self._head(p, now)) is not None]
        heapq.heapify(heads)
        try:
            while heads and len(by_id) < self._limit:
                _, p = heapq.heappop(heads)
                heap, wait = self._heaps.setdefault(p, []), self._waiting.setdefault(p, [])
                while len(by_id) < self._limit:
                    n = left(p)
                    if n != 0 and _due(wait, now) and not (_due(heap, now) and heap[0] < wait[0]):
                        r = heapq.heappop(wait)[3]  # set aside for room, which it has now
                        counted = True
                    elif _due(heap, now):
                        r = heap[0][3]
                        # Built to be told whether it takes room: handed out if it does not.
                        counted = n is not None and (counts is None or counts(r.timer()))
                        if counted and n == 0:
                            heapq.heappush(wait, heapq.heappop(heap))
                            continue
                        heapq.heappop(heap)
                    else:
                        break
                    if counted and n is not None and r.id not in by_id:
                        budget[p] = n - 1
                    by_id[r.id] = r  # a row offered again: the later offer is the newer row
                if left(p) == 0 and _due(wait, now):
                    held.add(p)
                if _due(heap, now) or (left(p) != 0 and _due(wait, now)):
                    head = self._head(p, now)
                    assert head is not None
                    heapq.heappush(heads, (head, p))
            taken = DueRow.built(by_id.values())
        except Exception:
            self.invalidate()  # the rows taken are loaded again, as after a failed load
            raise
        self._held = frozenset(held)
        beyond = any(
            p in self._full and now >= self._until.get(p, now) and p not in held
            for p in {r.partition for r in by_id.values()}
        )
        return taken, bool(heads) or beyond

    def _head(self, p: int, now: int) -> _Entry | None:
        """p's earliest due row, set aside for room or not."""
        due = [h[0] for h in (self._heaps.get(p, []), self._waiting.get(p, [])) if _due(h, now)]
        return min(due, default=None)

    async def _reload(
        self, partitions: frozenset[int], now: int, blocked: Callable[[int], bool]
    ) -> None:
        """Loads the partitions that must be (`_stale`) in one due_rows(); the others keep
        their rows. Past a full load, not before its due rows were taken, but for those
        held for room: they stay (loading them again would read the same rows, thousands,
        at every round until their partitions have room) and the others are loaded past
        them."""
        if partitions != self._partitions:
            self._heaps, self._waiting, self._until, self._full = {}, {}, {}, set()
        stale = {p for p in partitions if self._stale(p, now)}
        draining = any(
            p in self._full and now >= self._until[p] and not blocked(p)
            for p in partitions
            if p not in stale
        )
        if draining:  # a full load's rows not all taken yet: others loaded once they are
            stale = {p for p in stale if p not in self._until}
        if not stale:
            return
        until = now + self._horizon
        rows = await self._load(stale, until, self._limit * LOAD_ROUNDS)
        full = len(rows) >= self._limit * LOAD_ROUNDS
        last = max(r.due_at for r in rows) if full else until
        heaps: dict[int, list[_Entry]] = {p: [] for p in stale}
        for r in rows:
            if r.partition in heaps:
                heaps[r.partition].append((r.due_at, r.id, next(self._seq), r))
        for p, heap in heaps.items():
            heapq.heapify(heap)
            self._heaps[p] = heap
            self._waiting[p] = []
            self._until[p] = last
        self._full = (self._full - stale) | (stale if full else set())
        self._partitions = partitions
        for p in set(self._heaps) - partitions:
            del self._heaps[p]
            self._waiting.pop(p, None)

    def _stale(self, p: int, now: int) -> bool:
        """Whether partition p must be loaded before a take: invalidated, new, or past what
        it holds (after a full load: once none of its rows is due)."""
        until = self._until.get(p)
        if until is None:
            return True
        if now < until:
            return False
        return p not in self._full or self._head(p, now) is None

    @property
    def next_due(self) -> int | None:
        """The earliest due time in it but of the partitions held (woken by their room)."""
        heads = [h[0][0] for h in self._heaps.values() if h]
        heads += [h[0][0] for p, h in self._waiting.items() if h and p not in self._held]
        return min(heads, default=None)

    def reload_at(self, now: int) -> int | None:
        """When a partition runs past what it holds (a load then), but those held past it:
        loaded once their rows were taken, when their room wakes the loop."""
        ats = [u for p, u in self._until.items() if not (p in self._held and u <= now)]
        return min(ats, default=None) if self.until is not None else None

    @property
    def held(self) -> frozenset[int]:
        """The partitions whose due rows the last take left for want of room."""
        return self._held

    def due(self, now: int, partitions: Set[int]) -> dict[str, int]:
        """The rows in it due by `now` of `partitions`, by id (O(wheel): for metrics)."""
        return {
            r.id: d
            for heaps in (self._heaps, self._waiting)
            for p, heap in heaps.items()
            if p in partitions
            for d, _, _, r in heap
            if d <= now
        }

    def offer(self, timers: Iterable[Timer], partitions: Set[int]) -> None:
        """Puts rows just written (PENDING) in it, when they fall within what it holds."""
        for t in timers:
            until = self._until.get(t.partition)
            if (
                until is not None
                and t.status is TimerStatus.PENDING
                and t.due_at < until
                and t.partition in partitions
            ):
                heap = self._heaps.setdefault(t.partition, [])
                heapq.heappush(heap, (t.due_at, t.id, next(self._seq), DueRow.of(t)))

    def invalidate(self) -> None:
        """Loaded again at the next take (rows changed behind its back)."""
        self._until = {}


def _due(heap: list[_Entry] | None, now: int) -> bool:
    return heap is not None and bool(heap) and heap[0][0] <= now
