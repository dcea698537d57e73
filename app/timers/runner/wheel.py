"""The runner's wheel: the rows due up to one poll interval ahead, by (due, id), loaded with
one `due_rows()` and kept current with what this node writes (puts offered, settles), so that
the loop wakes at each due instant. A row in it may be stale (cancelled meanwhile): its claim,
a conditional write, then fails, so the wheel never decides what the store refuses. A row's
Timer is built when it is taken (most of a load's cost): one dropped by a reload before it
fell due is never built.

Each partition the runner fires has a wheel of its own (`PartitionFiring`); `load_due_of`
loads them together with one `due_rows()` when one ran out (a full load: once its rows due
were all taken), and `take_from` takes the rows due across them by (due, id), as one wheel
of every partition would, as many as the round takes (`slow_start`). A row the store cannot
read (a corrupt one) fails only its partition (`built_apart`)."""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Set

from tables import DueRow, StoreError, Timer, TimerStatus

__all__ = [
    "Load",
    "Wheel",
    "built_apart",
    "count_due_of",
    "due_step_of",
    "load_due_of",
    "pop_from",
    "take_due_of",
    "take_from",
]

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
        self._full = False
        self._partitions: frozenset[int] = frozenset()

    async def take_due(self, partitions: frozenset[int], now: int) -> tuple[list[Timer], bool]:
        """The rows due now (at most `limit`), loaded again (one due() for every partition)
        when it ran out, was invalidated or the partitions changed; and whether more may be
        due now (in the wheel, or beyond a full load)."""
        if self.stale(now) or self.exhausted(now) or partitions != self._partitions:
            rows = await self._load(set(partitions), now + self._horizon, self._limit)
            full = len(rows) >= self._limit
            self.fill(rows, partitions, held_until(rows, now + self._horizon, full), full=full)
        by_id: dict[str, DueRow] = {}
        while len(by_id) < self._limit and (r := self.pop_due(now)) is not None:
            by_id[r.id] = r  # a row offered again: the later offer is the newer row
        try:
            taken = DueRow.built(by_id.values())
        except Exception:
            self.invalidate()  # the rows taken are loaded again, as after a failed load
            raise
        return taken, self.more_due(now, took=bool(taken))

    def stale(self, now: int) -> bool:
        """Whether it must be loaded again before it is taken from: never loaded,
        invalidated, or past what it holds (a full load: see `exhausted`)."""
        if self.until is None:
            return True
        return not self._full and now >= self.until

    def exhausted(self, now: int) -> bool:
        """Whether it holds a full load (more rows may be due, at or after its last row)
        and no row of it is due any more: loaded again once all the wheels loaded with it
        are, rather than each round of a burst, to take the same rows again."""
        return (
            self._full and self.until is not None and now >= self.until and not self._head_due(now)
        )

    def _head_due(self, now: int) -> bool:
        return bool(self._heap) and self._heap[0][0] <= now

    def fill(
        self, rows: list[DueRow], partitions: frozenset[int], until: int, *, full: bool
    ) -> None:
        """Holds `rows` (a load of `partitions`, every row due before `until`; `full`: more
        may be due from `until` on) instead of what it held."""
        self._heap = [(r.due_at, r.id, next(self._seq), r) for r in rows]
        heapq.heapify(self._heap)  # due() sorts by due time; ties across partitions
        self._partitions = partitions
        self._full = full
        self.until = until

    def pop_due(self, now: int) -> DueRow | None:
        """Its earliest row, if due by `now`."""
        if self._heap and self._heap[0][0] <= now:
            return heapq.heappop(self._heap)[3]
        return None

    def more_due(self, now: int, *, took: bool) -> bool:
        """Whether more may be due now: in it, or beyond a full load it was emptied of."""
        return self._head_due(now) or (self._full and took)

    @property
    def next_due(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    @property
    def head(self) -> tuple[int, str] | None:
        """Its earliest row's (due, id): the order rows are taken in across wheels."""
        return (self._heap[0][0], self._heap[0][1]) if self._heap else None

    def count_due(self, now: int, cap: int) -> int:
        """How many rows in it are due by `now`, counted up to `cap` (O(wheel) at most)."""
        n = 0
        for d, _, _, _ in self._heap:
            if d <= now:
                n += 1
                if n >= cap:
                    break
        return n

    def latest_due(self, now: int) -> int | None:
        """The latest due time of its rows due by `now` (O(wheel)); None: none is due."""
        if not self._head_due(now):
            return None
        return max(d for d, _, _, _ in self._heap if d <= now)

    def count_due_from(self, since: int, now: int) -> int:
        """How many of its rows fall due from `since` to `now` (O(wheel))."""
        return sum(1 for d, _, _, _ in self._heap if since <= d <= now)

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
        self._full = False


async def take_due_of(
    wheels: Mapping[int, Wheel], load: Load, now: int, horizon_ms: int, limit: int
) -> tuple[list[Timer], bool]:
    """The rows due now across the partitions' `wheels` (at most `limit`, earliest first),
    all loaded first with one `load` when one ran out (`load_due_of`); and whether more may
    be due now."""
    await load_due_of(wheels, load, now, horizon_ms, limit)
    return take_from(wheels, now, limit)


async def load_due_of(
    wheels: Mapping[int, Wheel],
    load: Load,
    now: int,
    horizon_ms: int,
    limit: int,
    held: Mapping[int, Collection[str]] | None = None,
) -> None:
    """Loads all the partitions' `wheels` with one `load` (at most `limit` rows) when one
    ran out: so that they run out together, one load a poll interval, as one wheel of
    every partition (a row offered since is in the store: loaded again). `held`: ids of
    each partition's timers in hand (handed over, still PENDING in the store): left out
    of its wheel, and the load that long, so that a full load still holds `limit` others
    (a burst's cycle behind its rounds otherwise has each load bring back its own)."""
    if any(w.stale(now) for w in wheels.values()) or (
        wheels and all(w.exhausted(now) for w in wheels.values())
    ):
        stale = frozenset(wheels)
        held = held or {}
        asked = limit + sum(len(held[p]) for p in stale if p in held)
        rows = await load(set(stale), now + horizon_ms, asked)
        full = len(rows) >= asked
        until = held_until(rows, now + horizon_ms, full)
        by_partition: defaultdict[int, list[DueRow]] = defaultdict(list)
        for r in rows:
            if (ids := held.get(r.partition)) is not None and r.id in ids:
                continue
            by_partition[r.partition].append(r)
        for p in stale:
            wheels[p].fill(by_partition[p], frozenset({p}), until, full=full)


def held_until(rows: list[DueRow], until: int, full: bool) -> int:
    """Until when a load by `until` holds every row due: a full load, only before its last
    row's due time (rows due then or later may have been left out; ties are by id)."""
    return rows[-1].due_at if full and rows else until


def count_due_of(wheels: Mapping[int, Wheel], now: int, cap: int) -> int:
    """How many rows the `wheels` hold due by `now`, counted up to `cap`."""
    n = 0
    for w in wheels.values():
        n += w.count_due(now, cap - n)
        if n >= cap:
            break
    return n


def due_step_of(wheels: Mapping[int, Wheel], now: int, within: int) -> int:
    """How many rows due by `now` in the `wheels` fall due less than `within` ms before
    the latest of them: the step a burst is (a few older ones, deferred or late, are not
    of it); 0 when none is due."""
    latest = [d for w in wheels.values() if (d := w.latest_due(now)) is not None]
    if not latest:
        return 0
    since = max(latest) - within + 1
    return sum(w.count_due_from(since, now) for w in wheels.values())


def take_from(wheels: Mapping[int, Wheel], now: int, limit: int) -> tuple[list[Timer], bool]:
    """The rows due now in the `wheels` (at most `limit`), by due time then id across them
    (so that a few taken are spread over the partitions); whether more may be due now."""
    rows, took, more = pop_from(wheels, now, limit)
    try:
        taken = DueRow.built(rows)
    except Exception:
        for p in took:
            wheels[p].invalidate()  # loaded again, as after a failed load
        raise
    return taken, more


def pop_from(
    wheels: Mapping[int, Wheel], now: int, limit: int
) -> tuple[list[DueRow], set[int], bool]:
    """`take_from`'s rows, not built yet; the partitions they are of; whether more may be
    due now."""
    heads = [(head, p) for p, w in wheels.items() if (head := w.head) is not None]
    heads = [(head, p) for head, p in heads if head[0] <= now]
    heapq.heapify(heads)
    by_id: dict[str, DueRow] = {}
    took: set[int] = set()
    while heads and len(by_id) < limit:
        _, p = heapq.heappop(heads)
        wheel = wheels[p]
        row = wheel.pop_due(now)
        assert row is not None  # its head was due
        by_id[row.id] = row  # a row offered again: the later offer is the newer row
        took.add(p)
        if (head := wheel.head) is not None and head[0] <= now:
            heapq.heappush(heads, (head, p))
    more = any(w.more_due(now, took=p in took) for p, w in wheels.items())
    return list(by_id.values()), took, more


def built_apart(rows: list[DueRow]) -> tuple[list[Timer], dict[int, StoreError]]:
    """Each row's Timer, in order (`DueRow.built`); when the store cannot read one (a
    corrupt row: `StoreError`), none of its partition's: the Timers, and the fault of each
    partition whose row failed."""
    try:
        return DueRow.built(rows), {}
    except StoreError:
        pass
    faults: dict[int, StoreError] = {}
    for r in rows:
        if r.partition not in faults:
            try:
                r.timer()  # built once: kept by the row
            except StoreError as exc:
                faults[r.partition] = exc
    return [r.timer() for r in rows if r.partition not in faults], faults
