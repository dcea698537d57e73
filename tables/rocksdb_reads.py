"""The reads of the RocksDB TimerStore (`RocksDBReads`, the base of
`tables.rocksdb_store.RocksDBTimerStore`): rows, whose values may live in their index
entries, and the scans of the due and finished indexes, each from a low-water mark of its
partition (`_low`, `_finished_low`) above the tombstones the firing loop and the sweep
leave at the indexes' fronts. A read RocksDB fails (rocksdict's plain `Exception`: a
checksum mismatch, an I/O error) raises `StoreError` of its partition, and so does a scan
that a block it cannot read ended (`tables.rocksdb_io.check_ended`)."""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Callable, Iterator
from functools import partial
from itertools import islice
from operator import itemgetter
from typing import Any, cast

import orjson
from rocksdict import Rdict, ReadOptions

from tables.exceptions import StoreError
from tables.keys import (
    DUE,
    FINISHED,
    HELD,
    OFFSET_KEY,
    PARKED,
    ROW,
    due_key,
    due_key_prefix,
    due_upper_bound,
    finished_upper_bound,
    parked_prefix,
    row_key,
)
from tables.partitioned import PartitionedStore
from tables.recent_rows import load_at
from tables.refs import AggregateRef
from tables.rocksdb_io import check_ended, gc_paused, prefix_end, read_fault, rocksdb_fault, scan
from tables.rocksdb_restore import INDEXES as _INDEXES
from tables.rowload import load_timer, load_timers
from tables.store import DuePosition, DueRow
from tables.timer import Timer, TimerStatus

__all__ = ["RocksDBReads"]

_DUE_STATUSES = frozenset({TimerStatus.PENDING, TimerStatus.FIRING})
_FIRING = TimerStatus.FIRING.value
_DUE_VALUES = frozenset(s.value for s in _DUE_STATUSES)


def _status(key: bytes, value: bytes, partition: int) -> str:
    """A due entry's row's status, read alone (orjson without the model is several times
    cheaper); `StoreError` of `partition` when the entry holds no PENDING or FIRING row (a
    corrupt one: a `KeyError` out of the scan failed its caller, not that partition alone)."""
    try:
        status = orjson.loads(value)["status"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        status = None
    if status in _DUE_VALUES:
        return cast(str, status)
    timer = load_timer(value, key, partition)  # its fault named, when it is no Timer
    raise StoreError(
        f"the due entry {key!r} of partition {partition} holds a {timer.status.value} row",
        partition=partition,
    )


_KEY = itemgetter(0)
"""A due entry's key: sorting by it alone compares bytes, not tuples (half the time)."""


class RocksDBReads(PartitionedStore):
    """The reads of `RocksDBTimerStore`, over the partitions' DBs it opens."""

    _dbs: dict[int, Rdict]
    """By partition, its DB (`RocksDBTimerStore._open_partition`)."""
    _low: list[bytes]
    """By partition, a key below which it has no due entry (`_found`)."""
    _finished_low: list[bytes]
    """By partition, a key below which it has no finished entry (`_expired`)."""

    def _db(self, partition: int) -> Rdict:
        return self._dbs[partition]

    def _get(self, partition: int, key: bytes) -> bytes | None:
        """`key`'s value in `partition`'s DB; `StoreError` of it if RocksDB fails the read
        (else the cycle reading would take it for its record's fault)."""
        db = self._dbs[partition]  # a KeyError as `_db`'s: outside the backend's faults
        try:
            value: bytes | None = db.get(key)  # annotated, not cast: no call a read
        except Exception as exc:
            if not rocksdb_fault(exc):
                raise
            raise read_fault(exc, partition) from exc
        return value

    # --- reads ------------------------------------------------------------------------

    def _value(self, partition: int, raw: bytes) -> bytes:
        """A row's JSON from its ``r`` entry: there, or in the index entry it points to."""
        if raw[:1] not in _INDEXES:
            return raw
        value = self._get(partition, raw)
        if value is None:
            raise StoreError(
                f"partition {partition} is corrupt: no index entry {raw!r}", partition=partition
            )
        return value

    def _load(self, partition: int, row: bytes) -> Timer | None:
        raw = self._get(partition, ROW + row)
        if raw is None:
            return None
        if raw[:1] in _INDEXES:  # at its index entry: settled next, from the same bytes
            return load_at(raw, self._value(partition, raw), partition, row)
        return load_timer(raw, row, partition)

    def _get_many(self, partition: int, keys: list[bytes]) -> list[bytes | None]:
        """`_get` of each of `keys`, in one call."""
        db = self._dbs[partition]
        if not keys:
            return []
        try:
            return cast(list[bytes | None], db.get(cast(Any, keys)))
        except Exception as exc:
            if not rocksdb_fault(exc):
                raise
            raise read_fault(exc, partition) from exc

    def _load_many(self, partition: int, rows: list[bytes]) -> list[Timer | None]:
        raws = self._get_many(partition, [ROW + r for r in rows])
        return [
            None if raw is None else load_timer(self._value(partition, raw), row, partition)
            for raw, row in zip(raws, rows, strict=True)
        ]

    def _load_all_as_loaded(
        self, partition: int, rows: list[bytes], loaded: list[Timer]
    ) -> list[Timer | None]:
        """`_load_as_loaded` of each, the due entries of all read in one call (a cycle
        checks its in-process timers still as loaded before it fires them, #20)."""
        found: list[Timer | None] = []
        due = [
            due_key(t.due_at, t.id, row)
            for row, t in zip(rows, loaded, strict=True)
            if t.status in _DUE_STATUSES
        ]
        at = iter(zip(due, self._get_many(partition, due), strict=True))
        for row, t in zip(rows, loaded, strict=True):
            if t.status not in _DUE_STATUSES:
                found.append(self._load(partition, row))
                continue
            key, value = next(at)
            found.append(None if value is None else load_at(key, value, partition))
        return found

    def _load_as_loaded(self, partition: int, row: bytes, loaded: Timer) -> Timer | None:
        """A PENDING or FIRING row held as `loaded` is at `loaded`'s due entry (its key is
        due_at, id and row key): one read there, where the firing loop's scan just was,
        instead of a random read of the row and then of its entry."""
        if loaded.status not in _DUE_STATUSES:
            return self._load(partition, row)
        key = due_key(loaded.due_at, loaded.id, row)
        value = self._get(partition, key)
        return None if value is None else load_at(key, value, partition)

    def _owner_rows(self, partition: int, prefix: bytes) -> Iterator[tuple[bytes, Timer]]:
        start = ROW + prefix
        # Whole: read through in one call (a cancel_all's rows, an owner's timers), a scan a
        # read error cut short raises, never an owner's timers left uncancelled.
        scanned = scan(self._db(partition), start, prefix_end(start), partition, whole=True)
        for key, raw in scanned:
            yield key[1:], load_timer(self._value(partition, raw), key, partition)

    def _owner_chunk(
        self, partition: int, prefix: bytes, after: bytes | None, count: int
    ) -> list[tuple[bytes, Timer]]:
        first = ROW + (prefix if after is None else after + b"\x00")
        # Whole: read through in this one call, a scan that ends short checked.
        scanned = scan(self._db(partition), first, prefix_end(ROW + prefix), partition, whole=True)
        try:
            got = list(islice(scanned, count))
        finally:
            scanned.close()  # its iterator dropped now, not with a traceback (`_found`)
        with gc_paused():
            return [
                (key[1:], load_timer(self._value(partition, raw), key, partition))
                for key, raw in got
            ]

    def _due(
        self, partitions: list[int], until: int, limit: int, after: DuePosition | None = None
    ) -> list[Timer]:
        # The first key past `after`'s (its row key's next: a key that extends it).
        start = None if after is None else due_key(*after) + b"\x00"
        found = self._found(partitions, until, limit, start)
        with gc_paused():
            return load_timers(found)

    def _due_rows(self, partitions: list[int], until: int, limit: int) -> list[DueRow]:
        rows: list[DueRow] = []
        append, unbuilt, from_bytes = rows.append, DueRow.unbuilt, int.from_bytes
        with gc_paused():
            for key, value, partition in self._found(partitions, until, limit):
                # `due_key_order` inlined: most ids hold no NUL, nothing to unescape.
                raw_id = key[9 : key.index(b"\x00\x00", 9)]
                if b"\x00" in raw_id:
                    raw_id = raw_id.replace(b"\x00\x01", b"\x00")
                append(unbuilt(from_bytes(key[1:9], "big"), raw_id.decode(), partition, value, key))
        return rows

    def _found(
        self, partitions: list[int], until: int, limit: int, start: bytes | None = None
    ) -> list[tuple[bytes, bytes, int]]:
        """The first `limit` due entries of `partitions` (from the key `start` on, when
        given), merged by key: `(key, value, partition)`.

        Each partition's entries are taken in chunks (`list(islice(..))` runs in C, where a
        merge of generators stepped each entry through three Python frames): all entries
        up to the least last key of the runs that may hold more are taken, so once
        `limit` of them are, they are the first `limit` of all; else the runs at that key
        give another chunk.

        The firing loop deletes entries from the front of the due index (each claim moves
        one to its deadline), and their tombstones stay until compaction: a scan from the
        index's first key would step over all of them on every call. So a partition's run
        starts at `_low[p]`, a key below which p has no due entry: lowered by every write
        of one, raised to the first entry each scan finds (or past `until` when it finds
        none). A key, not a due time: a burst's rows are all due at one instant, and a
        scan from that instant's first key would step over the tombstones of every row
        of it claimed so far, not only those of the last round's claims. A run from a
        `start` past `_low[p]` leaves it be: the entries between them were not read.

        A run that ends short of its chunk is checked (`check_ended`): rocksdict's items()
        end silently at a block RocksDB cannot read, and the rows past it would never
        fire. Full chunks, the bulk of a busy round, cost no check. The check is `whole`
        (a key past the run's end is a row it skipped, a read that failed once): the runs
        are read and checked in this one call, no write in between, and `_low` must never
        pass a row not read.

        On any error the runs are dropped before it leaves (`_runs`): a DB closes only once
        its iterators are gone, and a traceback that kept them (a firing round keeps its
        fault) would hold the DB open past a revoke, its retake's open refused.
        """
        options = ReadOptions()  # held to the end: the iterators read their bound from it
        options.set_iterate_upper_bound(due_upper_bound(until))
        runs: dict[int, Iterator[tuple[bytes, bytes]]] = {}
        try:
            return self._runs(partitions, until, limit, start, options, runs)
        except BaseException:
            runs.clear()
            raise
        finally:
            del options

    def _runs(
        self,
        partitions: list[int],
        until: int,
        limit: int,
        start: bytes | None,
        options: ReadOptions,
        runs: dict[int, Iterator[tuple[bytes, bytes]]],
    ) -> list[tuple[bytes, bytes, int]]:
        """`_found`'s merge, its partitions' iterators held in `runs` alone (no local of
        this frame holds one: `_found` clears them on an error)."""
        step = min(limit, limit // len(partitions) + limit // (4 * len(partitions)) + 8)
        found: list[tuple[bytes, bytes, int]] = []
        last: dict[int, bytes] = {}
        for partition in partitions:
            low = self._low[partition]
            first = low if start is None else max(low, start)
            runs[partition] = cast(
                Iterator[tuple[bytes, bytes]],
                self._db(partition).items(from_key=first, read_opt=options),
            )
            got = list(islice(runs[partition], step))
            if len(got) < step:
                del runs[partition]
                past = got[-1][0] + b"\x00" if got else first
                check_ended(self._db(partition), options, past, partition, whole=True)
            if first == low:  # read from the mark: no entry below what it found
                self._low[partition] = got[0][0] if got else max(low, due_upper_bound(until))
            if not got:
                continue
            found += [(key, value, partition) for key, value in got]
            if len(got) == step:
                last[partition] = got[-1][0]
        found.sort(key=_KEY)  # a key names its row: two partitions never hold the same one
        while runs:
            bound = min(last.values())
            if bisect_left(found, bound + b"\x00", key=_KEY) >= limit:
                break
            for partition in [p for p, key in last.items() if key == bound]:
                got = list(islice(runs[partition], step))
                found += [(key, value, partition) for key, value in got]
                if len(got) == step:
                    last[partition] = got[-1][0]
                else:
                    past = (got[-1][0] if got else last[partition]) + b"\x00"
                    del runs[partition], last[partition]
                    check_ended(self._db(partition), options, past, partition, whole=True)
            found.sort(key=_KEY)
        runs.clear()
        return found[:limit]

    def _lower(self, partition: int, index: bytes) -> None:
        """Keeps `_low` (`_finished_low`) below a due (finished) entry about to be written."""
        kind = index[:1]
        if kind == DUE:
            if index < self._low[partition]:
                self._low[partition] = index
        elif kind == FINISHED and index < self._finished_low[partition]:
            self._finished_low[partition] = index

    def _expired(self, partition: int, until: int, limit: int) -> list[tuple[bytes, Timer]]:
        """Like `_due`, from a low-water mark: each sweep deletes entries from the
        front of the finished index, and a scan from its first key would step over their
        tombstones every time. Read through here, no write in between: its scan's check is
        `whole` (`_finished_low` never passes an entry it skipped)."""
        if until < 0:
            return []
        low = self._finished_low[partition]
        upper = finished_upper_bound(until)
        found: list[tuple[bytes, Timer]] = []
        with gc_paused():
            for key, value in scan(self._db(partition), low, upper, partition, whole=True):
                if not found:
                    self._finished_low[partition] = key
                timer = load_timer(value, key, partition)
                found.append((row_key(timer.owner, timer.key), timer))
                if len(found) == limit:
                    return found
        if not found:
            self._finished_low[partition] = max(low, upper)
        return found

    def _parked(self, partitions: list[int], target: AggregateRef) -> list[Timer]:
        start = parked_prefix(target)
        upper = prefix_end(start)
        runs = [
            scan(self._db(partition), start, upper, partition, whole=True)
            for partition in partitions
        ]
        try:
            with gc_paused():
                return [load_timer(value, key) for key, value in heapq.merge(*runs)]
        finally:
            # Closed, their iterators dropped: the merge's frame, which a traceback keeps,
            # holds them (see `_found`).
            for run in runs:
                run.close()

    def _due_entries(self, partition: int, start: int) -> Iterator[tuple[int, str]]:
        # From the low-water mark at least: the tombstones below it are skipped.
        first = max(due_key_prefix(start), self._low[partition])
        for key, value in scan(self._db(partition), first, prefix_end(DUE), partition, whole=True):
            yield int.from_bytes(key[1:9], "big"), _status(key, value, partition)

    def _firing(self, partition: int, count: int) -> list[Timer]:
        found: list[Timer] = []
        # From the low-water mark, as `_due_entries`: the status alone of each entry passed.
        entries = scan(
            self._db(partition), self._low[partition], prefix_end(DUE), partition, whole=True
        )
        try:
            with gc_paused():
                for key, value in entries:
                    if _status(key, value, partition) == _FIRING:
                        found.append(load_timer(value, key, partition))
                        if len(found) == count:
                            break
        finally:
            entries.close()  # its iterator dropped now, not with a traceback (`_found`)
        return found

    def _parked_entries(self, partition: int) -> Iterator[Callable[[], Timer]]:
        parked = scan(self._db(partition), PARKED, prefix_end(PARKED), partition, whole=True)
        for key, value in parked:
            yield partial(load_timer, value, key)

    def _held_count(self, partition: int) -> int:
        return sum(
            1 for _ in scan(self._db(partition), HELD, prefix_end(HELD), partition, whole=True)
        )

    def _offset(self, partition: int) -> int | None:
        raw = self._get(partition, OFFSET_KEY)
        return None if raw is None else int.from_bytes(raw, "big", signed=True)
