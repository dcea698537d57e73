"""What the RocksDB timer store reads and writes with: its DBs' options, range scans (and
the check of where one ended), the read faults it raises as `StoreError`, the GC pause of
a bulk decode, and the write options of a restore."""

from __future__ import annotations

import gc
from collections.abc import Iterator
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
    ReadOptions,
    WriteBufferManager,
    WriteOptions,
)

from tables.exceptions import StoreError

__all__ = [
    "UNLOGGED",
    "check_ended",
    "db_options",
    "gc_paused",
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


def check_ended(db: Rdict, options: ReadOptions, past: bytes, partition: int | None) -> None:
    """Raises `StoreError` when a scan of `db` with `options` that ended before `past`
    ended at a block RocksDB could not read (a checksum mismatch, an I/O error), not at
    its upper bound: `past` is the least key the scan did not answer.

    rocksdict's `items()` stops at such a block as at the bound and keeps the error to
    itself: a fresh iterator's seek to `past` reads that block again, and its `status()`
    tells. One seek a scan that ran out, none a row.
    """
    # status() alone, not valid(): the check sees rows written since the scan began.
    try:
        check = db.iter(options)
        check.seek(past)
        check.status()
    except Exception as exc:
        if not rocksdb_fault(exc):
            raise
        raise StoreError(
            f"RocksDB scan of partition {partition} failed at {past!r}: {exc}",
            partition=partition,
        ) from exc


def scan(
    db: Rdict, start: bytes, upper: bytes, partition: int | None = None
) -> Iterator[tuple[bytes, bytes]]:
    """The items of `db` from `start` up to `upper` (exclusive), in key order; a
    `StoreError` of `partition` if a block it meets cannot be read (`check_ended`).

    The generator holds the ReadOptions: rocksdict's iterator does not keep its options
    alive, and once they are collected the iterator reads freed memory as its upper
    bound (seen: a scan that ended early).
    """
    options = ReadOptions()
    options.set_iterate_upper_bound(upper)
    items = cast(Iterator[tuple[bytes, bytes]], db.items(from_key=start, read_opt=options))
    item: tuple[bytes, bytes] | None = None
    for item in items:
        yield item
    check_ended(db, options, start if item is None else item[0] + b"\x00", partition)
    del options


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
