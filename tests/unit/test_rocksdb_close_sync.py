"""A partition's RocksDB copy is synced to disk as the store lets it go: the node marks a
copy clean once its store closed it, and RocksDB's write-ahead log, written unsynced,
would lose its tail to a power loss under that mark (a disk hunt). A sync that fails is a
`StoreError` of the partition (the copy is not marked), and the DB is closed all the same."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_store_rocksdb_fast_paths import timer

from tables import StoreError, open_timer_store


class _Spy:
    def __init__(self, db: Any, calls: list[str], fail: bool = False) -> None:
        self.db, self.calls, self.fail = db, calls, fail

    def flush_wal(self, sync: bool) -> None:
        self.calls.append(f"flush_wal({sync})")
        if self.fail:
            raise Exception("IO error: No space left on device")
        self.db.flush_wal(sync)

    def close(self) -> None:
        self.calls.append("close")
        self.db.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


async def test_a_revoked_partition_is_synced_before_it_closes(tmp_path: Path) -> None:
    store = open_timer_store(f"rocksdb://{tmp_path / 't'}", partitions=2)
    try:
        await store.assign({0, 1})
        await store.put(timer(0, 0, 1_000))
        calls: list[str] = []
        s: Any = store
        s._dbs[0] = _Spy(s._dbs[0], calls)
        await store.revoke({0})
        assert calls == ["flush_wal(True)", "close"]
    finally:
        await store.close()


async def test_a_sync_that_fails_is_the_partitions_error_and_still_closes(
    tmp_path: Path,
) -> None:
    store = open_timer_store(f"rocksdb://{tmp_path / 't'}", partitions=2)
    calls: list[str] = []
    try:
        await store.assign({0, 1})
        s: Any = store
        s._dbs[0] = _Spy(s._dbs[0], calls, fail=True)
        with pytest.raises(StoreError, match="cannot sync") as raised:
            await store.revoke({0})
        assert raised.value.partition == 0
        assert calls == ["flush_wal(True)", "close"]
        await store.assign({0})  # closed: opened again
    finally:
        await store.close()
