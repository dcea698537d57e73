"""The partitions a store serves and the checks every call makes: assign, revoke, drop,
close and restore (`ServedPartitions`, the base of `tables.partitioned.PartitionedStore`)."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

from tables.exceptions import StoreClosed
from tables.store import UnreadableRow
from tables.timer import TimerStatus

__all__ = ["ServedPartitions"]


class ServedPartitions(ABC):
    """Which partitions a store serves, its lock and its open or closed state.

    Writes are serialised by one lock (a write awaits its sink between deciding and
    applying); reads are not. A backend supplies the per-partition primitives.
    """

    def __init__(self, partitions: int) -> None:
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise ValueError(f"partitions must be a positive int, not {partitions!r}")
        self._partitions = partitions
        self._served: set[int] = set(range(partitions))
        self._closed = False
        self._lock = asyncio.Lock()
        # Per partition, its active rows by status (`status_counts`); absent: not counted
        # since it was opened or restored (counted whole when next asked).
        self._counts: dict[int, dict[TimerStatus, int]] = {}

    # --- what a backend supplies ------------------------------------------------------

    @abstractmethod
    def _restore(
        self, partition: int, records: Iterable[tuple[int, bytes, bytes | None]]
    ) -> list[UnreadableRow]: ...

    @abstractmethod
    def _offset(self, partition: int) -> int | None: ...

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

    def _served_sorted(self) -> list[int]:
        return sorted(self._served)

    @asynccontextmanager
    async def _writing(self) -> AsyncIterator[None]:
        self._check_open()
        async with self._lock:
            self._check_open()
            yield

    # --- restore and partitions -------------------------------------------------------

    async def apply_changelog(
        self, partition: int, records: Iterable[tuple[int, bytes, bytes | None]]
    ) -> list[UnreadableRow]:
        self._check_open()
        self._check_served(partition)
        async with self._writing():
            self._check_served(partition)
            self._counts.pop(partition, None)
            return self._restore(partition, records)

    def changelog_offset(self, partition: int) -> int | None:
        self._check_open()
        self._check_served(partition)
        return self._offset(partition)

    async def assign(self, partitions: Iterable[int]) -> None:
        self._check_open()
        wanted = sorted(set(partitions))
        for partition in wanted:
            self._check_partition(partition)
        async with self._writing():
            for partition in wanted:
                if partition not in self._served:
                    self._counts.pop(partition, None)
                    self._open_partition(partition)
                    self._served.add(partition)

    async def revoke(self, partitions: Iterable[int]) -> None:
        self._check_open()
        wanted = sorted(set(partitions))
        for partition in wanted:
            self._check_partition(partition)
        async with self._writing():
            for partition in wanted:
                if partition in self._served:
                    self._served.discard(partition)
                    self._counts.pop(partition, None)
                    self._close_partition(partition)

    async def drop(self, partition: int) -> None:
        self._check_open()
        self._check_partition(partition)
        async with self._writing():
            self._counts.pop(partition, None)
            self._drop_partition(partition, partition in self._served)

    async def close(self) -> None:
        if self._closed:
            return
        async with self._lock:
            if self._closed:
                return
            self._closed = True
            self._close()
