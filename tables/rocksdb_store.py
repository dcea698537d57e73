"""The TimerStore on RocksDB (rocksdict): one DB a partition, ``{dir}/p{partition}.db``.

Rows and their indexes share each partition's DB under one-byte key prefixes (see
`tables.keys`) rather than column families: one memtable a DB instead of one a family
(12 partitions x 3 families of write buffers would not fit a small box), and a write's
row and index entries go in one plain WriteBatch. An indexed row's value lives in its
due or parked index entry and its ``r`` entry points there (see `tables.keys`), so
``due()`` is one range scan a partition with no point reads, and a pending timer's bytes
are written once. rocksdict is imported here and nowhere else.
"""

from __future__ import annotations

import gc
import heapq
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from itertools import islice
from typing import cast

import orjson
from rocksdict import (
    BlockBasedIndexType,
    BlockBasedOptions,
    Cache,
    DBCompressionType,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteBufferManager,
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
    load_timer,
    parked_prefix,
    row_key,
)
from tables.partitioned import PartitionedStore
from tables.refs import AggregateRef
from tables.rowcheck import restored_index
from tables.store import ChangelogSink, UnreadableRow, unreadable_reason
from tables.timer import Timer, TimerStatus
from tables.writes import Write

__all__ = ["RocksDBTimerStore"]

logger = logging.getLogger(__name__)

_INDEXES = (DUE, PARKED, FINISHED, HELD)
_MAX_DUE = (1 << 64) - 1
_STATUSES = frozenset(status.value for status in TimerStatus)
_DUE_STATUSES = frozenset({TimerStatus.PENDING, TimerStatus.FIRING})
_FIELDS = frozenset(Timer.model_fields)
_META = "STORE.json"
_FORMAT = 2
"""2: finished rows in the ``f`` index (1 kept them under ``r``): a store of format 1 is
thrown away on open and restored from the changelog (it is only ever a copy of it)."""


def _prefix_end(prefix: bytes) -> bytes:
    """The first key past every key that starts with `prefix`."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        raise ValueError("no key follows an all-0xff prefix")
    return stripped[:-1] + bytes([stripped[-1] + 1])


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Holds off the cyclic GC while a read or restore makes thousands of acyclic objects.

    Decoding 1,000 timers makes ~15,000 objects: the collector would run some twenty
    times over them for nothing, and now and then an old-generation pass lands in the
    middle (measured: due() p50 11.3 -> 9.1 ms, p99 24-35 -> 11 ms). The objects are
    collected as usual afterwards.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _scan(db: Rdict, start: bytes, upper: bytes) -> Iterator[tuple[bytes, bytes]]:
    """The items of `db` from `start` up to `upper` (exclusive), in key order.

    The generator holds the ReadOptions: rocksdict's iterator does not keep its options
    alive, and once they are collected the iterator reads freed memory as its upper
    bound (seen: a scan that ended early).
    """
    options = ReadOptions()
    options.set_iterate_upper_bound(upper)
    items = cast(Iterator[tuple[bytes, bytes]], db.items(from_key=start, read_opt=options))
    yield from items
    del options


class RocksDBTimerStore(PartitionedStore):
    """Durable, restartable; restored from its changelog with `apply_changelog`.

    Tuned for a small box: one LRU block cache and one write-buffer budget shared by all
    partitions' DBs, index and filter blocks charged to the cache, LZ4. The WAL stays on
    (not fsynced per write: a crashed process loses nothing, a crashed machine restores
    from the changelog).
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
        self._check_meta()
        self._cache = Cache(block_cache_bytes)
        self._buffers = WriteBufferManager(write_buffer_bytes, False)
        self._dbs: dict[int, Rdict] = {}
        self._low = [0] * partitions
        self._finished_low = [0] * partitions
        try:
            for partition in range(partitions):
                self._open_partition(partition)
        except BaseException:
            self._close()
            raise

    def _check_meta(self) -> None:
        os.makedirs(self._path, exist_ok=True)
        meta = os.path.join(self._path, _META)
        if os.path.exists(meta):
            with open(meta, encoding="utf-8") as file:
                held = json.load(file)
            if held.get("partitions") != self._partitions or held.get("format", 0) > _FORMAT:
                raise ValueError(
                    f"{self._path} holds a timer store of {held.get('partitions')} partitions "
                    f"(format {held.get('format')}), not {self._partitions} (format {_FORMAT}): "
                    "drop it or open it with its own partition count and version"
                )
            if held.get("format") == _FORMAT:
                return
            # An older layout: the copy goes, the changelog restores it (no offsets left).
            logger.warning("%s: timer store format %s is replaced by %d, restored from the "
                           "changelog", self._path, held.get("format"), _FORMAT)  # fmt: skip
            for partition in range(self._partitions):
                shutil.rmtree(self._db_path(partition), ignore_errors=True)
        with open(meta, "w", encoding="utf-8") as file:
            json.dump({"format": _FORMAT, "partitions": self._partitions}, file)

    def _options(self) -> Options:
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        # Two cores: flushes and compactions share two background threads.
        options.set_max_background_jobs(2)
        # Memtables: up to 3 x 16 MB a DB, all DBs together capped by one write-buffer
        # budget (flushed early past it). A 10,000-record restore batch is ~6 MB.
        options.set_write_buffer_size(16 << 20)
        options.set_max_write_buffer_number(3)
        options.set_write_buffer_manager(self._buffers)
        options.set_max_total_wal_size(64 << 20)
        options.set_compression_type(DBCompressionType.lz4())
        options.set_level_compaction_dynamic_level_bytes(True)
        options.set_keep_log_file_num(2)
        table = BlockBasedOptions()
        # One LRU cache for all DBs, index and filter blocks charged to it: the memory
        # a store takes stays put as it grows to millions of timers. Index and filters
        # are partitioned, so that only their small top levels stay pinned and the
        # cache holds the parts that reads touch (at 10M timers the whole of them would
        # not fit).
        table.set_block_cache(self._cache)
        table.set_cache_index_and_filter_blocks(True)
        table.set_index_type(BlockBasedIndexType.two_level_index_search())
        table.set_partition_filters(True)
        table.set_pin_top_level_index_and_filter(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        table.set_bloom_filter(10, False)  # point reads of rows that are not there
        table.set_block_size(16 << 10)  # due() scans: fewer, larger blocks
        options.set_block_based_table_factory(table)
        return options

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
            raise StoreError(f"partition {partition} is corrupt: no index entry {raw!r}")
        return cast(bytes, value)

    def _load(self, partition: int, row: bytes) -> Timer | None:
        raw = self._db(partition).get(ROW + row)
        return None if raw is None else load_timer(self._value(partition, raw))

    def _load_as_loaded(self, partition: int, row: bytes, loaded: Timer) -> Timer | None:
        """A PENDING or FIRING row held as `loaded` is at `loaded`'s due entry (its key is
        due_at, id and row key): one read there, where the firing loop's scan just was,
        instead of a random read of the row and then of its entry."""
        if loaded.status not in _DUE_STATUSES:
            return self._load(partition, row)
        value = self._db(partition).get(due_key(loaded.due_at, loaded.id, row))
        return None if value is None else load_timer(value)

    def _owner_rows(self, partition: int, prefix: bytes) -> Iterator[tuple[bytes, Timer]]:
        start = ROW + prefix
        for key, raw in _scan(self._db(partition), start, _prefix_end(start)):
            yield key[1:], load_timer(self._value(partition, raw))

    def _due(self, partitions: list[int], until: int, limit: int) -> list[Timer]:
        upper = due_upper_bound(until)
        runs = [self._due_run(partition, until, upper) for partition in partitions]
        merged = runs[0] if len(runs) == 1 else heapq.merge(*runs)
        with _gc_paused():
            return [load_timer(value) for _, value in islice(merged, limit)]

    def _due_run(self, partition: int, until: int, upper: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Partition's due entries up to `upper`, from its low-water mark.

        The firing loop deletes entries from the front of the due index (each claim moves
        one to its deadline), and their tombstones stay until compaction: a scan from the
        index's first key would step over all of them on every call. `_low[p]` is a due
        time below which p has no due entry: lowered by every write of one, raised to the
        first entry each scan finds (or past `until` when it finds none).
        """
        low = self._low[partition]
        found = False
        for key, value in _scan(self._db(partition), due_key_prefix(low), upper):
            if not found:
                found = True
                self._low[partition] = int.from_bytes(key[1:9], "big")
            yield key, value
        if not found:
            self._low[partition] = max(low, min(until + 1, _MAX_DUE))

    def _lower(self, partition: int, index: bytes) -> None:
        """Keeps `_low` (`_finished_low`) below a due (finished) entry about to be written."""
        kind = index[:1]
        if kind == DUE:
            due_at = int.from_bytes(index[1:9], "big")
            if due_at < self._low[partition]:
                self._low[partition] = due_at
        elif kind == FINISHED:
            at = int.from_bytes(index[1:9], "big")
            if at < self._finished_low[partition]:
                self._finished_low[partition] = at

    def _expired(self, partition: int, until: int, limit: int) -> list[tuple[bytes, Timer]]:
        """Like `_due_run`, from a low-water mark: each sweep deletes entries from the
        front of the finished index, and a scan from its first key would step over their
        tombstones every time."""
        if until < 0:
            return []
        low = self._finished_low[partition]
        start = FINISHED + low.to_bytes(8, "big")
        found: list[tuple[bytes, Timer]] = []
        with _gc_paused():
            for key, value in _scan(self._db(partition), start, finished_upper_bound(until)):
                if not found:
                    self._finished_low[partition] = int.from_bytes(key[1:9], "big")
                timer = load_timer(value)
                found.append((row_key(timer.owner, timer.key), timer))
                if len(found) == limit:
                    return found
        if not found:
            self._finished_low[partition] = max(low, min(until + 1, _MAX_DUE))
        return found

    def _parked(self, partitions: list[int], target: AggregateRef) -> list[Timer]:
        start = parked_prefix(target)
        upper = _prefix_end(start)
        runs = [_scan(self._db(partition), start, upper) for partition in partitions]
        with _gc_paused():
            return [load_timer(value) for _, value in heapq.merge(*runs)]

    def _due_entries(self, partition: int, start: int) -> Iterator[tuple[int, str]]:
        # From the low-water mark at least: the tombstones below it are skipped.
        first = due_key_prefix(max(start, self._low[partition]))
        for key, value in _scan(self._db(partition), first, _prefix_end(DUE)):
            # The status alone: orjson without the model is several times cheaper.
            yield int.from_bytes(key[1:9], "big"), orjson.loads(value)["status"]

    def _parked_entries(self, partition: int) -> Iterator[Callable[[], Timer]]:
        for _, value in _scan(self._db(partition), PARKED, _prefix_end(PARKED)):
            yield partial(load_timer, value)

    def _held_count(self, partition: int) -> int:
        return sum(1 for _ in _scan(self._db(partition), HELD, _prefix_end(HELD)))

    def _offset(self, partition: int) -> int | None:
        raw = self._db(partition).get(OFFSET_KEY)
        return None if raw is None else int.from_bytes(raw, "big", signed=True)

    # --- writes -----------------------------------------------------------------------

    def _write(self, partition: int, batch: WriteBatch) -> None:
        try:
            self._db(partition).write(batch)
        except Exception as exc:
            raise StoreError(f"RocksDB write to partition {partition} failed: {exc}") from exc

    def _apply(self, writes: list[Write], values: list[bytes | None] | None) -> None:
        assert values is not None
        batches: dict[int, WriteBatch] = {}
        for write, value in zip(writes, values, strict=True):
            batch = batches.get(write.partition)
            if batch is None:
                batch = batches[write.partition] = WriteBatch(raw_mode=True)
            old = None if write.old is None else index_key(write.old, write.row)
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
        unreadable: list[UnreadableRow] = []
        batch = WriteBatch(raw_mode=True)
        get, put, delete = self._db(partition).get, batch.put, batch.delete
        indexed: dict[bytes, bytes | None] = {}
        """The index entry of each row this batch has written so far."""
        last = None
        new: bytes | None
        for offset, key, value in records:
            last = offset
            new = None
            if value is not None:
                try:
                    new, value = restored_index(partition, key, value)
                except ValueError as exc:
                    # The key's latest record is no row: the key holds none, as the
                    # tombstone its dead letter comes with will say (`unreadable_letters`).
                    unreadable.append(UnreadableRow(offset, key, value, unreadable_reason(exc)))
            row = ROW + key
            if key in indexed:
                old = indexed[key]
            else:
                raw = get(row)
                old = raw if raw is not None and raw[:1] in _INDEXES else None
            if new is None:
                delete(row)
            else:
                self._lower(partition, new)
                put(new, value)
                put(row, new)
            if old is not None and old != new:
                delete(old)
            indexed[key] = new
        if last is None:
            return unreadable
        put(OFFSET_KEY, last.to_bytes(8, "big", signed=True))
        self._write(partition, batch)
        return unreadable

    # --- partitions -------------------------------------------------------------------

    def _open_partition(self, partition: int) -> None:
        self._low[partition] = self._finished_low[partition] = 0
        try:
            self._dbs[partition] = Rdict(self._db_path(partition), self._options())
        except Exception as exc:
            raise StoreError(f"cannot open {self._db_path(partition)}: {exc}") from exc

    def _close_partition(self, partition: int) -> None:
        db = self._dbs.pop(partition, None)
        if db is not None:
            db.close()

    def _drop_partition(self, partition: int, served: bool) -> None:
        self._close_partition(partition)
        shutil.rmtree(self._db_path(partition), ignore_errors=True)
        if served:
            self._open_partition(partition)

    def _close(self) -> None:
        for partition in list(self._dbs):
            self._close_partition(partition)
