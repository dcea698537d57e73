"""Which store a firing's calls reach: its partition's own (`PartitionStore`, over the
handle its node's task took the partition with) or the runner's, the whole store's.

A node's task gives its partition's firing its own handle (`TimerRunner.start_partition`,
`store`): every call of that firing (its loads, claims, outcome writes, still-due checks,
sweep, take-over, operators' requests) goes through it, so a firing whose partition was
let go since its take writes nothing any more, even once the store serves the partition
again for a newer take (its handle refuses: `StoreClosed`, a fault of that partition
alone, `PartitionFiring.fault`). A firing given none (the seed's runner over a plain
store) uses the runner's store, as always. A call over several firings (the seed's round)
goes to each firing's own store for its partition's part (`store_of`).
"""

from __future__ import annotations

import heapq
from collections.abc import Awaitable, Callable, Iterable, Sequence, Set
from typing import Protocol, TypeVar

from app.timers.runner.ports import FiringStore
from tables.census import TimerCensus
from tables.exceptions import StoreError
from tables.refs import AggregateRef
from tables.store import DueRow
from tables.timer import Timer, TimerChange

__all__ = ["Owned", "PartitionCalls", "PartitionStore", "store_of"]

R = TypeVar("R")


class PartitionCalls(Protocol):
    """What the runner calls of one partition's handle (`tables.PartitionHandle`)."""

    @property
    def partition(self) -> int: ...

    async def due(self, until: int, limit: int) -> list[Timer]: ...

    async def due_rows(self, until: int, limit: int) -> list[DueRow]: ...

    async def firing(self, limit: int) -> list[Timer]: ...

    async def settle(self, changes: list[TimerChange]) -> int: ...

    async def find(self, owner: AggregateRef, key: str) -> Timer | None: ...

    def as_loaded(self, loaded: Sequence[Timer]) -> list[Timer | None]: ...

    async def parked(self, target: AggregateRef) -> list[Timer]: ...

    async def expire(self, now: int, retention: int, limit: int) -> int: ...

    async def census(
        self, now: int, *, limit: int = 100_000, parked_limit: int = 100
    ) -> TimerCensus: ...


class PartitionStore:
    """The `FiringStore` of `handle`'s partition alone: a call naming another partition
    is a `ValueError` (a bug); a `StoreError` of it names its partition (`partition`), so
    that the runner fails that partition's firing alone."""

    __slots__ = ("_handle", "partition")

    def __init__(self, handle: PartitionCalls) -> None:
        self._handle = handle
        self.partition = handle.partition

    def __repr__(self) -> str:
        return f"PartitionStore({self._handle!r})"

    async def _call(self, call: Awaitable[R]) -> R:
        try:
            return await call
        except StoreError as exc:
            self._name(exc)
            raise

    def _name(self, exc: StoreError) -> None:
        """Has `exc` name this partition unless it names one already."""
        if exc.partition is None:
            exc.partition = self.partition

    def _wanted(self, partitions: Set[int]) -> bool:
        if not partitions <= {self.partition}:
            raise ValueError(
                f"partitions {sorted(partitions)} asked of partition {self.partition}'s store"
            )
        return bool(partitions)

    async def due(self, partitions: Set[int], until: int, limit: int) -> list[Timer]:
        if not self._wanted(partitions):
            return []
        return await self._call(self._handle.due(until, limit))

    async def due_rows(self, partitions: Set[int], until: int, limit: int) -> list[DueRow]:
        if not self._wanted(partitions):
            return []
        return await self._call(self._handle.due_rows(until, limit))

    async def firing(self, partitions: Set[int], limit: int) -> list[Timer]:
        if not self._wanted(partitions):
            return []
        return await self._call(self._handle.firing(limit))

    async def settle(self, changes: list[TimerChange]) -> int:
        return await self._call(self._handle.settle(changes))

    async def find(self, owner: AggregateRef, key: str) -> Timer | None:
        return await self._call(self._handle.find(owner, key))

    def as_loaded(self, loaded: Sequence[Timer]) -> list[Timer | None]:
        """Each of `loaded`, timers of this partition, as its row is now, or None where it
        cannot be as loaded (`tables.PartitionHandle.as_loaded`): its rows read at once."""
        try:
            return self._handle.as_loaded(loaded)
        except StoreError as exc:
            self._name(exc)
            raise

    async def parked(self, target: AggregateRef) -> list[Timer]:
        return await self._call(self._handle.parked(target))

    async def expire(self, partition: int, now: int, retention: int, limit: int) -> int:
        self._wanted({partition})
        return await self._call(self._handle.expire(now, retention, limit))

    async def census(
        self, partition: int, now: int, *, limit: int = 100_000, parked_limit: int = 100
    ) -> TimerCensus:
        self._wanted({partition})
        return await self._call(self._handle.census(now, limit=limit, parked_limit=parked_limit))


class Owned(Protocol):
    """A firing, as `store_of` sees it (`PartitionFiring`)."""

    @property
    def partition(self) -> int: ...

    @property
    def store(self) -> FiringStore | None: ...


def store_of(
    firings: Iterable[Owned], default: FiringStore, *, others: bool = False
) -> FiringStore:
    """The store of a call over `firings`' partitions (`others`: and maybe partitions of
    no firing given, e.g. all the store serves): `default` when none has its own, the
    one's own when it is a call of that firing alone, else each part to its own."""
    given = list(firings)
    own = {f.partition: f.store for f in given if f.store is not None}
    if not own:
        return default
    if len(own) == 1 and not others:
        [(p, store)] = own.items()
        if all(f.partition == p for f in given):
            return store
    return _Routed(own, default)


class _Routed:
    """Each partition's part of a call to its own store (`own`), the rest to `default`."""

    def __init__(self, own: dict[int, FiringStore], default: FiringStore) -> None:
        self._own = own
        self._default = default

    def _split(self, partitions: Set[int]) -> list[tuple[FiringStore, set[int]]]:
        parts = [(self._own[p], {p}) for p in sorted(partitions) if p in self._own]
        if rest := {p for p in partitions if p not in self._own}:
            parts.append((self._default, rest))
        return parts

    async def _merged(
        self,
        call: Callable[[FiringStore, set[int]], Awaitable[list[R]]],
        partitions: Set[int],
        order: Callable[[R], tuple[int, str]],
        limit: int,
    ) -> list[R]:
        found = [await call(store, part) for store, part in self._split(partitions)]
        return list(heapq.merge(*found, key=order))[:limit]

    async def due(self, partitions: Set[int], until: int, limit: int) -> list[Timer]:
        return await self._merged(
            lambda s, ps: s.due(ps, until, limit), partitions, lambda t: (t.due_at, t.id), limit
        )

    async def due_rows(self, partitions: Set[int], until: int, limit: int) -> list[DueRow]:
        return await self._merged(
            lambda s, ps: s.due_rows(ps, until, limit),
            partitions,
            lambda r: (r.due_at, r.id),
            limit,
        )

    async def firing(self, partitions: Set[int], limit: int) -> list[Timer]:
        return await self._merged(
            lambda s, ps: s.firing(ps, limit), partitions, lambda t: (t.due_at, t.id), limit
        )

    async def settle(self, changes: list[TimerChange]) -> int:
        # One write a store, as RocksDB writes one batch a partition: a part that failed
        # leaves the parts before it written (`settling.apart` retries each apart).
        by_store: dict[int, tuple[FiringStore, list[TimerChange]]] = {}
        for change in changes:
            store = self._own.get(change.loaded.partition, self._default)
            by_store.setdefault(id(store), (store, []))[1].append(change)
        return sum([await store.settle(part) for store, part in by_store.values()])

    async def find(self, owner: AggregateRef, key: str) -> Timer | None:
        # Found where it is, then read again through its partition's own store (if it has
        # one): a partition let go refuses its own rows' lookups, never another's.
        row = await self._default.find(owner, key)
        if row is None or (own := self._own.get(row.partition)) is None:
            return row
        return await own.find(owner, key)

    async def parked(self, target: AggregateRef) -> list[Timer]:
        rows = [t for t in await self._default.parked(target) if t.partition not in self._own]
        for store in self._own.values():
            rows += await store.parked(target)
        return sorted(rows, key=lambda t: (t.due_at, t.id))

    async def expire(self, partition: int, now: int, retention: int, limit: int) -> int:
        store = self._own.get(partition, self._default)
        return await store.expire(partition, now, retention, limit)

    async def census(
        self, partition: int, now: int, *, limit: int = 100_000, parked_limit: int = 100
    ) -> TimerCensus:
        store = self._own.get(partition, self._default)
        return await store.census(partition, now, limit=limit, parked_limit=parked_limit)
