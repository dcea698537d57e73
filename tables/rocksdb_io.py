"""What the RocksDB timer store reads and writes with: its DBs' options, range scans,
the GC pause of a bulk decode, and the write options of a restore."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

from rocksdict import (
    BlockBasedIndexType,
    BlockBasedOptions,
    Cache,
    DBCompressionType,
    MemtableFactory,
    Options,
    Rdict,
    ReadOptions,
    WriteBufferManager,
    WriteOptions,
)

__all__ = ["UNLOGGED", "db_options", "gc_paused", "prefix_end", "scan"]

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


def scan(db: Rdict, start: bytes, upper: bytes) -> Iterator[tuple[bytes, bytes]]:
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
