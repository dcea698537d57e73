"""A timer store's one partition, as the task that took it holds it (`PartitionHandle`,
from `PartitionedStore.partition`): its reads and writes reach that partition alone, and
it refuses (`StoreClosed`) once the partition is revoked or dropped, even if the store
serves it again since (a new take holds a new handle). Its holder may attach the
partition's own changelog sink (`attach`): the partition's rows go there, whichever call
wrote them, until it is revoked or dropped."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from tables.census import TimerCensus
from tables.keys import owner_prefix, row_key
from tables.refs import AggregateRef
from tables.store import ChangelogSink, DueRow, UnreadableRow
from tables.timer import Timer, TimerChange, TimerStatus
from tables.tombstones import CancelMark

if TYPE_CHECKING:
    from tables.partitioned import PartitionedStore

__all__ = ["PartitionHandle"]


class PartitionHandle:
    """Partition `partition` of `store`, bound to the serving it was made in: each call
    as the store's of the same name, for this partition only (a timer or change of
    another partition is a `ValueError`); its writes take this partition's write lock
    alone. `StoreClosed` once the partition was revoked or dropped, or the store closed."""

    __slots__ = ("_at", "_serving", "_store", "partition")

    def __init__(self, store: PartitionedStore, partition: int, serving: int) -> None:
        self._store = store
        self.partition = partition
        self._serving = serving
        self._at = (partition, serving)

    @property
    def serving(self) -> bool:
        """Whether the store still serves the partition in the serving this handle is of."""
        try:
            self._check()
        except Exception:
            return False
        return True

    def _check(self) -> None:
        self._store._check_open()
        self._store._check_serving(self.partition, self._serving)

    def _mine(self, partitions: Iterable[int], what: str) -> None:
        for partition in partitions:
            if partition != self.partition:
                raise ValueError(
                    f"{what} of partition {partition} given to partition {self.partition}'s handle"
                )

    def attach(self, sink: ChangelogSink) -> None:
        """The partition's rows, written through this handle or the whole store, go to
        `sink` rather than the store's sink, until the partition is revoked or dropped."""
        self._store._attach(self.partition, self._serving, sink)

    # --- writes: this partition's lock alone ------------------------------------------

    async def put(self, timer: Timer) -> bool:
        self._mine([timer.partition], "a timer")
        return await self._store._put(timer, self._serving)

    async def put_many(self, timers: Sequence[Timer]) -> list[Timer]:
        self._mine({timer.partition for timer in timers}, "a timer")
        self._check()
        return await self._store._put_many(timers, self._serving)

    async def settle(self, changes: list[TimerChange]) -> int:
        self._mine({change.loaded.partition for change in changes}, "a change")
        self._check()
        return await self._store._settle(changes, self._serving)

    async def expire(self, now: int, retention: int, limit: int) -> int:
        return await self._store._expire(self.partition, now, retention, limit, self._serving)

    async def cancel(
        self, owner: AggregateRef, key: str, version: int, mark: CancelMark | None = None
    ) -> bool:
        return await self._store._cancel(owner, key, version, self._at, mark)

    async def pause(self, owner: AggregateRef, key: str, version: int) -> bool:
        return await self._store._pause(owner, key, version, self._at)

    async def resume(self, owner: AggregateRef, key: str, version: int, now: int) -> Timer | None:
        return await self._store._resume(owner, key, version, now, self._at)

    async def cancel_all(
        self, owner: AggregateRef, version: int, mark: CancelMark | None = None
    ) -> int:
        return await self._store._cancel_all(owner, version, self._at, mark)

    async def drop(self, row: bytes) -> Timer | None:
        """Deletes the row under changelog key `row` whatever it holds (a tombstone to the
        sink, then locally): one its changelog takes no more, dead-lettered by the caller.
        The row deleted (None: none held)."""
        return await self._store._drop(self.partition, row, self._serving)

    async def apply_changelog(
        self, records: Iterable[tuple[int, bytes, bytes | None]]
    ) -> list[UnreadableRow]:
        return await self._store._apply_changelog(self.partition, records, self._serving)

    async def applied_through(self, offset: int) -> None:
        """The partition's changelog records up to `offset` committed (see the store's);
        nothing once rolled back."""
        await self._store._applied_through(self.partition, offset, self._serving)

    async def roll_back(self, befores: Mapping[bytes, Timer | None]) -> int:
        """Its commits failed: each row of `befores` (row key: the row it held before the
        first write whose commit did not land, None for none) is written back, locally, so
        the copy holds committed writes only and is read on from its changelog; how many.
        From then on the partition's writes through this serving are refused
        (`StoreClosed`) and no landing is recorded: its holder lets it go next.
        `StoreError` when it was rolled back already."""
        return await self._store._roll_back(self.partition, self._serving, befores)

    # --- reads: no lock ---------------------------------------------------------------

    def changelog_offset(self) -> int | None:
        self._check()
        return self._store.changelog_offset(self.partition)

    async def due(self, until: int, limit: int) -> list[Timer]:
        self._check()
        return await self._store.due({self.partition}, until, limit)

    async def due_rows(self, until: int, limit: int) -> list[DueRow]:
        self._check()
        return await self._store.due_rows({self.partition}, until, limit)

    async def firing(self, limit: int) -> list[Timer]:
        self._check()
        return await self._store.firing({self.partition}, limit)

    async def find(self, owner: AggregateRef, key: str) -> Timer | None:
        return self.held(row_key(owner, key))

    def as_loaded(self, loaded: Sequence[Timer]) -> list[Timer | None]:
        """Each of `loaded` (timers of this partition as a read gave them) as the partition
        holds its row now, or None where the row cannot be as loaded (gone, or moved from
        where it was due): compared with `Timer.same_as_loaded`, as a settle compares."""
        self._check()
        self._mine({t.partition for t in loaded}, "a row")
        return self._store._as_loaded(self.partition, list(loaded))

    def held(self, row: bytes) -> Timer | None:
        """The timer the partition holds under its changelog key `row` (None: no row)."""
        self._check()
        found = self._store._find(row, self._at)
        return None if found is None else found[2]

    async def parked(self, target: AggregateRef) -> list[Timer]:
        self._check()
        return self._store._parked([self.partition], target)

    async def timers_of(self, owner: AggregateRef) -> list[Timer]:
        self._check()
        return [timer for _, timer in self._store._owner_rows(self.partition, owner_prefix(owner))]

    def status_counts(self) -> dict[TimerStatus, int]:
        self._check()
        return self._store.status_counts(self.partition)

    async def census(
        self, now: int, *, limit: int = 100_000, parked_limit: int = 100
    ) -> TimerCensus:
        self._check()
        return await self._store.census(self.partition, now, limit=limit, parked_limit=parked_limit)

    def __repr__(self) -> str:
        return f"PartitionHandle(partition={self.partition}, serving={self.serving})"
