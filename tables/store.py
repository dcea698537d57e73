"""The TimerStore: its protocol, the write path both backends share, and `open_timer_store`.

A store keeps the timers of one aggregate type in P partitions, each timer in its
owner's partition (`Timer.partition`). Every write decides its new rows (`tables.writes`),
hands them to the changelog sink (one call a sink: a partition's own when its handle
attached one, `PartitionHandle.attach`, else the store's), and only then writes them
locally, so the changelog is never behind the local rows. Restoring is `apply_changelog`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

from tables.census import TimerCensus
from tables.owner_pick import OwnerTimers
from tables.recent_rows import load_at
from tables.refs import AggregateRef
from tables.rocksdb_io import gc_paused
from tables.rowload import load_timer
from tables.timer import Timer, TimerChange, TimerStatus
from tables.tombstones import CancelMark

if TYPE_CHECKING:
    from tables.partition_handle import PartitionHandle

__all__ = [
    "ChangelogRecord",
    "ChangelogSink",
    "DuePosition",
    "DueRow",
    "TimerStore",
    "TimerWrites",
]

logger = logging.getLogger(__name__)


class ChangelogRecord(NamedTuple):
    """One row as the changelog carries it: key `row_key(owner, key)`, value the row's JSON;
    with the row the write replaced (None: none), which its transaction keeps until its
    commit lands: a failed commit's rows are written back to it (`PartitionHandle.roll_back`)."""

    partition: int
    key: bytes
    value: bytes | None
    before: Timer | None = None


DuePosition = tuple[int, str, bytes]
"""A place in a store's due index, `(due_at, id, row key)`: the order its entries sort in,
on both backends (a row key is `tables.keys.row_key(owner, key)`; `b""` is before all)."""


class DueRow:
    """One entry of `TimerStore.due_rows`: what orders it (`due_at`, `id`) and where it
    lives (`partition`), read from the due index's key; its Timer built on first ask.

    Building a Timer (decoding its JSON and models, ~5 µs) is most of a `due()` of 1,000
    rows; a caller that orders many rows and acts on few builds only those it acts on.
    """

    __slots__ = ("_key", "_raw", "_timer", "due_at", "id", "partition")

    def __init__(
        self, due_at: int, id: str, partition: int, *, raw: bytes = b"", timer: Timer | None = None
    ) -> None:
        if timer is None and not raw:
            raise ValueError("a DueRow needs its row's bytes or its Timer")
        self.due_at = due_at
        self.id = id
        self.partition = partition
        self._raw = raw
        self._timer = timer
        self._key = b""

    @staticmethod
    def unbuilt(due_at: int, id: str, partition: int, raw: bytes, key: bytes = b"") -> DueRow:
        """A row of a store's own due index, its bytes not empty (a store reads a thousand
        a `due_rows()`: this skips `__init__`'s keyword call and check, a third of it).
        `key`: its index entry's, where its Timer is kept once built (`recent_rows`)."""
        row = _new_row(DueRow)
        row.due_at, row.id, row.partition, row._raw, row._timer = due_at, id, partition, raw, None
        row._key = key
        return row

    @classmethod
    def of(cls, timer: Timer) -> DueRow:
        """A row already built (e.g. one just written)."""
        return cls(timer.due_at, timer.id, timer.partition, timer=timer)

    def timer(self) -> Timer:
        """The row as the store held it when it was read; built once."""
        if self._timer is None:
            if self._key:  # read again to fire it (`find`, a settle): built once (#20)
                self._timer = load_at(self._key, self._raw, self.partition, self)
            else:
                self._timer = load_timer(self._raw, self, self.partition)
            self._raw = b""
        return self._timer

    @staticmethod
    def built(rows: Iterable[DueRow]) -> list[Timer]:
        """Each row's Timer, built with the cyclic GC held off (`gc_paused`: the objects
        of a thousand Timers are acyclic, a collection among them is for nothing)."""
        with gc_paused():
            return [row.timer() for row in rows]

    def __repr__(self) -> str:
        return f"DueRow({self.due_at}, {self.id!r}, partition={self.partition})"


_new_row = object.__new__


class UnreadableRow(NamedTuple):
    """A changelog record a restore passed over: not a row of this partition's (another
    writer's, or of a format or bounds this version does not read)."""

    offset: int
    key: bytes
    value: bytes
    reason: str


def unreadable_reason(exc: Exception) -> str:
    """Why a changelog record is no row, in one line."""
    return str(exc).replace("\n", "; ")[:1000]


class ChangelogSink(Protocol):
    """Sends a write's changelog records; the store writes locally only once it returns."""

    async def __call__(self, records: list[ChangelogRecord]) -> None: ...


class TimerWrites(Protocol):
    """The writes the timers subscription makes (`app.timers.subscription.apply_all`), each
    as `TimerStore`'s of the same name: the whole store's, or one partition's alone
    (`PartitionHandle`, whose writes take that partition's lock alone), and `find`."""

    async def find(self, owner: AggregateRef, key: str) -> Timer | None: ...

    async def put(self, timer: Timer) -> bool: ...

    async def put_many(self, timers: Sequence[Timer]) -> list[Timer]: ...

    async def cancel(
        self, owner: AggregateRef, key: str, version: int, mark: CancelMark | None = None
    ) -> bool: ...

    async def pause(self, owner: AggregateRef, key: str, version: int) -> bool: ...

    async def resume(
        self, owner: AggregateRef, key: str, version: int, now: int
    ) -> Timer | None: ...

    async def cancel_all(
        self, owner: AggregateRef, version: int, mark: CancelMark | None = None
    ) -> int: ...


@runtime_checkable
class TimerStore(Protocol):
    """The timers of one aggregate type, partitioned as its log (see the seed, 000_…).

    A timer lives in `Timer.partition`, which must be its owner's partition (the same for
    all the owner's timers): the store trusts it, and finds an owner's rows by looking in
    each partition it serves. Calls that name a partition (put, settle, due, expire, census,
    apply_changelog, changelog_offset) raise `StoreClosed` for one this store does not
    serve (revoked); `find`, `cancel`, `cancel_all`, `pause`, `resume`, `parked` and
    `timers_of` look in the partitions it serves. After `close()` every call raises
    `StoreClosed`. Bad arguments raise `ValueError`. Writes of one partition are
    serialised (those of others go on meanwhile); each awaits the changelog sink before
    it writes, and a write of an owner's row waits for any write of that row under way.
    """

    @property
    def partitions(self) -> int:
        """P: the number of partitions."""
        ...

    @property
    def assigned(self) -> frozenset[int]:
        """The partitions this store serves now."""
        ...

    async def put(self, timer: Timer) -> bool:
        """Writes `timer`, PENDING, unless the store holds its owner's key at a later
        version, or holds this very timer (its id) in whatever status, or its owner's
        deletion mark at its version or later (`cancel_all`)."""
        ...

    async def put_many(self, timers: Sequence[Timer]) -> list[Timer]:
        """`put` of each of `timers` in turn, in one write; the rows it wrote."""
        ...

    async def cancel(
        self, owner: AggregateRef, key: str, version: int, mark: CancelMark | None = None
    ) -> bool:
        """Cancels `owner`'s timer under `key` when it is PENDING, FIRING or PARKED and
        held at `version` or earlier; the cancelled row keeps `version`. With `mark` (where
        and when the cancel was read), a key that holds no row is left a tombstone at
        `version`, and a CANCELLED row held at an earlier one takes `version`
        (`tables.tombstones.tombstone`), so that an older set read after it is passed over;
        the row it cancels or moves is finished no earlier than `mark.at`, its retention
        counted from then (`tables.writes.cancel_row`). Whether it wrote."""
        ...

    async def pause(self, owner: AggregateRef, key: str, version: int) -> bool:
        """Pauses `owner`'s timer under `key` when it is PENDING, FIRING or PARKED and held
        at `version` or earlier (`tables.writes.pause_row`): PAUSED, in no index the firing
        loop or an operator's retry reads, never due; whether it wrote."""
        ...

    async def resume(self, owner: AggregateRef, key: str, version: int, now: int) -> Timer | None:
        """Resumes `owner`'s PAUSED timer under `key` held at `version` or earlier, caught
        up at `now` by its rule (`tables.writes.resume_row`): the PENDING row it wrote (the
        PARKED one, for a timer PARKED when paused), or None when it wrote nothing."""
        ...

    async def cancel_all(
        self, owner: AggregateRef, version: int, mark: CancelMark | None = None
    ) -> int:
        """Cancels every PENDING, FIRING or PARKED timer of `owner` held at `version` or
        earlier; how many. With `mark`, the owner's deletion mark at `version` is written
        too (unless one as late is held: `tables.tombstones.deletion_mark`), a set of the
        owner at `version` or earlier is passed over from then on, whatever its key, and
        each row cancelled is finished no earlier than `mark.at` (`cancel`)."""
        ...

    async def expire(self, partition: int, now: int, retention: int, limit: int) -> int:
        """Deletes up to `limit` of `partition`'s FIRED and CANCELLED rows that finished
        `retention` ms or more before `now` (`tables.retention`), oldest first, each with a
        tombstone to the changelog sink; how many. Called again until it answers less than
        `limit`, it bounds the work a call does (the firing loop calls it once a round)."""
        ...

    async def due(self, partitions: set[int], until: int, limit: int) -> list[Timer]:
        """Up to `limit` timers of `partitions` PENDING and due at or before `until`, or
        FIRING with a claim that lapses by then; earliest due first, ties by id."""
        ...

    async def due_after(
        self, partitions: set[int], until: int, limit: int, after: DuePosition | None
    ) -> list[Timer]:
        """`due()`'s timers after the place `after` (None: from the first), in its order:
        a long run read a bounded page at a time, each from the last one's last timer
        (`DuePosition`). `ValueError` for a place that is none."""
        ...

    async def due_rows(self, partitions: set[int], until: int, limit: int) -> list[DueRow]:
        """`due()`'s rows, in its order, each built into its Timer only when asked
        (`DueRow.timer`): the same rows as `due()` would answer."""
        ...

    async def firing(self, partitions: set[int], limit: int) -> list[Timer]:
        """Up to `limit` FIRING timers of `partitions`, whatever their claims' deadlines
        (a claim written on a clock ahead of this one lapses far ahead), earliest first,
        ties by id: each partition's due index read only as far as its last FIRING row."""
        ...

    async def find(self, owner: AggregateRef, key: str) -> Timer | None:
        """The timer `owner` keeps under `key`, in whatever status, or None."""
        ...

    async def parked(self, target: AggregateRef) -> list[Timer]:
        """The PARKED timers whose target is `target`, earliest due first, ties by id."""
        ...

    async def timers_of(self, owner: AggregateRef) -> list[Timer]:
        """Every row `owner` keeps in the partitions served, in whatever status, by key."""
        ...

    async def owner_timers(
        self, owner: AggregateRef, *, limit: int, scan_limit: int
    ) -> OwnerTimers:
        """`timers_of` for a view (the operator page): at most `limit` of `owner`'s timers
        held, the live ones first (`tables.owner_pick`), of at most `scan_limit` rows
        read, and how many it read. An owner may keep any number of rows: they are read a
        chunk at a time, the event loop given a turn between two, and a partition let go
        meanwhile ends the read (`StoreClosed`)."""
        ...

    def status_counts(self, partition: int) -> dict[TimerStatus, int]:
        """How many PENDING, FIRING, PARKED and PAUSED timers `partition` holds, for metrics read
        on every scrape: counted from its indexes once (when first asked after the
        partition was opened, restored or dropped), then kept by every write, O(1) each."""
        ...

    async def census(
        self, partition: int, now: int, *, limit: int = 100_000, parked_limit: int = 100
    ) -> TimerCensus:
        """What `partition` holds, read-only (for the operator page): its PENDING, FIRING
        and PARKED timers counted (each count stops past `limit`), the earliest due times
        of its PENDING timers at or before `now` and after it, and its first
        `parked_limit` PARKED timers by target then due time."""
        ...

    async def settle(self, changes: list[TimerChange]) -> int:
        """Writes each change's `next` while the store holds its `loaded` as loaded; how
        many were written."""
        ...

    async def apply_changelog(
        self, partition: int, records: Iterable[tuple[int, bytes, bytes | None]]
    ) -> list[UnreadableRow]:
        """Restores `(offset, key, value)` records of `partition` as given, with their
        indexes and the last offset, in one local write; a record that is no row of the
        partition (given the store's `owner_type`, a row of an owner of another type or
        keyed elsewhere is none: `tables.owners`) is returned, and its key keeps the row
        it held before it (in the store, or from an earlier record of `records`), or none:
        an unreadable record erases nothing stored, so that another writer's garbage under
        a live timer's key never deletes the timer (the caller dead-letters the record and
        writes that row again after it, `app.timers.restore.unreadable_letters`)."""
        ...

    async def end_restore(self, partition: int) -> None:
        """After the last `apply_changelog` of a restore of `partition`: whatever the
        backend kept for restores alone ends here, not at the next read or write (RocksDB
        reopens a bulk restore's DB, its flush in a thread)."""
        ...

    def changelog_offset(self, partition: int) -> int | None:
        """The offset of the last changelog record applied to `partition`, or None."""
        ...

    async def applied_through(self, partition: int, offset: int) -> None:
        """Every changelog record of `partition` up to `offset` is in the store: its writer's
        transaction of them committed (their rows were written here before it). A copy
        closed clean is then read on from there, not from its last restore. Never moves
        the offset back."""
        ...

    async def assign(self, partitions: Iterable[int]) -> None:
        """Serves `partitions` too (opens their local data)."""
        ...

    async def revoke(self, partitions: Iterable[int]) -> None:
        """Stops serving `partitions`; their local data stays."""
        ...

    async def drop(self, partition: int) -> None:
        """Deletes `partition`'s local data and offset (before a full restore)."""
        ...

    def partition(self, partition: int) -> PartitionHandle:
        """`partition` alone, served now, for the task that took it (`PartitionHandle`):
        refused (`StoreClosed`) once it is revoked or dropped, even if served again."""
        ...

    async def close(self) -> None:
        """Closes the store; closing it again does nothing."""
        ...
