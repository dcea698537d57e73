"""The TimerStore on RocksDB (rocksdict): one DB a partition, ``{dir}/p{partition}.db``.

Rows and their indexes share each partition's DB under one-byte key prefixes (see
`tables.keys`) rather than column families: one memtable a DB instead of one a family
(12 partitions x 3 families of write buffers would not fit a small box), and a write's
row and index entries go in one plain WriteBatch. An indexed row's value lives in its
due or parked index entry and its ``r`` entry points there (see `tables.keys`), so
``due()`` is one range scan a partition with no point reads, and a pending timer's bytes
are written once. rocksdict is imported here, in `tables.rocksdb_reads` (the reads), in
`tables.rocksdb_io` (options, scans), in `tables.rocksdb_restore` (the format marker,
restore batches) and in `tables.aggregate_store` (the command path's states and ids).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from collections.abc import Callable, Iterable
from functools import partial

from rocksdict import Cache, Rdict, WriteBatch, WriteBufferManager, WriteOptions

from tables.exceptions import StoreError
from tables.keys import DUE, FINISHED, OFFSET_KEY, ROW, index_key
from tables.recent_rows import forget
from tables.rocksdb_io import UNLOGGED, damaged_copy, db_options, gc_paused, lock_held_here
from tables.rocksdb_reads import RocksDBReads
from tables.rocksdb_restore import RESTORED_KEYS_LIMIT, check_format, remove_copy, restore_batch
from tables.store import ChangelogSink, UnreadableRow
from tables.writes import Write

__all__ = ["RocksDBTimerStore"]

logger = logging.getLogger(__name__)


class RocksDBTimerStore(RocksDBReads):
    """Durable, restartable; restored from its changelog with `apply_changelog`.

    Tuned for a small box: one LRU block cache and one write-buffer budget shared by all
    partitions' DBs, index and filter blocks charged to the cache, LZ4. The WAL stays on
    for every write but a restore's (not fsynced per write: a crashed process loses
    nothing, a crashed machine restores from the changelog; see `_restore`), and a
    restore into an emptied partition writes to vector memtables until it ends (`_bulk`).
    Its reads: `tables.rocksdb_reads`.
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
        owner_type: tuple[str, str] | None = None,
    ) -> None:
        super().__init__(partitions, changelog, owner_type)
        self._path = os.path.abspath(path)
        check_format(self._path, partitions, self._db_path)
        self._cache = Cache(block_cache_bytes)
        self._buffers = WriteBufferManager(write_buffer_bytes, False)
        self._dbs: dict[int, Rdict] = _OpenDBs(self._db_path)
        # Partitions with restored rows written without the WAL and not flushed yet.
        self._unlogged: set[int] = set()
        # Partitions that held nothing when opened (or dropped) and were written by
        # restores alone since: the hash of every key they hold a row of, so that a
        # restore batch reads back only the old entries of keys an earlier one wrote.
        self._restored: dict[int, set[int]] = {}
        # Partitions whose DB is open for a bulk restore (`db_options(bulk=True)`): opened
        # empty, and written by restores alone since. The end of the restore or the first
        # write of the node's reopens it as every other DB is (`_leave_bulk`); reads of it
        # in between are right, only slower (each copies and sorts its memtable).
        self._bulk: set[int] = set()
        # Each partition's low-water keys of its due and finished indexes (`_found`).
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

    # --- writes -----------------------------------------------------------------------

    async def _durable(self, partitions: set[int]) -> None:
        """Flushes restored rows written without the WAL before a write with it (see
        `_write`), in a thread: a memtable's flush takes tens of ms, the loop goes on. A
        bulk restore's DB is then reopened as the others are."""
        for partition in sorted(partitions & (self._unlogged | self._bulk)):
            if partition in self._unlogged:
                try:
                    await asyncio.to_thread(self._db(partition).flush, True)
                except Exception as exc:
                    raise StoreError(
                        f"RocksDB flush of partition {partition} failed: {exc}"
                    ) from exc
                self._unlogged.discard(partition)
            if partition in self._bulk:
                self._leave_bulk(partition)  # flushed: closed and opened in ms

    async def _end_restore(self, partition: int) -> None:
        if partition in self._bulk:
            await self._durable({partition})

    def _write(
        self, partition: int, batch: WriteBatch, options: WriteOptions | None = None
    ) -> None:
        try:
            if options is None:
                # A write of the node's: no longer a partition only restores wrote.
                self._restored.pop(partition, None)
                if partition in self._bulk:
                    self._leave_bulk(partition)  # unless `_durable` did, before
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

    def _set_offset(self, partition: int, offset: int) -> None:
        batch = WriteBatch(raw_mode=True)
        batch.put(OFFSET_KEY, offset.to_bytes(8, "big", signed=True))
        self._write(partition, batch)

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
        db: Rdict | Callable[[], Rdict] = self._db(partition)
        if partition in self._bulk:
            # Past the hashes' bound, or a key an earlier batch wrote: the old entries are
            # read from the DB reopened as usual (the rest of the restore writes to it).
            db = partial(self._readable, partition)
        with gc_paused():
            batch, unreadable, firsts = restore_batch(
                db, partition, records, restored, self._owners
            )
        # The low-water marks go below the batch's first due and finished entries.
        for first in firsts:
            self._lower(partition, first)
        self._unlogged.add(partition)
        self._write(partition, batch, UNLOGGED)
        return unreadable

    # --- partitions -------------------------------------------------------------------

    def _open_partition(self, partition: int) -> None:
        """Opens p's DB; a copy RocksDB finds damaged is dropped and opened empty: it is
        only a cache of p's changelog, and an empty one holds no changelog offset, so the
        restore that follows reads the changelog whole (`changelog_offset` None)."""
        self._low[partition], self._finished_low[partition] = DUE, FINISHED
        path = self._db_path(partition)
        try:
            try:
                self._open_collected(partition)
            except Exception as exc:
                if not damaged_copy(exc, os.path.join(path, "LOCK")):
                    raise
                logger.error("%s cannot be read (%s): dropped, to be restored whole from "
                             "the changelog", path, exc)  # fmt: skip
                remove_copy(path, partition)
                self._open_checked(partition)
        except StoreError:
            raise
        except Exception as exc:
            raise StoreError(f"cannot open {path}: {exc}", partition=partition) from exc

    def _open_collected(self, partition: int) -> None:
        """`_open_checked`, once more after a full collection if this process holds p's
        LOCK: its DB, closed, stays open while an iterator of it lives, and one a traceback
        in a reference cycle keeps (an error kept by a firing round) waits for the cyclic
        collector, which a worker runs seldom (`app.node.collector`). Never on another
        process's lock: that is another worker's copy."""
        try:
            self._open_checked(partition)
        except Exception as exc:
            if not lock_held_here(exc):
                raise
            logger.warning("%s is held by this process (%s): collecting, and opening it "
                           "again", self._db_path(partition), exc)  # fmt: skip
        else:
            return
        gc.collect()
        self._open_checked(partition)

    def _open_checked(self, partition: int) -> None:
        """Opens p's DB, in bulk if it holds nothing; raises what RocksDB raises (its
        first block unreadable too, which an iterator would take for an empty DB)."""
        db = self._open_db(partition, bulk=False)
        try:
            empty = _empty(db)
        except BaseException:
            db.close()
            raise
        if empty:
            # Restores into it need not read old entries, and it takes them in bulk
            # until the restore ends or the node writes to it (`_bulk`).
            db.close()
            db = self._open_db(partition, bulk=True)
            self._restored[partition] = set()
            self._bulk.add(partition)
        self._dbs[partition] = db

    def _open_db(self, partition: int, *, bulk: bool) -> Rdict:
        options = db_options(self._cache, self._buffers, bulk=bulk)
        # The default family's options given too: without them rocksdict opens an existing
        # DB with those of its last OPTIONS file (memtable, block size, a block cache of its
        # own rather than the store's shared one), not these.
        return Rdict(self._db_path(partition), options, column_families={"default": options})

    def _readable(self, partition: int) -> Rdict:
        if partition in self._bulk:
            self._leave_bulk(partition)
        return self._db(partition)

    def _leave_bulk(self, partition: int) -> None:
        """Reopens a bulk restore's DB as every other DB is, its memtables flushed. If
        that fails, p is left with no DB (closed: a retake opens it again), and its reads
        and writes raise `StoreError` until then (`_OpenDBs`)."""
        self._bulk.discard(partition)
        try:
            db = self._dbs.pop(partition)
            try:
                if partition in self._unlogged:
                    self._unlogged.discard(partition)
                    db.flush(True)  # the restored rows, written without the WAL
            finally:
                db.close()
            self._dbs[partition] = self._open_db(partition, bulk=False)
        except Exception as exc:
            self._restored.pop(partition, None)
            raise StoreError(
                f"cannot reopen {self._db_path(partition)}: {exc}", partition=partition
            ) from exc

    def _close_partition(self, partition: int, *, sync: bool = True) -> None:
        """Closes p's DB, its writes synced to disk first (`sync`): a node marks a copy
        clean once its store let it go (`app.node.local_state.CleanMarks`), and the WAL
        RocksDB writes unsynced would lose its tail to a power loss under that mark.

        A sync or close that fails is a `StoreError` of p, its DB closed all the same
        (rocksdict lets the DB go whatever its close's own flush says). Once one write of
        a DB failed (a full disk for a moment), RocksDB refuses its every later write, the
        close's flush included ("Writer has previous error"): p's fault alone, never a
        plain `Exception` taken for a bug (a node's close of p would stop the node)."""
        self._restored.pop(partition, None)
        self._bulk.discard(partition)
        db = self._dbs.pop(partition, None)
        if db is None:
            return
        path = self._db_path(partition)
        faults: list[str] = []
        cause: Exception | None = None
        try:
            if partition in self._unlogged:
                self._unlogged.discard(partition)
                db.flush(True)  # the restored rows written without the WAL
            if sync:
                db.flush_wal(True)
        except Exception as exc:
            faults.append(f"cannot sync {path} as it closes: {exc}")
            cause = exc
        finally:
            try:
                db.close()
            except Exception as exc:
                faults.append(f"closing {path} failed: {exc}")
                cause = cause or exc
        if faults:
            raise StoreError("; ".join(faults), partition=partition) from cause

    def _drop_partition(self, partition: int, served: bool) -> None:
        self._unlogged.discard(partition)  # its rows are thrown away: nothing to flush
        try:
            self._close_partition(partition, sync=False)
        except StoreError as exc:
            # Closed all the same, and thrown away: a DB a write of which failed refuses
            # its close's flush, and a drop is what mends it (its retake's restore).
            logger.warning("partition %d dropped: %s", partition, exc)
        remove_copy(self._db_path(partition), partition)  # raises: never reopened as dropped
        if served:
            self._open_partition(partition)

    def _close(self) -> None:
        failed: StoreError | None = None
        for partition in list(self._dbs):
            try:
                self._close_partition(partition)
            except StoreError as exc:  # the others are closed all the same
                failed = failed or exc
        if failed is not None:
            raise failed


class _OpenDBs(dict[int, Rdict]):
    """The open DBs by partition. A served partition may have none: its reopen failed
    (`_leave_bulk`, a drop's); a read or write of it is then a `StoreError` of it, which
    its retake clears, never a KeyError, which would be taken for a bug."""

    def __init__(self, db_path: Callable[[int], str]) -> None:
        super().__init__()
        self._db_path = db_path

    def __missing__(self, partition: int) -> Rdict:
        raise StoreError(
            f"partition {partition} has no open DB ({self._db_path(partition)} failed to "
            "open): it is opened again when retaken",
            partition=partition,
        )


def _empty(db: Rdict) -> bool:
    """Whether `db` holds no key; raises RocksDB's error if its first block cannot be read
    (rocksdict's iterator stops there as at the end: only its status tells them apart)."""
    keys = db.iter()
    try:
        keys.seek_to_first()
        if keys.valid():
            return False
        keys.status()
        return True
    finally:
        del keys  # a DB closes only once its iterators are gone (a traceback holds this frame)
