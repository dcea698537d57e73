"""The aggregate state store: each aggregate's folded state and the request ids it applied.

A view of the log, like the TimerStore: per partition, restored by folding the events
topic from the store's last offset, so it never needs a changelog of its own. The node
writes a transaction's new states, request ids and the last event offset in one batch
after the transaction committed; a crash in between is mended by the restore.

Each request id is kept with when it was applied, so that ids older than the
de-duplication window can be forgotten (`expire_requests`, in bounded batches, oldest
first): a command sent again with such an id is applied again.
"""

from __future__ import annotations

import heapq
import shutil
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Protocol, cast

from rocksdict import BlockBasedOptions, Options, Rdict, ReadOptions, WriteBatch

from tables.exceptions import StoreClosed

__all__ = ["AggregateStateStore", "MemoryAggregateStore", "RocksAggregateStore"]

_STATE = b"a"
_REQUEST = b"q"
_APPLIED = b"w"
"""`w` + applied at (8 bytes, big-endian) + the request's `q` key minus its `q`: the
request ids in the order they were applied, for the sweep."""
_OFFSET = b"\x00events-offset"


def _id(aggregate_id: str) -> bytes:
    raw = aggregate_id.encode()
    return len(raw).to_bytes(2, "big") + raw


class AggregateStateStore(Protocol):
    """States are opaque bytes here (the service layer's JSON); one store per aggregate type."""

    def get(self, partition: int, aggregate_id: str) -> bytes | None: ...

    def seen(self, partition: int, aggregate_id: str, request_id: str) -> bool: ...

    def write(
        self,
        partition: int,
        states: Mapping[str, bytes],
        requests: Iterable[tuple[str, str]],
        offset: int | None,
        applied_at: int = 0,
    ) -> None:
        """Writes `states` and the applied `(aggregate id, request id)`s (applied at
        `applied_at`, epoch ms), and the offset."""
        ...

    def expire_requests(self, partition: int, before: int, limit: int) -> int:
        """Forgets up to `limit` request ids applied at or before `before`, oldest first;
        how many."""
        ...

    def offset(self, partition: int) -> int | None:
        """The last events offset folded in, or None."""
        ...

    def drop(self, partition: int) -> None:
        """Forgets the partition (before a restore from the start)."""
        ...

    def close(self) -> None: ...


class MemoryAggregateStore:
    """The reference backend."""

    def __init__(self) -> None:
        self._states: dict[tuple[int, str], bytes] = {}
        self._requests: dict[tuple[int, str, str], int] = {}
        # Per partition, no request id of it was applied before this (a sweep with nothing
        # to forget looks at none).
        self._oldest: dict[int, int] = {}
        self._offsets: dict[int, int] = {}
        self._closed = False

    def _check(self) -> None:
        if self._closed:
            raise StoreClosed("aggregate store is closed")

    def get(self, partition: int, aggregate_id: str) -> bytes | None:
        self._check()
        return self._states.get((partition, aggregate_id))

    def seen(self, partition: int, aggregate_id: str, request_id: str) -> bool:
        self._check()
        return (partition, aggregate_id, request_id) in self._requests

    def write(
        self,
        partition: int,
        states: Mapping[str, bytes],
        requests: Iterable[tuple[str, str]],
        offset: int | None,
        applied_at: int = 0,
    ) -> None:
        self._check()
        for aggregate_id, state in states.items():
            self._states[(partition, aggregate_id)] = state
        for a, r in requests:
            # As the RocksDB store: one entry a request id, at its latest write.
            self._requests[(partition, a, r)] = applied_at
            self._oldest[partition] = min(self._oldest.get(partition, applied_at), applied_at)
        if offset is not None:
            self._offsets[partition] = offset

    def expire_requests(self, partition: int, before: int, limit: int) -> int:
        self._check()
        if before < self._oldest.get(partition, before + 1):
            return 0
        held = [
            (at, _id(a) + r.encode(), (p, a, r))
            for (p, a, r), at in self._requests.items()
            if p == partition
        ]
        doomed = heapq.nsmallest(limit, (h for h in held if h[0] <= before))
        for _, _, key in doomed:
            del self._requests[key]
        gone = {key for _, _, key in doomed}
        left = [at for at, _, key in held if key not in gone]
        self._oldest[partition] = min(left, default=before + 1)
        return len(doomed)

    def offset(self, partition: int) -> int | None:
        self._check()
        return self._offsets.get(partition)

    def drop(self, partition: int) -> None:
        self._states = {k: v for k, v in self._states.items() if k[0] != partition}
        self._requests = {k: v for k, v in self._requests.items() if k[0] != partition}
        self._oldest.pop(partition, None)
        self._offsets.pop(partition, None)

    def close(self) -> None:
        self._closed = True


class RocksAggregateStore:
    """One RocksDB per partition under `directory`, opened on first use."""

    def __init__(self, directory: Path) -> None:
        self._dir = directory
        self._dir.mkdir(parents=True, exist_ok=True)
        self._dbs: dict[int, Rdict] = {}
        # Per partition, no request id's sweep entry is below this key (the last one
        # forgotten): a sweep scans from it, not over the tombstones of those before.
        self._low: dict[int, bytes] = {}
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

    def _db(self, partition: int) -> Rdict:
        if self._closed:
            raise StoreClosed("aggregate store is closed")
        db = self._dbs.get(partition)
        if db is None:
            # The default family's options given too: else rocksdict opens an existing DB
            # with those of its last OPTIONS file, not these (the timer store's alike).
            db = Rdict(
                str(self._dir / f"p{partition}.db"),
                self._options,
                column_families={"default": self._options},
            )
            self._dbs[partition] = db
        return db

    def get(self, partition: int, aggregate_id: str) -> bytes | None:
        value = self._db(partition).get(_STATE + _id(aggregate_id))
        return None if value is None else bytes(value)

    def seen(self, partition: int, aggregate_id: str, request_id: str) -> bool:
        key = _REQUEST + _id(aggregate_id) + request_id.encode()
        return self._db(partition).get(key) is not None

    def write(
        self,
        partition: int,
        states: Mapping[str, bytes],
        requests: Iterable[tuple[str, str]],
        offset: int | None,
        applied_at: int = 0,
    ) -> None:
        db = self._db(partition)
        batch = WriteBatch(raw_mode=True)
        for aggregate_id, state in states.items():
            batch.put(_STATE + _id(aggregate_id), state)
        at = max(applied_at, 0).to_bytes(8, "big")
        low = self._low.get(partition)
        if low is not None and _APPLIED + at < low:
            self._low[partition] = _APPLIED + at  # a restore's ids, applied long ago
        for aggregate_id, request_id in requests:
            request = _id(aggregate_id) + request_id.encode()
            held = db.get(_REQUEST + request)
            if held:  # applied before: its sweep entry moves to the latest time
                batch.delete(_APPLIED + bytes(held) + request)
            batch.put(_REQUEST + request, at)
            batch.put(_APPLIED + at + request, b"")
        if offset is not None:
            batch.put(_OFFSET, str(offset).encode())
        db.write(batch)

    def expire_requests(self, partition: int, before: int, limit: int) -> int:
        if before < 0:
            return 0
        db = self._db(partition)
        upper = _APPLIED + (before + 1).to_bytes(8, "big")
        low = self._low.get(partition, _APPLIED)
        options = ReadOptions()
        options.set_iterate_upper_bound(upper)
        batch = WriteBatch(raw_mode=True)
        count = 0
        last = b""
        for entry in cast(Iterator[bytes], db.keys(from_key=low, read_opt=options)):
            if count == limit:
                break
            batch.delete(entry)
            batch.delete(_REQUEST + entry[9:])
            count += 1
            last = entry
        del options  # kept alive through the scan (see rocksdb_io.scan)
        if count:
            db.write(batch)
        # Until compacted away, the tombstones of the entries forgotten would be stepped
        # over by every later scan from the front (one a commit).
        self._low[partition] = last if count else max(low, upper)
        return count

    def offset(self, partition: int) -> int | None:
        value = self._db(partition).get(_OFFSET)
        return None if value is None else int(bytes(value))

    def drop(self, partition: int) -> None:
        db = self._dbs.pop(partition, None)
        self._low.pop(partition, None)
        if db is not None:
            db.close()
        shutil.rmtree(self._dir / f"p{partition}.db", ignore_errors=True)

    def release(self, partition: int) -> None:
        """Closes a partition's DB (kept on disk) when the node hands the partition off."""
        db = self._dbs.pop(partition, None)
        self._low.pop(partition, None)
        if db is not None:
            db.close()

    def close(self) -> None:
        for db in self._dbs.values():
            db.close()
        self._dbs.clear()
        self._closed = True
