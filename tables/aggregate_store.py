"""The aggregate state store: each aggregate's folded state and the request ids it applied.

A view of the log, like the TimerStore: per partition, restored by folding the events
topic from the store's last offset, so it never needs a changelog of its own. The node
writes a transaction's new states, request ids and the last event offset in one batch
after the transaction committed; a crash in between is mended by the restore.

Each request id is kept with when it was applied, so that ids older than the
de-duplication window can be forgotten (`expire_requests`, in bounded batches, oldest
first): a command sent again with such an id is applied again. An id is kept as passed
over when its event is in the log but was not folded (`passed`): still applied for a
command sent again (`seen`), but not folded for the log's reader (`folded`), which then
tries the event again (and dead-letters it).

A partition's copy found damaged (a state the service cannot read, a RocksDB read or
write that failed, files RocksDB cannot open it from) is marked bad (`mark_bad`): from
then on it reads as empty and each write to it is refused (`StoreError`), so that a
commit of the failing take still in flight cannot start a new copy at its recent offset
(its restore would fold only the events after it, every other aggregate lost); the
partition's next restore drops it and folds the log whole, once that take's commits are
abandoned.

The backends: `RocksAggregateStore` here (its keys: `tables.aggregate_keys`), and the
reference one, `MemoryAggregateStore` (`tables.aggregate_memory`).
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Protocol, cast

from rocksdict import BlockBasedOptions, Options, Rdict, ReadOptions, WriteBatch

from tables.aggregate_keys import APPLIED, OFFSET, PASSED, REQUEST, STATE, id_key
from tables.aggregate_memory import MemoryAggregateStore
from tables.exceptions import StoreClosed, StoreError
from tables.rocksdb_io import damaged_copy

__all__ = ["AggregateStateStore", "MemoryAggregateStore", "RocksAggregateStore"]


class AggregateStateStore(Protocol):
    """States are opaque bytes here (the service layer's JSON); one store per aggregate type."""

    def get(self, partition: int, aggregate_id: str) -> bytes | None: ...

    def seen(self, partition: int, aggregate_id: str, request_id: str) -> bool:
        """Whether the request id is kept as applied, folded or passed over."""
        ...

    def folded(
        self, partition: int, aggregate_id: str, request_id: str, since: int | None = None
    ) -> bool:
        """Whether the request id is kept as applied and not only passed over; with
        `since` (epoch ms), applied after it too (a restore's judge of an event's date,
        whatever a sweep forgot by its own clock)."""
        ...

    def write(
        self,
        partition: int,
        states: Mapping[str, bytes],
        requests: Iterable[tuple[str, str]],
        offset: int | None,
        applied_at: int = 0,
        passed: Iterable[tuple[str, str]] = (),
        dates: Mapping[tuple[str, str], int] | None = None,
    ) -> None:
        """Writes `states` and the applied `(aggregate id, request id)`s (applied at
        `applied_at`, epoch ms, or at their own date in `dates`: a restore's, each its
        event's), the offset, and the ids `passed` over (kept so unless held or written
        as applied)."""
        ...

    def expire_requests(self, partition: int, before: int, limit: int) -> int:
        """Forgets up to `limit` request ids applied at or before `before`, oldest first;
        how many."""
        ...

    def offset(self, partition: int) -> int | None:
        """The last events offset folded in, or None."""
        ...

    def drop(self, partition: int) -> None:
        """Forgets the partition (before a restore from the start), a bad mark included;
        `StoreError` when it could not."""
        ...

    def mark_bad(self, partition: int) -> None:
        """The partition's copy is damaged: it reads as empty, and each write to it is
        refused (`StoreError`), until `drop` forgets it."""
        ...

    def is_bad(self, partition: int) -> bool:
        """Whether the partition's copy is marked bad (its next restore drops it)."""
        ...

    def close(self) -> None: ...


class RocksAggregateStore:
    """One RocksDB per partition under `directory`, opened on first use."""

    def __init__(self, directory: Path) -> None:
        self._dir = directory
        self._dir.mkdir(parents=True, exist_ok=True)
        self._dbs: dict[int, Rdict] = {}
        # Per partition, no request id's sweep entry is below this key (the last one
        # forgotten): a sweep scans from it, not over the tombstones of those before.
        self._low: dict[int, bytes] = {}
        # Kept through `release`: the partition's next take (its restore) drops the copy.
        self._bad: set[int] = set()
        self._closed = False
        self._options = Options(raw_mode=True)
        self._options.create_if_missing(True)
        self._options.set_write_buffer_size(8 * 1024 * 1024)
        self._options.set_max_write_buffer_number(2)
        table = BlockBasedOptions()
        # Every command asks whether its request id was applied, and nearly all were not:
        # a filter answers such a miss without reading the blocks of every level.
        table.set_bloom_filter(10, False)
        self._options.set_block_based_table_factory(table)

    def _path(self, partition: int) -> Path:
        return self._dir / f"p{partition}.db"

    def _db(self, partition: int) -> Rdict:
        """The partition's DB, to write to: refused while it is bad."""
        if (db := self._readable(partition)) is None:
            raise StoreError(
                f"aggregate states {self._path(partition)} are bad: refused until the"
                " partition's next restore drops them",
                partition=partition,
            )
        return db

    def _readable(self, partition: int) -> Rdict | None:
        """The partition's DB, opened on first use; None while it is bad (read as empty,
        never opened afresh: see the module)."""
        if self._closed:
            raise StoreClosed("aggregate store is closed")
        if partition in self._bad:
            return None
        db = self._dbs.get(partition)
        if db is None:
            try:
                # The default family's options given too: else rocksdict opens an existing
                # DB with those of its last OPTIONS file, not these (the timer store's alike).
                db = Rdict(
                    str(self._path(partition)),
                    self._options,
                    column_families={"default": self._options},
                )
            except Exception as exc:
                # Damaged files (a corrupt or missing CURRENT, MANIFEST): marked bad, the
                # next restore drops the copy and folds the log whole. Not a LOCK held: the
                # copy of another holder, which must stay (`damaged_copy`).
                if damaged_copy(exc, str(self._path(partition) / "LOCK")):
                    self._bad.add(partition)
                raise StoreError(
                    f"cannot open {self._path(partition)}: {exc}", partition=partition
                ) from exc
            self._dbs[partition] = db
        return db

    @contextlib.contextmanager
    def _reading(self, partition: int) -> Iterator[None]:
        """rocksdict's errors (plain `Exception`s: an I/O error, a checksum mismatch) as
        `StoreError`s of the partition, whose copy is marked bad: read on, it could fail
        at every retake (a table file gone); written on after a failed write, a later
        batch's offset would pass over the states it did not write."""
        try:
            yield
        except StoreError:
            raise
        except Exception as exc:
            raise self._fault(partition, exc) from exc

    def _fault(self, partition: int, exc: Exception) -> StoreError:
        """A rocksdict error of `partition` (`_reading`): its copy marked bad."""
        self._bad.add(partition)
        return StoreError(f"aggregate states {self._path(partition)}: {exc}", partition=partition)

    def _get(self, partition: int, key: bytes) -> bytes | None:
        """`key`'s value, read as `_reading` reads: inline, every followed event reads two
        keys and a context manager cost ~1.4 µs a read (#20)."""
        if (db := self._readable(partition)) is None:
            return None
        try:
            value = db.get(key)
        except Exception as exc:
            raise self._fault(partition, exc) from exc
        return None if value is None else bytes(value)

    def get(self, partition: int, aggregate_id: str) -> bytes | None:
        return self._get(partition, STATE + id_key(aggregate_id))

    def seen(self, partition: int, aggregate_id: str, request_id: str) -> bool:
        return self._request(partition, aggregate_id, request_id) is not None

    def folded(
        self, partition: int, aggregate_id: str, request_id: str, since: int | None = None
    ) -> bool:
        held = self._request(partition, aggregate_id, request_id)
        if held is None or held[8:] == PASSED:
            return False
        return since is None or int.from_bytes(held[:8], "big") > since

    def _request(self, partition: int, aggregate_id: str, request_id: str) -> bytes | None:
        return self._get(partition, REQUEST + id_key(aggregate_id) + request_id.encode())

    def write(
        self,
        partition: int,
        states: Mapping[str, bytes],
        requests: Iterable[tuple[str, str]],
        offset: int | None,
        applied_at: int = 0,
        passed: Iterable[tuple[str, str]] = (),
        dates: Mapping[tuple[str, str], int] | None = None,
    ) -> None:
        db = self._db(partition)
        with self._reading(partition):
            # Listed: each is read twice (the earliest date, then the writes).
            self._write(
                db, partition, states, [*requests], offset, applied_at, [*passed], dates or {}
            )

    def _write(
        self,
        db: Rdict,
        partition: int,
        states: Mapping[str, bytes],
        requests: list[tuple[str, str]],
        offset: int | None,
        applied_at: int,
        passed: list[tuple[str, str]],
        dates: Mapping[tuple[str, str], int],
    ) -> None:
        batch = WriteBatch(raw_mode=True)
        for aggregate_id, state in states.items():
            batch.put(STATE + id_key(aggregate_id), state)

        def date(key: tuple[str, str]) -> bytes:
            return max(dates.get(key, applied_at), 0).to_bytes(8, "big")

        earliest = min(map(date, (*requests, *passed)), default=None)
        low = self._low.get(partition)
        if low is not None and earliest is not None and APPLIED + earliest < low:
            self._low[partition] = APPLIED + earliest  # a restore's ids, applied long ago
        written: set[bytes] = set()
        for aggregate_id, request_id in requests:
            request = id_key(aggregate_id) + request_id.encode()
            at = date((aggregate_id, request_id))
            held = db.get(REQUEST + request)
            if held:  # applied before: its sweep entry moves to the latest time
                batch.delete(APPLIED + bytes(held)[:8] + request)
            batch.put(REQUEST + request, at)
            batch.put(APPLIED + at + request, b"")
            written.add(request)
        for aggregate_id, request_id in passed:
            request = id_key(aggregate_id) + request_id.encode()
            # Never over an id applied (a sibling event of the request folded): only an
            # id no event of which was folded is kept as passed over.
            if request not in written and db.get(REQUEST + request) is None:
                at = date((aggregate_id, request_id))
                batch.put(REQUEST + request, at + PASSED)
                batch.put(APPLIED + at + request, b"")
                written.add(request)
        if offset is not None:
            batch.put(OFFSET, str(offset).encode())
        db.write(batch)

    def expire_requests(self, partition: int, before: int, limit: int) -> int:
        if before < 0:
            return 0
        db = self._db(partition)
        upper = APPLIED + (before + 1).to_bytes(8, "big")
        low = self._low.get(partition, APPLIED)
        options = ReadOptions()
        options.set_iterate_upper_bound(upper)
        batch = WriteBatch(raw_mode=True)
        count = 0
        last = b""
        with self._reading(partition):
            for entry in cast(Iterator[bytes], db.keys(from_key=low, read_opt=options)):
                if count == limit:
                    break
                batch.delete(entry)
                batch.delete(REQUEST + entry[9:])
                count += 1
                last = entry
            if count < limit:
                self._ended(db, partition, options, last or low, skip=bool(count))
            if count:
                db.write(batch)
        del options  # kept alive through the scan (see rocksdb_io.scan)
        # Until compacted away, the tombstones of the entries forgotten would be stepped
        # over by every later scan from the front (one a commit).
        self._low[partition] = last if count else max(low, upper)
        return count

    def _ended(
        self, db: Rdict, partition: int, options: ReadOptions, start: bytes, *, skip: bool
    ) -> None:
        """Checks that a sweep's scan, which ended at `start` (`skip`: past it), reached
        the end of its range: `keys()` stops at a block it cannot read as at the end,
        silently (no sweep would forget the ids past it). A raw iterator from there, whose
        `status` tells, reads that block again; `StoreError` when it is not the end."""
        probe = db.iter(options)
        try:
            probe.seek(start)
            if skip and probe.valid() and bytes(probe.key()) == start:
                probe.next()
            probe.status()
            if probe.valid():
                self._bad.add(partition)  # (read again: the fault has passed, or moved)
                raise StoreError(
                    f"aggregate states {self._path(partition)}: a sweep stopped before "
                    f"{bytes(probe.key())!r}",
                    partition=partition,
                )
        finally:
            del probe  # a DB closes only once its iterators are gone (a drop may follow)

    def offset(self, partition: int) -> int | None:
        if (db := self._readable(partition)) is None:
            return None
        with self._reading(partition):
            value = db.get(OFFSET)
        return None if value is None else int(bytes(value))

    def drop(self, partition: int) -> None:
        db = self._dbs.pop(partition, None)
        self._low.pop(partition, None)
        path = self._path(partition)
        try:
            if db is not None:
                # Thrown away: closed all the same when its close's flush fails (a write
                # of it failed, and RocksDB refuses every later one), then removed.
                with contextlib.suppress(Exception):
                    db.close()
            shutil.rmtree(path)
        except Exception as exc:
            if path.exists():
                # Left in part, it must not be opened and read on as a whole copy.
                self._bad.add(partition)
                raise StoreError(
                    f"cannot drop the aggregate states {path}: {exc}", partition=partition
                ) from exc
        self._bad.discard(partition)

    def mark_bad(self, partition: int) -> None:
        self._bad.add(partition)

    def is_bad(self, partition: int) -> bool:
        return partition in self._bad

    def release(self, partition: int) -> None:
        """Closes a partition's DB (kept on disk, and its bad mark) when the node hands
        the partition off. A close that fails is a `StoreError` of the partition, its DB
        closed all the same (rocksdict lets it go whatever its close's flush says) and
        its copy marked bad: once one write of a DB failed (a full disk for a moment),
        RocksDB refuses every later one, the close's flush included."""
        db = self._dbs.pop(partition, None)
        self._low.pop(partition, None)
        if db is not None:
            self._close_db(partition, db)

    def close(self) -> None:
        """Closes every partition's DB, each whatever the others' closes raised; the first
        failure raised after (`release`'s)."""
        dbs, self._dbs = self._dbs, {}
        self._closed = True
        failed: StoreError | None = None
        for partition, db in dbs.items():
            try:
                self._close_db(partition, db)
            except StoreError as exc:
                failed = failed or exc
        if failed is not None:
            raise failed

    def _close_db(self, partition: int, db: Rdict) -> None:
        try:
            db.close()
        except Exception as exc:
            self._bad.add(partition)  # the next take drops it, and folds the log whole
            raise StoreError(
                f"closing the aggregate states {self._path(partition)} failed: {exc}",
                partition=partition,
            ) from exc
