"""What the RocksDB timer store reads and writes with: its DBs' options, range scans (and
the check of where one ended), the read faults it raises as `StoreError`, the GC pause of
a bulk decode, and the write options of a restore; and which failures to open a DB are a
damaged copy (`damaged_copy`, the aggregate state store's rule too) or a LOCK this
process still holds (`lock_held_here`)."""

from __future__ import annotations

import gc
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from typing import cast

from rocksdict import (
    BlockBasedIndexType,
    BlockBasedOptions,
    Cache,
    DbClosedError,
    DBCompressionType,
    MemtableFactory,
    Options,
    Rdict,
    RdictIter,
    ReadOptions,
    WriteBufferManager,
    WriteOptions,
)

from tables.exceptions import StoreError

__all__ = [
    "UNLOGGED",
    "check_ended",
    "damaged_copy",
    "db_options",
    "gc_paused",
    "lock_held_here",
    "prefix_end",
    "read_fault",
    "rocksdb_fault",
    "scan",
]

UNLOGGED = WriteOptions()
"""A restore's writes: without the WAL (see `RocksDBTimerStore._restore`)."""
UNLOGGED.disable_wal = True  # type: ignore[method-assign,assignment]  # a property (stub: method)


def prefix_end(prefix: bytes) -> bytes:
    """The first key past every key that starts with `prefix`."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        raise ValueError("no key follows an all-0xff prefix")
    return stripped[:-1] + bytes([stripped[-1] + 1])


@contextmanager
def gc_paused() -> Iterator[None]:
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


def rocksdb_fault(exc: Exception) -> bool:
    """Whether `exc` is rocksdict's report of RocksDB failing: a plain `Exception` ("IO
    error: ...", "Corruption: ...") or `DbClosedError`. Not its `KeyError` of a key that
    is no bytes, nor anything a subclass names (a `StoreError` of the store's own)."""
    return type(exc) is Exception or isinstance(exc, DbClosedError)


def read_fault(exc: Exception, partition: int | None) -> StoreError:
    """The `StoreError` of a failed RocksDB read of `partition` (`rocksdb_fault(exc)`)."""
    return StoreError(f"RocksDB read of partition {partition} failed: {exc}", partition=partition)


def check_ended(
    db: Rdict, options: ReadOptions, past: bytes, partition: int | None, *, whole: bool = False
) -> None:
    """Raises `StoreError` when a scan of `db` with `options` that ended before `past`
    ended at a block RocksDB could not read (a checksum mismatch, an I/O error), not at
    its upper bound: `past` is the least key the scan did not answer.

    rocksdict's `items()` stops at such a block as at the bound and keeps the error to
    itself: a fresh iterator's seek to `past` reads that block again, and its `status()`
    tells. One seek a scan that ran out, none a row.

    `whole`: nothing was written to `db` since the scan's iterator was made (a scan read
    through in one synchronous call), so a key at or past `past` under the bound is one
    the scan skipped: its read failed once (a transient I/O error, which the check's read
    no longer meets). Without it, `status()` alone: such a key may be a row written since
    the scan began (a scan consumed lazily, across awaits).
    """
    check: RdictIter | None = None
    try:
        check = db.iter(options)
        check.seek(past)
        check.status()
        skipped = bytes(check.key()) if whole and check.valid() else None
    except Exception as exc:
        # Not kept by the traceback's frame: a DB closes only once its iterators are gone,
        # and the error may be held past a revoke (a firing round keeps its fault).
        check = None
        if not rocksdb_fault(exc):
            raise
        raise StoreError(
            f"RocksDB scan of partition {partition} failed at {past!r}: {exc}",
            partition=partition,
        ) from exc
    check = None
    if skipped is not None:
        raise StoreError(
            f"RocksDB scan of partition {partition} ended before {skipped!r} (from "
            f"{past!r}): a read that failed once, the rows past it unread",
            partition=partition,
        )


def scan(
    db: Rdict,
    start: bytes,
    upper: bytes,
    partition: int | None = None,
    *,
    whole: bool = False,
) -> Generator[tuple[bytes, bytes], None, None]:
    """The items of `db` from `start` up to `upper` (exclusive), in key order; a
    `StoreError` of `partition` if a block it meets cannot be read (`check_ended`, and
    `whole` as there: only for a scan read through with no write to `db` in between).

    The generator holds the ReadOptions: rocksdict's iterator does not keep its options
    alive, and once they are collected the iterator reads freed memory as its upper
    bound (seen: a scan that ended early). Its iterator is dropped before the check and
    whatever ends it: a traceback through this frame keeps no iterator (see
    `check_ended`).
    """
    options = ReadOptions()
    options.set_iterate_upper_bound(upper)
    items = cast(Iterator[tuple[bytes, bytes]], db.items(from_key=start, read_opt=options))
    item: tuple[bytes, bytes] | None = None
    try:
        for item in items:
            yield item
    finally:
        del items
    check_ended(db, options, start if item is None else item[0] + b"\x00", partition, whole=whole)
    del options


def lock_held_here(exc: Exception) -> bool:
    """Whether RocksDB refused to open a DB whose LOCK this process holds: a DB closed
    while an iterator of it lived (rocksdict closes it once they are gone; one a traceback
    in a reference cycle keeps waits for a full collection)."""
    text = str(exc)
    return text.startswith("IO error:") and "lock hold by current process" in text


def damaged_copy(exc: Exception, lock: str) -> bool:
    """Whether RocksDB refused to open a DB for what its files hold (a corrupt or missing
    file: a power loss, a disk fault), rather than for how it is used: its `lock` file
    held is another holder of the directory (another worker, or this process), whose copy
    must stay. Either store drops such a copy, a cache of a log, to read that log again."""
    text = str(exc)
    if lock in text:
        return False
    return text.startswith("Corruption:") or (
        text.startswith("IO error:") and "No such file or directory" in text
    )


def db_options(cache: Cache, buffers: WriteBufferManager, *, bulk: bool = False) -> Options:
    """A partition DB's options: `cache` and `buffers` are shared by all of a store's DBs.

    `bulk`: for an emptied partition's restore (`RocksDBTimerStore._bulk`), memtables that
    are vectors, not skip lists: a write appends, the flush sorts on RocksDB's own thread
    (a restore's batch written ~1.6 -> ~0.3 µs a row of the caller's thread, which holds
    the GIL), but every read of one copies and sorts it: no DB is read so."""
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    if bulk:
        options.set_memtable_factory(MemtableFactory.vector())
        options.set_allow_concurrent_memtable_write(False)  # a vector takes one writer
    # Two cores: flushes and compactions share two background threads.
    options.set_max_background_jobs(2)
    # Memtables: up to 3 x 16 MB a DB, all DBs together capped by one write-buffer
    # budget (flushed early past it). A 10,000-record restore batch is ~6 MB.
    options.set_write_buffer_size(16 << 20)
    options.set_max_write_buffer_number(3)
    options.set_write_buffer_manager(buffers)
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
    table.set_block_cache(cache)
    table.set_cache_index_and_filter_blocks(True)
    table.set_index_type(BlockBasedIndexType.two_level_index_search())
    table.set_partition_filters(True)
    table.set_pin_top_level_index_and_filter(True)
    table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    table.set_bloom_filter(10, False)  # point reads of rows that are not there
    table.set_block_size(16 << 10)  # due() scans: fewer, larger blocks
    options.set_block_based_table_factory(table)
    return options
