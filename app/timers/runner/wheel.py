"""The runner's wheel: the rows due up to one poll interval ahead, by (due, id), loaded with
one `due_rows()` and kept current with what this node writes (puts offered, settles), so that
the loop wakes at each due instant. A row in it may be stale (cancelled meanwhile): its claim,
a conditional write, then fails, so the wheel never decides what the store refuses. A row's
Timer is built when it is taken (most of a load's cost): one dropped by a reload before it
fell due is never built."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Awaitable, Callable, Iterable, Set

from tables import DueRow, Timer, TimerStatus

__all__ = ["Load", "Wheel"]

Load = Callable[[set[int], int, int], Awaitable[list[DueRow]]]
"""`(partitions, until, limit) -> rows due by until`: the store's `due_rows()`."""


class Wheel:
    def __init__(self, load: Load, horizon_ms: int, limit: int) -> None:
        self._load = load
        self._horizon = horizon_ms
        self._limit = limit
        self._heap: list[tuple[int, str, int, DueRow]] = []
        # The last tiebreak: one timer offered twice never compares its rows.
        self._seq = itertools.count()
        self.until: int | None = None
        """It holds the rows due until then; None: it is loaded again at the next take."""
        self._partitions: frozenset[int] = frozenset()

    async def take_due(self, partitions: frozenset[int], now: int) -> tuple[list[Timer], bool]:
        """The rows due now (at most `limit`), loaded again (one due() for every partition)
        when it ran out, was invalidated or the partitions changed; and whether more may be
        due now (in the wheel, or beyond a full load)."""
        if self.until is None or now >= self.until or partitions != self._partitions:
            until = now + self._horizon
            rows = await self._load(set(partitions), until, self._limit)
            self._heap = [(r.due_at, r.id, next(self._seq), r) for r in rows]
            heapq.heapify(self._heap)  # due() sorts by due time; ties across partitions
            self._partitions = partitions
            # A full load may have left rows out: it is loaded again next round.
            self.until = until if len(rows) < self._limit else None
        by_id: dict[str, DueRow] = {}
        while self._heap and self._heap[0][0] <= now and len(by_id) < self._limit:
            r = heapq.heappop(self._heap)[3]
            by_id[r.id] = r  # a row offered again: the later offer is the newer row
        try:
            taken = DueRow.built(by_id.values())
        except Exception:
            self.invalidate()  # the rows taken are loaded again, as after a failed load
            raise
        head_due = bool(self._heap) and self._heap[0][0] <= now
        return taken, head_due or (self.until is None and not self._heap and bool(taken))

    @property
    def next_due(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def due(self, now: int, partitions: Set[int]) -> dict[str, int]:
        """The rows in it due by `now` of `partitions`, by id (O(wheel): for metrics)."""
        return {r.id: d for d, _, _, r in self._heap if d <= now and r.partition in partitions}

    def offer(self, timers: Iterable[Timer], partitions: Set[int]) -> None:
        """Puts rows just written (PENDING) in it, when they fall within it."""
        until = self.until
        if until is None:
            return
        for t in timers:
            if t.status is TimerStatus.PENDING and t.due_at < until and t.partition in partitions:
                heapq.heappush(self._heap, (t.due_at, t.id, next(self._seq), DueRow.of(t)))

    def invalidate(self) -> None:
        """Loaded again at the next take (rows changed behind its back)."""
        self.until = None
