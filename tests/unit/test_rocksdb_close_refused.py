"""A RocksDB DB one write of which failed (a full disk for a moment), as rocksdict 0.3.29
leaves it (a disk hunt, on a tmpfs filled up): every later write, flush and sync of it
fails even once space is back, and its `close()` raises a plain `Exception("IO error:
Writer has previous error.")` but closes it all the same (reopened, it holds what was
written before). Such a close is a `StoreError` of its partition, never a plain
`Exception`: a node's close of the partition took it for a bug and stopped the node, and
a store's close stopped at it, the other partitions' DBs left open and unsynced."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rocksdict import DbClosedError
from test_store_rocksdb_fast_paths import timer

from tables import StoreError, open_timer_store
from tables.aggregate_store import RocksAggregateStore

REFUSED = "IO error: Writer has previous error."


class WriteFailed:
    """A rocksdict DB whose writes fail from the `fails`-th on (1: the next), as a full
    disk leaves it: the first with ENOSPC, each later one (flushes and syncs too) with
    RocksDB's background error; its close closes it, then raises that error."""

    def __init__(self, db: Any, fails: int = 1) -> None:
        self.db, self.fails, self.failed = db, fails, False
        self.calls: list[str] = []

    def _refused(self) -> None:
        if self.failed:
            raise Exception(REFUSED)

    def write(self, *args: Any) -> None:
        self.calls.append("write")
        self._refused()
        self.fails -= 1
        if self.fails <= 0:
            self.failed = True
            raise Exception("IO error: No space left on device: While appending to file: 42.log")
        self.db.write(*args)

    def flush(self, wait: bool = True) -> None:
        self.calls.append("flush")
        self._refused()
        self.db.flush(wait)

    def flush_wal(self, sync: bool) -> None:
        self.calls.append("flush_wal")
        self._refused()
        self.db.flush_wal(sync)

    def close(self) -> None:
        self.calls.append("close")
        self.db.close()
        self._refused()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


async def test_a_revoke_of_a_db_whose_write_failed_is_the_partitions_store_error(
    tmp_path: Path,
) -> None:
    store = open_timer_store(f"rocksdb://{tmp_path / 't'}", partitions=2)
    s: Any = store
    try:
        await store.put(timer(0, 0, 1_000))
        db = s._dbs[0] = WriteFailed(s._dbs[0])
        with pytest.raises(StoreError, match="RocksDB write to partition 0 failed"):
            await store.put(timer(1, 0, 2_000))
        with pytest.raises(StoreError, match="Writer has previous error") as raised:
            await store.revoke({0})
        assert raised.value.partition == 0
        assert db.calls[-2:] == ["flush_wal", "close"] and 0 not in store.assigned
        # Closed all the same: opened again, it holds what was written before the fault.
        await store.assign({0})
        assert [t.id for t in await store.due({0}, 10_000, 10)] == ["t0"]
    finally:
        await store.close()


async def test_a_drop_of_a_db_whose_write_failed_drops_it(tmp_path: Path) -> None:
    """A retake's restore drops a copy that is not clean: the DB's refused close must not
    fail the drop (the take's attempt), its rows thrown away anyway."""
    store = open_timer_store(f"rocksdb://{tmp_path / 't'}", partitions=2)
    s: Any = store
    try:
        await store.put(timer(0, 0, 1_000))
        db = s._dbs[0] = WriteFailed(s._dbs[0])
        with pytest.raises(StoreError):
            await store.put(timer(1, 0, 2_000))
        await store.drop(0)
        assert db.calls[-1] == "close" and 0 in store.assigned
        assert await store.due({0}, 10_000, 10) == [] and store.changelog_offset(0) is None
        await store.put(timer(2, 0, 3_000))  # a new DB, written
        assert [t.id for t in await store.due({0}, 10_000, 10)] == ["t2"]
    finally:
        await store.close()


async def test_a_store_closes_every_partition_past_one_whose_close_is_refused(
    tmp_path: Path,
) -> None:
    store = open_timer_store(f"rocksdb://{tmp_path / 't'}", partitions=3)
    s: Any = store
    dbs = {p: WriteFailed(s._dbs[p]) for p in range(3)}
    dbs[0].failed = True  # a write of it failed before
    s._dbs.update(dbs)
    with pytest.raises(StoreError, match="Writer has previous error") as raised:
        await store.close()
    assert raised.value.partition == 0
    # The others synced and closed all the same.
    assert [dbs[p].calls for p in (1, 2)] == [["flush_wal", "close"]] * 2
    for p in (1, 2):
        with pytest.raises(DbClosedError):
            dbs[p].db.flush_wal(True)


def test_aggregate_states_whose_close_is_refused_are_released_and_marked_bad(
    tmp_path: Path,
) -> None:
    store = RocksAggregateStore(tmp_path)
    s: Any = store
    try:
        store.write(0, {"a": b"{}"}, [("a", "r1")], 7)
        store.write(1, {"b": b"{}"}, [("b", "r2")], 8)
        s._dbs[0] = WriteFailed(s._dbs[0])
        with pytest.raises(StoreError):
            store.write(0, {"a": b"{}"}, [], 9)
        with pytest.raises(StoreError, match="Writer has previous error") as raised:
            store.release(0)
        assert raised.value.partition == 0 and store.is_bad(0)
        store.drop(0)  # its next take's restore: folded again from the log
        assert store.offset(0) is None and not store.is_bad(0)
    finally:
        store.close()


def test_aggregate_states_close_every_partition_past_one_whose_close_is_refused(
    tmp_path: Path,
) -> None:
    store = RocksAggregateStore(tmp_path)
    s: Any = store
    for p in range(3):
        store.write(p, {"a": b"{}"}, [("a", "r1")], p)
    dbs = {p: WriteFailed(s._dbs[p]) for p in range(3)}
    dbs[0].failed = True
    s._dbs.update(dbs)
    with pytest.raises(StoreError, match="Writer has previous error") as raised:
        store.close()
    assert raised.value.partition == 0
    assert [dbs[p].calls for p in range(3)] == [["close"]] * 3
    reopened = RocksAggregateStore(tmp_path)  # every lock let go
    try:
        assert [reopened.offset(p) for p in range(3)] == [0, 1, 2]
    finally:
        reopened.close()
