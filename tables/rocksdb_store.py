"""The TimerStore on RocksDB (rocksdict): one DB a partition, ``{dir}/p{partition}.db``.

Rows and their indexes share each partition's DB under one-byte key prefixes (see
`tables.keys`) rather than column families: one memtable a DB instead of one a family
(12 partitions x 3 families of write buffers would not fit a small box), and a write's
row and index entries go in one plain WriteBatch. An indexed row's value lives in its
due or parked index entry and its ``r`` entry points there (see `tables.keys`), so
``due()`` is one range scan a partition with no point reads, and a pending timer's bytes
are written once. rocksdict is imported here, in `tables.rocksdb_io` (options, scans) and in
`tables.rocksdb_restore` (the format marker, restore batches).
"""

from __future__ import annotations

import asyncio
import heapq
import os
import shutil
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from itertools import islice
from operator import itemgetter
from typing import Any, cast

import orjson
from rocksdict import (
    Cache,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteBufferManager,
    WriteOptions,
)

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
    index_key,
    parked_prefix,
    row_key,
)
from tables.partitioned import PartitionedStore
from tables.recent_rows import forget, load_at
from tables.refs import AggregateRef
from tables.rocksdb_io import UNLOGGED, db_options, gc_paused, prefix_end, scan
from tables.rocksdb_restore import INDEXES as _INDEXES
from tables.rocksdb_restore import RESTORED_KEYS_LIMIT, check_format, restore_batch
from tables.rowload import load_timer, load_timers
from tables.store import ChangelogSink, DueRow, UnreadableRow
from tables.timer import Timer, TimerStatus
from tables.writes import Write

__all__ = ["RocksDBTimerStore"]

_STATUSES = frozenset(status.value for status in TimerStatus)
_DUE_STATUSES = frozenset({TimerStatus.PENDING, TimerStatus.FIRING})
_FIELDS = frozenset(Timer.model_fields)
_KEY = itemgetter(0)
"""A due entry's key: sorting by it alone compares bytes, not tuples (half the time)."""


class RocksDBTimerStore(PartitionedStore):
    """Durable, restartable; restored from its changelog with `apply_changelog`.

    Tuned for a small box: one LRU block cache and one write-buffer budget shared by all
    partitions' DBs, index and filter blocks charged to the cache, LZ4. The WAL stays on
    for every write but a restore's (not fsynced per write: a crashed process loses
    nothing, a crashed machine restores from the changelog; see `_restore`).
    """

    _values_needed = True

    def __init__(
        self,
        path: str,
        partitions: int,
        changelog: ChangelogSink | None = None,
        *,
        block_cache_bytes: int = 64 << 20,
        write_buffer_bytes: int = 64 << 20,
    ) -> None:
        super().__init__(partitions, changelog)
        self._path = os.path.abspath(path)
        check_format(self._path, partitions, self._db_path)
        self._cache = Cache(block_cache_bytes)
        self._buffers = WriteBufferManager(write_buffer_bytes, False)
        self._dbs: dict[int, Rdict] = {}
        # Partitions with restored rows written without the WAL and not flushed yet.
        self._unlogged: set[int] = set()
        # Partitions that held nothing when opened (or dropped) and were written by
        # restores alone since: the hash of every key they hold a row of, so that a
        # restore batch reads back only the old entries of keys an earlier one wrote.
        self._restored: dict[int, set[int]] = {}
        # Each partition's low-water keys of its due and finished indexes (see `_found`).
        self._low = [DUE] * partitions
        self._finished_low = [FINISHED] * partitions
        try:
            for partition in range(partitions):
                self._open_partition(partition)
        except BaseException:
            self._close()
            raise

    def _db_path(self, partition: int) -> str:
        return os.path.join(self._path, f"p{partition}.db")

    def _db(self, partition: int) -> Rdict:
        return self._dbs[partition]

    # --- reads ------------------------------------------------------------------------

    def _value(self, partition: int, raw: bytes) -> bytes:
        """A row's JSON from its ``r`` entry: there, or in the index entry it points to."""
        if raw[:1] not in _INDEXES:
            return raw
        value = self._db(partition).get(raw)
        if value is None:
            raise StoreError(
                f"partition {partition} is corrupt: no index entry {raw!r}", partition=partition
            )
        return cast(bytes, value)

    def _load(self, partition: int, row: bytes) -> Timer | None:
        raw = self._db(partition).get(ROW + row)
        if raw is None:
            return None
        if raw[:1] in _INDEXES:  # at its index entry: settled next, from the same bytes
            return load_at(raw, self._value(partition, raw), partition, row)
        return load_timer(raw, row, partition)

    def _load_many(self, partition: int, rows: list[bytes]) -> list[Timer | None]:
        raws = cast(list[bytes | None], self._db(partition).get(cast(Any, [ROW + r for r in rows])))
        return [
            None if raw is None else load_timer(self._value(partition, raw), row, partition)
            for raw, row in zip(raws, rows, strict=True)
        ]

    def _load_as_loaded(self, partition: int, row: bytes, loaded: Timer) -> Timer | None:
        """A PENDING or FIRING row held as `loaded` is at `loaded`'s due entry (its key is
        due_at, id and row key): one read there, where the firing loop's scan just was,
        instead of a random read of the row and then of its entry."""
        if loaded.status not in _DUE_STATUSES:
            return self._load(partition, row)
        key = due_key(loaded.due_at, loaded.id, row)
        value = self._db(partition).get(key)
        return None if value is None else load_at(key, value, partition)

    def _owner_rows(self, partition: int, prefix: bytes) -> Iterator[tuple[bytes, Timer]]:
        start = ROW + prefix
        for key, raw in scan(self._db(partition), start, prefix_end(start)):
            yield key[1:], load_timer(self._value(partition, raw), key, partition)

    def _due(self, partitions: list[int], until: int, limit: int) -> list[Timer]:
        found = self._found(partitions, until, limit)
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
        self, partitions: list[int], until: int, limit: int
    ) -> list[tuple[bytes, bytes, int]]:
        """The first `limit` due entries of `partitions`, merged by key: `(key, value,
        partition)`.

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
        of it claimed so far, not only those of the last round's claims.
        """
        options = ReadOptions()  # held to the end: the iterators read their bound from it
        options.set_iterate_upper_bound(due_upper_bound(until))
        step = min(limit, limit // len(partitions) + limit // (4 * len(partitions)) + 8)
        found: list[tuple[bytes, bytes, int]] = []
        runs: dict[int, Iterator[tuple[bytes, bytes]]] = {}
        last: dict[int, bytes] = {}
        for partition in partitions:
            low = self._low[partition]
            run = cast(
                Iterator[tuple[bytes, bytes]],
                self._db(partition).items(from_key=low, read_opt=options),
            )
            got = list(islice(run, step))
            if not got:
                self._low[partition] = max(low, due_upper_bound(until))
                continue
            self._low[partition] = got[0][0]
            found += [(key, value, partition) for key, value in got]
            if len(got) == step:
                runs[partition], last[partition] = run, got[-1][0]
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
                    del runs[partition], last[partition]
            found.sort(key=_KEY)
        del options
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
        tombstones every time."""
        if until < 0:
            return []
        low = self._finished_low[partition]
        upper = finished_upper_bound(until)
        found: list[tuple[bytes, Timer]] = []
        with gc_paused():
            for key, value in scan(self._db(partition), low, upper):
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
        runs = [scan(self._db(partition), start, upper) for partition in partitions]
        with gc_paused():
            return [load_timer(value, key) for key, value in heapq.merge(*runs)]

    def _due_entries(self, partition: int, start: int) -> Iterator[tuple[int, str]]:
        # From the low-water mark at least: the tombstones below it are skipped.
        first = max(due_key_prefix(start), self._low[partition])
        for key, value in scan(self._db(partition), first, prefix_end(DUE)):
            # The status alone: orjson without the model is several times cheaper.
            yield int.from_bytes(key[1:9], "big"), orjson.loads(value)["status"]

    def _parked_entries(self, partition: int) -> Iterator[Callable[[], Timer]]:
        for key, value in scan(self._db(partition), PARKED, prefix_end(PARKED)):
            yield partial(load_timer, value, key)

    def _held_count(self, partition: int) -> int:
        return sum(1 for _ in scan(self._db(partition), HELD, prefix_end(HELD)))

    def _offset(self, partition: int) -> int | None:
        raw = self._db(partition).get(OFFSET_KEY)
        return None if raw is None else int.from_bytes(raw, "big", signed=True)

    # --- writes -----------------------------------------------------------------------

    async def _durable(self, partitions: set[int]) -> None:
        """Flushes restored rows written without the WAL before a write with it (see
        `_write`), in a thread: a memtable's flush takes tens of ms, the loop goes on."""
        for partition in sorted(partitions & self._unlogged):
            try:
                await asyncio.to_thread(self._db(partition).flush, True)
            except Exception as exc:
                raise StoreError(f"RocksDB flush of partition {partition} failed: {exc}") from exc
            self._unlogged.discard(partition)

    def _write(
        self, partition: int, batch: WriteBatch, options: WriteOptions | None = None
    ) -> None:
        try:
            if options is None:
                # A write of the node's: no longer a partition only restores wrote.
                self._restored.pop(partition, None)
            if options is None and partition in self._unlogged:
                # Restored rows written without the WAL are made durable before the first
                # write with it: a crash can then lose a suffix of the writes, never a
                # restore batch under a later write (see `_restore`).
                self._db(partition).flush(True)
                self._unlogged.discard(partition)
            if options is None:
                self._db(partition).write(batch)
            else:
                self._db(partition).write(batch, options)
        except Exception as exc:
            raise StoreError(
                f"RocksDB write to partition {partition} failed: {exc}", partition=partition
            ) from exc

    def _apply(self, writes: list[Write], values: list[bytes | None] | None) -> None:
        assert values is not None
        batches: dict[int, WriteBatch] = {}
        for write, value in zip(writes, values, strict=True):
            batch = batches.get(write.partition)
            if batch is None:
                batch = batches[write.partition] = WriteBatch(raw_mode=True)
            old = None if write.old is None else index_key(write.old, write.row)
            if old is not None:
                forget(old)
            if write.new is None or value is None:  # a tombstone
                batch.delete(ROW + write.row)
                if old is not None:
                    batch.delete(old)
                continue
            new = index_key(write.new, write.row)
            if old is not None and old != new:
                batch.delete(old)
            self._lower(write.partition, new)
            batch.put(new, value)
            batch.put(ROW + write.row, new)
        for partition, batch in batches.items():
            self._write(partition, batch)

    def _restore(
        self, partition: int, records: Iterable[tuple[int, bytes, bytes | None]]
    ) -> list[UnreadableRow]:
        """One WriteBatch of the records, with the last one's offset, written without the
        WAL: a crash then loses a suffix of the restore's batches (RocksDB flushes a DB's
        memtables in order, and each batch carries its offset), so the store holds an
        earlier offset and a restore goes on from there; it never looks further than it
        got. The first write with the WAL flushes them first (`_write`), and so does a
        close. The changelog holds every record: rewriting it costs a restore, not data."""
        records = records if isinstance(records, list) else list(records)
        if not records:
            return []
        # The batch makes tens of thousands of acyclic objects: no collection among them.
        restored = self._restored.get(partition)
        if restored is not None and (
            sum(map(len, self._restored.values())) + len(records) > RESTORED_KEYS_LIMIT
        ):
            # Past the hashes' memory bound: this partition reads its old entries back.
            del self._restored[partition]
            restored = None
        with gc_paused():
            batch, unreadable, firsts = restore_batch(
                self._db(partition), partition, records, restored
            )
        # The low-water marks go below the batch's first due and finished entries.
        for first in firsts:
            self._lower(partition, first)
        self._unlogged.add(partition)
        self._write(partition, batch, UNLOGGED)
        return unreadable

    # --- partitions -------------------------------------------------------------------

    def _open_partition(self, partition: int) -> None:
        self._low[partition], self._finished_low[partition] = DUE, FINISHED
        try:
            db = self._dbs[partition] = Rdict(
                self._db_path(partition), db_options(self._cache, self._buffers)
            )
            keys = db.iter()
            keys.seek_to_first()
            if not keys.valid():  # empty: restores into it need not read old entries
                self._restored[partition] = set()
            del keys  # a DB closes only once its iterators are gone
        except Exception as exc:
            raise StoreError(f"cannot open {self._db_path(partition)}: {exc}") from exc

    def _close_partition(self, partition: int) -> None:
        self._restored.pop(partition, None)
        db = self._dbs.pop(partition, None)
        if db is not None:
            if partition in self._unlogged:
                self._unlogged.discard(partition)
                db.flush(True)  # the restored rows written without the WAL
            db.close()

    def _drop_partition(self, partition: int, served: bool) -> None:
        self._unlogged.discard(partition)  # its rows are thrown away: nothing to flush
        self._close_partition(partition)
        shutil.rmtree(self._db_path(partition), ignore_errors=True)
        if served:
            self._open_partition(partition)

    def _close(self) -> None:
        for partition in list(self._dbs):
            self._close_partition(partition)
