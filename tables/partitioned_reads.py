"""The reads both backends share (`PartitionedReads`, the base of
`tables.partitioned.PartitionedStore`): the rows and index entries a backend supplies,
and the TimerStore's reads over them: due, due_after, find, parked, timers_of,
owner_timers and census."""

from __future__ import annotations

import asyncio
from abc import abstractmethod
from collections.abc import Callable, Iterator
from typing import Final

from tables.bounds import MAX_INT64
from tables.census import TimerCensus, tally
from tables.keys import owner_prefix, row_key
from tables.live_rows import LiveRows
from tables.owner_pick import OwnerPick, OwnerTimers
from tables.refs import AggregateRef
from tables.served import Found, ServedPartitions
from tables.store import DuePosition, DueRow
from tables.timer import ACTIVE, Timer, TimerStatus
from tables.writes import Write

__all__ = ["OWNER_CHUNK", "PartitionedReads"]

OWNER_CHUNK: Final = 250
"""Rows of an owner a read of them all (`owner_timers`, `_know_live`) decodes in one turn
of the event loop, at most (~25 µs a row on RocksDB, two cores loaded: ~6 ms)."""


class PartitionedReads(ServedPartitions):
    """What both backends share to read: the reads a backend supplies, and the
    TimerStore's reads over them (the write path: `tables.partitioned`)."""

    # --- what a backend supplies ------------------------------------------------------

    @abstractmethod
    def _load(self, partition: int, row: bytes) -> Timer | None: ...

    def _load_many(self, partition: int, rows: list[bytes]) -> list[Timer | None]:
        """`_load` of each of `rows` (a backend may read them in one call)."""
        return [self._load(partition, row) for row in rows]

    def _load_as_loaded(self, partition: int, row: bytes, loaded: Timer) -> Timer | None:
        """`_load` for a settle: may answer None when the row cannot be as `loaded`."""
        return self._load(partition, row)

    def _load_all_as_loaded(
        self, partition: int, rows: list[bytes], loaded: list[Timer]
    ) -> list[Timer | None]:
        """`_load_as_loaded` of each of `rows` (a backend may read them in one call)."""
        return [self._load_as_loaded(partition, r, t) for r, t in zip(rows, loaded, strict=True)]

    @abstractmethod
    def _owner_rows(self, partition: int, prefix: bytes) -> Iterator[tuple[bytes, Timer]]:
        """The rows of partition whose key starts with `prefix`, in row-key order."""

    @abstractmethod
    def _owner_chunk(
        self, partition: int, prefix: bytes, after: bytes | None, count: int
    ) -> list[tuple[bytes, Timer]]:
        """Up to `count` of `_owner_rows`, those whose row key is after `after` (None:
        from the first): read through in one call (a DB iterator held across an await
        would hold the DB open past a revoke)."""

    def _live_rows(self, partition: int, prefix: bytes) -> list[Found]:
        """The live rows (`ACTIVE`) of the owner of `prefix` in `partition`: those known
        (`tables.live_rows`), else all its rows read and the live ones known from then.
        Synchronous: no write lands between the read and what is known of it."""
        live = self._live.get(partition)
        known = None if live is None else live.rows_of(prefix)
        if known is not None:
            rows = sorted(known)
            held = zip(rows, self._load_many(partition, rows), strict=True)
            loaded = [(r, t) for r, t in held if t is not None]
        else:
            loaded = list(self._owner_rows(partition, prefix))
        found = [(partition, r, t) for r, t in loaded if t.status in ACTIVE]
        if known is None:
            self._live.setdefault(partition, LiveRows()).know(prefix, [f[1] for f in found])
        return found

    async def _know_live(self, prefix: bytes, only: tuple[int, int] | None) -> None:
        """Before a deletion of the owner of `prefix`: its live rows known in each partition
        searched (`only`: a handle's) where they are not, so that the deletion's own
        searches (`_live_rows`) read those alone. An owner of fewer than `OWNER_CHUNK`
        rows in a partition is read in one call; one of more (20,000 were 0.46-0.74 s
        read in one turn on RocksDB) a chunk at a time, the loop given a turn between
        two, under the partition's write lock: no write of it lands in between, nor a
        restore, a revoke or a close (a partition it keeps rows in, which the deletion
        locks too). An owner of more live rows than `tables.live_rows` keeps is read
        whole by the deletion's searches, as before."""
        for partition in self._searched(only):
            if not self._unknown(partition, prefix, only):
                continue
            rows = self._owner_chunk(partition, prefix, None, OWNER_CHUNK)
            if len(rows) < OWNER_CHUNK:  # all its rows, read in one call
                self._know(partition, prefix, rows)
                continue
            del rows
            await asyncio.sleep(0)
            async with self._writing([partition]):
                if not self._unknown(partition, prefix, only):
                    continue
                # From its first row again: a write may have landed since that read.
                live = self._live.setdefault(partition, LiveRows())
                found: list[bytes] = []
                after: bytes | None = None
                while True:
                    rows = self._owner_chunk(partition, prefix, after, OWNER_CHUNK)
                    found += [row for row, timer in rows if timer.status in ACTIVE]
                    if len(rows) < OWNER_CHUNK:
                        live.know(prefix, found)
                        break
                    if not live.keeps(len(found)):
                        break  # more than it keeps: the deletion reads it whole, as before
                    after = rows[-1][0]
                    del rows
                    await asyncio.sleep(0)

    def _unknown(self, partition: int, prefix: bytes, only: tuple[int, int] | None) -> bool:
        """Whether `_know_live` reads `partition` for the owner of `prefix`: still served
        (a handle's: `StoreClosed` else), and its live rows there not known."""
        self._check_open()
        if only is not None:
            self._check_serving(*only)
        elif partition not in self._served:
            return False  # let go meanwhile: searched no more
        live = self._live.get(partition)
        return live is None or live.rows_of(prefix) is None

    def _know(self, partition: int, prefix: bytes, rows: list[tuple[bytes, Timer]]) -> None:
        """The live rows of the owner of `prefix` in `partition` are those of `rows`, all it
        keeps there, read just now."""
        live = [row for row, timer in rows if timer.status in ACTIVE]
        self._live.setdefault(partition, LiveRows()).know(prefix, live)

    def _live_left(self, prefix: bytes, held: list[Found], cancelled: list[Write]) -> None:
        """Once `cancelled` of the live rows `held` of the owner of `prefix` are written,
        under the locks of their partitions still: the rest are its live rows there (an
        owner of more than `tables.live_rows.ROWS_LIMIT` read whole again, else)."""
        gone = {(w.partition, w.row) for w in cancelled}
        for partition in sorted({p for p, _, _ in held}):
            left = [r for p, r, _ in held if p == partition and (p, r) not in gone]
            self._live.setdefault(partition, LiveRows()).know(prefix, left)

    @abstractmethod
    def _expired(self, partition: int, until: int, limit: int) -> list[tuple[bytes, Timer]]:
        """Up to `limit` FIRED and CANCELLED rows of partition finished at or before
        `until`, oldest first: `(row key, row)`."""

    @abstractmethod
    def _due(
        self, partitions: list[int], until: int, limit: int, after: DuePosition | None = None
    ) -> list[Timer]:
        """Up to `limit` due rows of `partitions` past the place `after` (checked), in order."""

    @abstractmethod
    def _due_rows(self, partitions: list[int], until: int, limit: int) -> list[DueRow]:
        """`_due`'s rows, unbuilt (`DueRow`)."""

    @abstractmethod
    def _firing(self, partition: int, count: int) -> list[Timer]:
        """The first `count` FIRING rows of partition's due index, in due order."""

    @abstractmethod
    def _parked(self, partitions: list[int], target: AggregateRef) -> list[Timer]: ...

    @abstractmethod
    def _due_entries(self, partition: int, start: int) -> Iterator[tuple[int, str]]:
        """The due index of partition from `start` on: `(due_at, status)`, in due order."""

    @abstractmethod
    def _parked_entries(self, partition: int) -> Iterator[Callable[[], Timer]]:
        """The parked index of partition in order: a loader of each entry's row."""

    @abstractmethod
    def _held_count(self, partition: int) -> int:
        """How many PAUSED rows partition holds (its held entries)."""

    @abstractmethod
    def status_counts(self, partition: int) -> dict[TimerStatus, int]:
        """`tables.partitioned.PartitionedStore`'s, kept with each write."""

    # --- the TimerStore's reads -------------------------------------------------------

    async def due(self, partitions: set[int], until: int, limit: int) -> list[Timer]:
        wanted = self._due_partitions(partitions, until, limit)
        return self._due(wanted, until, limit) if wanted else []

    async def due_after(
        self, partitions: set[int], until: int, limit: int, after: DuePosition | None
    ) -> list[Timer]:
        wanted = self._due_partitions(partitions, until, limit)
        _check_place(after)
        return self._due(wanted, until, limit, after) if wanted else []

    async def due_rows(self, partitions: set[int], until: int, limit: int) -> list[DueRow]:
        wanted = self._due_partitions(partitions, until, limit)
        return self._due_rows(wanted, until, limit) if wanted else []

    async def firing(self, partitions: set[int], limit: int) -> list[Timer]:
        """Up to `limit` FIRING rows of `partitions`, whatever their claims' deadlines,
        earliest first, ties by id. A partition's due index is read only as far as its last
        FIRING row: as many as it counts (`status_counts`), none when it counts none."""
        self._check_limit(limit)
        found: list[Timer] = []
        for partition in self._checked_served(partitions):
            # Synchronous, the count and the scan: no write lands between them.
            count = min(self.status_counts(partition)[TimerStatus.FIRING], limit)
            if count:
                found += self._firing(partition, count)
        found.sort(key=lambda t: (t.due_at, t.id))
        return found[:limit]

    def _due_partitions(self, partitions: set[int], until: int, limit: int) -> list[int]:
        """The partitions a `due()` reads, its arguments checked; none when nothing is due."""
        self._check_limit(limit)
        if isinstance(until, bool) or not isinstance(until, int):
            raise ValueError(f"until must be epoch milliseconds (int), not {until!r}")
        wanted = self._checked_served(partitions)
        return [] if until < 0 else wanted

    def _check_limit(self, limit: int) -> None:
        """The store open and `limit` a count of rows to read (`due`, `firing`)."""
        self._check_open()
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be an int of at least 1, not {limit!r}")

    def _checked_served(self, partitions: set[int]) -> list[int]:
        """`partitions` in order, each one this store serves (else `_check_served` raises)."""
        wanted = sorted(partitions)
        for partition in wanted:
            self._check_served(partition)
        return wanted

    def _as_loaded(self, partition: int, loaded: list[Timer]) -> list[Timer | None]:
        """Each of `loaded` (rows of `partition` as a read gave them) as the partition
        holds it now, or None where it cannot be as loaded: what a settle compares."""
        rows = [row_key(t.owner, t.key) for t in loaded]
        return self._load_all_as_loaded(partition, rows, loaded)

    async def find(self, owner: AggregateRef, key: str) -> Timer | None:
        self._check_open()
        found = self._find(row_key(owner, key), None)
        return None if found is None else found[2]

    def _find(self, row: bytes, only: tuple[int, int] | None) -> tuple[int, bytes, Timer] | None:
        for partition in self._searched(only):
            timer = self._load(partition, row)
            if timer is not None:
                return partition, row, timer
        return None

    async def parked(self, target: AggregateRef) -> list[Timer]:
        self._check_open()
        return self._parked(self._served_sorted(), target)

    async def timers_of(self, owner: AggregateRef) -> list[Timer]:
        self._check_open()
        prefix = owner_prefix(owner)
        return [
            timer
            for partition in self._served_sorted()
            for _, timer in self._owner_rows(partition, prefix)
        ]

    async def owner_timers(
        self, owner: AggregateRef, *, limit: int, scan_limit: int
    ) -> OwnerTimers:
        self._check_open()
        for name, value in (("limit", limit), ("scan_limit", scan_limit)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int of at least 1, not {value!r}")
        prefix = owner_prefix(owner)
        pick = OwnerPick(limit)
        read = 0
        served = [(p, self._servings[p]) for p in self._served_sorted()]
        for partition, serving in served:
            after: bytes | None = None
            while True:
                # Its turn given back after each chunk: the partition may be let go since.
                self._check_open()
                self._check_serving(partition, serving)
                # One more than it may read: whether the owner keeps more.
                count = min(OWNER_CHUNK, scan_limit + 1 - read)
                rows = self._owner_chunk(partition, prefix, after, count)
                for _, timer in rows:
                    if read == scan_limit:  # the scan stops there: the owner keeps more
                        return pick.result(complete=False)
                    read += 1
                    pick.add(timer)
                if len(rows) < count:
                    break
                after = rows[-1][0]
                del rows
                await asyncio.sleep(0)
        return pick.result()

    async def census(
        self, partition: int, now: int, *, limit: int = 100_000, parked_limit: int = 100
    ) -> TimerCensus:
        self._check_open()
        for name, value, least in (("limit", limit, 1), ("parked_limit", parked_limit, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an int of at least {least}, not {value!r}")
        if isinstance(now, bool) or not isinstance(now, int) or now < 0:
            raise ValueError(f"now must be epoch milliseconds (int), not {now!r}")
        self._check_served(partition)
        return tally(
            partition,
            now,
            limit,
            parked_limit,
            lambda start: self._due_entries(partition, start),
            self._parked_entries(partition),
        )


def _check_place(after: DuePosition | None) -> None:
    """`ValueError` unless `after` is a place in a due index (`DuePosition`), or None."""
    if after is None:
        return
    try:
        due_at, id, row = after
        if not (
            isinstance(due_at, int)
            and not isinstance(due_at, bool)
            and 0 <= due_at <= MAX_INT64
            and isinstance(id, str)
            and isinstance(row, bytes)
        ):
            raise TypeError
        id.encode()  # as RocksDB's key holds it: a lone surrogate has no UTF-8
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"after must be a place (due_at, id, row key) of a due index, not {after!r}"
        ) from exc
