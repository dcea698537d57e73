"""The aggregate state store: each aggregate's folded state and the request ids it applied.

A view of the log, like the TimerStore: per partition, restored by folding the events
topic from the store's last offset, so it never needs a changelog of its own. The node
writes a transaction's new states, request ids and the last event offset in one batch
after the transaction committed; a crash in between is mended by the restore.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Protocol

from rocksdict import Options, Rdict, WriteBatch

from tables.exceptions import StoreClosed

__all__ = ["AggregateStateStore", "MemoryAggregateStore", "RocksAggregateStore"]

_STATE = b"a"
_REQUEST = b"q"
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
    ) -> None:
        """Writes `states` and the applied `(aggregate id, request id)`s, and the offset."""
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
        self._requests: set[tuple[int, str, str]] = set()
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
    ) -> None:
        self._check()
        for aggregate_id, state in states.items():
            self._states[(partition, aggregate_id)] = state
        self._requests.update((partition, a, r) for a, r in requests)
        if offset is not None:
            self._offsets[partition] = offset

    def offset(self, partition: int) -> int | None:
        self._check()
        return self._offsets.get(partition)

    def drop(self, partition: int) -> None:
        self._states = {k: v for k, v in self._states.items() if k[0] != partition}
        self._requests = {k for k in self._requests if k[0] != partition}
        self._offsets.pop(partition, None)

    def close(self) -> None:
        self._closed = True


class RocksAggregateStore:
    """One RocksDB per partition under `directory`, opened on first use."""

    def __init__(self, directory: Path) -> None:
        self._dir = directory
        self._dir.mkdir(parents=True, exist_ok=True)
        self._dbs: dict[int, Rdict] = {}
        self._closed = False
        self._options = Options(raw_mode=True)
        self._options.create_if_missing(True)
        self._options.set_write_buffer_size(8 * 1024 * 1024)
        self._options.set_max_write_buffer_number(2)

    def _db(self, partition: int) -> Rdict:
        if self._closed:
            raise StoreClosed("aggregate store is closed")
        db = self._dbs.get(partition)
        if db is None:
            db = Rdict(str(self._dir / f"p{partition}.db"), self._options)
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
    ) -> None:
        db = self._db(partition)
        batch = WriteBatch(raw_mode=True)
        for aggregate_id, state in states.items():
            batch.put(_STATE + _id(aggregate_id), state)
        for aggregate_id, request_id in requests:
            batch.put(_REQUEST + _id(aggregate_id) + request_id.encode(), b"")
        if offset is not None:
            batch.put(_OFFSET, str(offset).encode())
        db.write(batch)

    def offset(self, partition: int) -> int | None:
        value = self._db(partition).get(_OFFSET)
        return None if value is None else int(bytes(value))

    def drop(self, partition: int) -> None:
        db = self._dbs.pop(partition, None)
        if db is not None:
            db.close()
        shutil.rmtree(self._dir / f"p{partition}.db", ignore_errors=True)

    def release(self, partition: int) -> None:
        """Closes a partition's DB (kept on disk) when the node hands the partition off."""
        db = self._dbs.pop(partition, None)
        if db is not None:
            db.close()

    def close(self) -> None:
        for db in self._dbs.values():
            db.close()
        self._dbs.clear()
        self._closed = True
