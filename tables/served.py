"""The partitions a store serves, their write locks and the checks every call makes:
assign, revoke, drop, close and restore (`ServedPartitions`, the base of
`tables.partitioned_reads.PartitionedReads` and so of `tables.partitioned.PartitionedStore`)."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AsyncExitStack, asynccontextmanager

from tables.exceptions import StoreClosed
from tables.live_rows import LiveRows
from tables.owners import TableOwners
from tables.store import UnreadableRow
from tables.timer import Timer, TimerStatus
from tables.tombstones import CancelMark

__all__ = ["Found", "ServedPartitions"]

Found = tuple[int, bytes, Timer]
"""A row found: its partition, its row key and the row."""


class ServedPartitions(ABC):
    """Which partitions a store serves, their write locks and its open or closed state.

    Each partition has a write lock of its own (a write awaits its sink, or a restore's
    flush, between deciding and applying): a write takes the locks of the partitions it
    writes, in partition order (two writes over several never wait on each other in a
    circle), so a write of one partition never waits for another's. Reads take none.
    `close` takes them all. A backend supplies the per-partition primitives.
    """

    def __init__(self, partitions: int, owner_type: tuple[str, str] | None = None) -> None:
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise ValueError(f"partitions must be a positive int, not {partitions!r}")
        self._partitions = partitions
        # Whose rows a restore takes (`_restore`): owners of the type keyed to the partition.
        self._owners = None if owner_type is None else TableOwners(*owner_type, partitions)
        self._served: set[int] = set(range(partitions))
        self._closed = False
        self._locks = [asyncio.Lock() for _ in range(partitions)]
        # Per partition, how many times it stopped being served or was dropped: a
        # `PartitionHandle` is bound to one value, and refuses once it moved on.
        self._servings = [0] * partitions
        # Per partition, its active rows by status (`status_counts`); absent: not counted
        # since it was opened or restored (counted whole when next asked).
        self._counts: dict[int, dict[TimerStatus, int]] = {}
        # Per partition, the live rows of owners read whole lately (`tables.live_rows`):
        # kept by every local write, forgotten with the counts.
        self._live: dict[int, LiveRows] = {}

    # --- what a backend supplies ------------------------------------------------------

    @abstractmethod
    def _restore(
        self, partition: int, records: Iterable[tuple[int, bytes, bytes | None]]
    ) -> list[UnreadableRow]: ...

    @abstractmethod
    async def _end_restore(self, partition: int) -> None:
        """Once a restore of `partition` is over, under its write lock (`end_restore`)."""

    @abstractmethod
    def _offset(self, partition: int) -> int | None: ...

    @abstractmethod
    def _set_offset(self, partition: int, offset: int) -> None:
        """Records `offset` as the last changelog record `partition` reflects."""

    @abstractmethod
    def _open_partition(self, partition: int) -> None: ...

    @abstractmethod
    def _close_partition(self, partition: int) -> None: ...

    @abstractmethod
    def _drop_partition(self, partition: int, served: bool) -> None: ...

    @abstractmethod
    def _close(self) -> None: ...

    # --- checks -----------------------------------------------------------------------

    @property
    def partitions(self) -> int:
        return self._partitions

    @property
    def assigned(self) -> frozenset[int]:
        self._check_open()
        return frozenset(self._served)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed("the timer store is closed")

    def _check_partition(self, partition: int) -> None:
        if (
            isinstance(partition, bool)
            or not isinstance(partition, int)
            or not 0 <= partition < self._partitions
        ):
            raise ValueError(
                f"partition {partition!r} is out of range: this store has partitions "
                f"0..{self._partitions - 1}"
            )

    def _check_served(self, partition: int) -> None:
        self._check_partition(partition)
        if partition not in self._served:
            raise StoreClosed(f"partition {partition} is not assigned to this store (revoked)")

    def _check_serving(self, partition: int, serving: int | None) -> None:
        """`_check_served`, and when `serving` is given (a handle's write), that partition
        was neither let go nor dropped since the handle was made."""
        self._check_served(partition)
        if serving is not None and self._servings[partition] != serving:
            raise StoreClosed(
                f"partition {partition} was revoked or dropped since its handle was made"
            )

    def _forget_counts(self, partition: int) -> None:
        """Forgets what is kept of `partition`'s rows beside them (its rows restored,
        opened, closed or dropped): counted, or read, again when next asked."""
        self._counts.pop(partition, None)
        self._live.pop(partition, None)

    def _served_sorted(self) -> list[int]:
        return sorted(self._served)

    @asynccontextmanager
    async def _writing(self, partitions: Iterable[int]) -> AsyncIterator[None]:
        """Holds the write locks of `partitions` (in range: the caller checked), taken in
        partition order; the store open before and after waiting for them."""
        self._check_open()
        order = sorted(set(partitions))
        if len(order) == 1:  # most writes: one lock, without a stack's cost
            async with self._locks[order[0]]:
                self._check_open()
                yield
            return
        async with AsyncExitStack() as held:
            for partition in order:
                await held.enter_async_context(self._locks[partition])
            self._check_open()
            yield

    @asynccontextmanager
    async def _writing_found(
        self,
        search: Callable[[], list[Found]],
        only: tuple[int, int] | None,
        also: int | None = None,
    ) -> AsyncIterator[list[Found]]:
        """The rows `search` finds (an owner's), under the write locks of the partitions
        they are in (and of `also`, where the caller may write a row of its own): looked
        for without a lock, then again under the locks, the locks of a partition found in
        since taken too, until none is found outside those held (at most P rounds: the
        locks held only grow). Rows found in no partition: looked for again under the locks
        of every partition searched."""
        # A row found nowhere may be a put still waiting in its sink, under its partition's
        # lock: then every partition searched is locked, so that the look under the locks
        # waits for it (a cancel must never miss the put before it).
        wanted: set[int] = set() if only is None else {only[0]}
        if also is not None:
            wanted.add(also)
        while True:
            self._check_open()
            if only is not None:
                self._check_serving(*only)
            found_in = {found[0] for found in search()}
            wanted |= found_in or set(self._searched(only))
            async with self._writing(wanted):
                if only is not None:
                    self._check_serving(*only)
                if also is not None:
                    self._check_served(also)  # revoked meanwhile: written nowhere
                rows = search()
                found_in = {found[0] for found in rows}
                # No await from this look to the caller's write: it writes what it found.
                if found_in <= wanted:
                    yield rows
                    return
                wanted |= found_in  # the locks held only grow: at most P rounds

    def _marked(self, mark: CancelMark | None, only: tuple[int, int] | None) -> int | None:
        """The partition a cancel's `mark` may write its row in, served (as a handle's
        writes, the handle's own alone); None without a mark."""
        if mark is None:
            return None
        if only is not None and mark.partition != only[0]:
            raise ValueError(
                f"a cancel of partition {mark.partition} given to partition {only[0]}'s handle"
            )
        self._check_serving(mark.partition, None if only is None else only[1])
        return mark.partition

    def _searched(self, only: tuple[int, int] | None) -> list[int]:
        """Where an owner's rows are looked for: every partition served, or a handle's
        `(partition, serving)` alone."""
        return self._served_sorted() if only is None else [only[0]]

    # --- restore and partitions -------------------------------------------------------

    async def apply_changelog(
        self, partition: int, records: Iterable[tuple[int, bytes, bytes | None]]
    ) -> list[UnreadableRow]:
        return await self._apply_changelog(partition, records, None)

    async def _apply_changelog(
        self,
        partition: int,
        records: Iterable[tuple[int, bytes, bytes | None]],
        serving: int | None,
    ) -> list[UnreadableRow]:
        self._check_open()
        self._check_serving(partition, serving)
        async with self._writing([partition]):
            self._check_serving(partition, serving)
            self._forget_counts(partition)
            return self._restore(partition, records)

    async def end_restore(self, partition: int) -> None:
        self._check_open()
        self._check_served(partition)
        async with self._writing([partition]):
            await self._end_restore(partition)

    def changelog_offset(self, partition: int) -> int | None:
        self._check_open()
        self._check_served(partition)
        return self._offset(partition)

    async def assign(self, partitions: Iterable[int]) -> None:
        self._check_open()
        wanted = sorted(set(partitions))
        for partition in wanted:
            self._check_partition(partition)
        async with self._writing(wanted):
            for partition in wanted:
                if partition not in self._served:
                    self._forget_counts(partition)
                    self._open_partition(partition)
                    self._served.add(partition)

    async def revoke(self, partitions: Iterable[int]) -> None:
        self._check_open()
        wanted = sorted(set(partitions))
        for partition in wanted:
            self._check_partition(partition)
        async with self._writing(wanted):
            for partition in wanted:
                if partition in self._served:
                    self._served.discard(partition)
                    self._servings[partition] += 1
                    self._forget_counts(partition)
                    self._close_partition(partition)

    async def drop(self, partition: int) -> None:
        self._check_open()
        self._check_partition(partition)
        async with self._writing([partition]):
            self._forget_counts(partition)
            self._servings[partition] += 1
            self._drop_partition(partition, partition in self._served)

    async def close(self) -> None:
        if self._closed:
            return
        async with AsyncExitStack() as held:
            for lock in self._locks:  # in partition order, as every write takes them
                await held.enter_async_context(lock)
            if self._closed:
                return
            self._closed = True
            self._close()
