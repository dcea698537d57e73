"""An owner deleted again (`cancel_all`, a `wow.AggregateDeleted` read) while nothing of it
is live reads none of the rows it keeps: its CANCELLED and FIRED rows stay for the
retention, and another writer may have set tens of thousands of them (no bound per
owner). Each deletion read and decoded them all, on the event loop: ten deletions of an
owner of 20,000 rows held it for 11 s (hunt F1). The live rows an owner was last seen
with are kept per partition (`tables.live_rows`), by every local write, and forgotten by
a restore; run against both backends."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tables import (
    AggregateRef,
    CommandSpec,
    OnceRule,
    Timer,
    TimerStatus,
    live_rows,
    open_timer_store,
)
from tables.exceptions import StoreError
from tables.keys import encode_timer, owner_prefix, row_key
from tables.live_rows import LiveRows
from tables.partitioned import PartitionedStore
from tables.rocksdb_store import RocksDBTimerStore
from tables.tombstones import CancelMark

OWNER = AggregateRef(context="shop", aggregate="order", id="o")
N = 40


def timer(key: str, version: int, owner: AggregateRef = OWNER) -> Timer:
    return Timer(
        id=f"{owner.id}/{key}/{version}",
        owner=owner,
        key=key,
        version=version,
        partition=0,
        rule=OnceRule(at=5_000),
        target=owner,
        command=CommandSpec(type="C"),
        slot_due_at=5_000,
        due_at=5_000,
    )


def mark(version: int) -> CancelMark:
    return CancelMark(0, f"deleted-{version}", 1_000)


class Reads:
    """Counts the rows the store read of an owner, each decoded: whole (`_owner_rows`) or
    a chunk at a time (`_owner_chunk`, the first deletion after a take)."""

    def __init__(self, store: PartitionedStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rows = 0
        owner_rows, owner_chunk = store._owner_rows, store._owner_chunk

        def counted(partition: int, prefix: bytes) -> Iterator[tuple[bytes, Timer]]:
            for found in owner_rows(partition, prefix):
                self.rows += 1
                yield found

        def chunk(*args: Any) -> list[tuple[bytes, Timer]]:
            got = owner_chunk(*args)
            self.rows += len(got)
            return got

        monkeypatch.setattr(store, "_owner_rows", counted)
        monkeypatch.setattr(store, "_owner_chunk", chunk)


@pytest.fixture(params=["memory", "rocksdb"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    url = "memory://" if request.param == "memory" else f"rocksdb://{tmp_path / 'db'}"
    opened = open_timer_store(url, partitions=1)
    assert isinstance(opened, PartitionedStore)
    yield opened
    await opened.close()


async def deleted_once(store: PartitionedStore) -> None:
    """N timers of OWNER set, then OWNER deleted: N CANCELLED rows kept, and its mark."""
    await store.put_many([timer(f"k{i}", i + 1) for i in range(N)])
    assert await store.cancel_all(OWNER, N + 1, mark(N + 1)) == N


async def test_a_deletion_that_finds_nothing_live_reads_none_of_the_owners_rows(
    store: PartitionedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await deleted_once(store)
    reads = Reads(store, monkeypatch)
    for version in range(N + 2, N + 12):
        assert await store.cancel_all(OWNER, version, mark(version)) == 0
    assert reads.rows == 0, f"ten deletions read {reads.rows} rows of the owner"
    # Its deletion mark moved on all the same: a set at the last version is passed over.
    assert not await store.put(timer("late", N + 11))
    held = await store.find(OWNER, "\x00deleted")
    assert held is not None and held.version == N + 11


async def test_an_owner_of_more_live_rows_than_kept_is_known_once_they_are_cancelled(
    store: PartitionedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its N live rows are too many to keep when read: the deletion that cancels them
    knows, under its locks still, that none is left."""
    monkeypatch.setattr(live_rows, "ROWS_LIMIT", N // 4)
    await deleted_once(store)
    reads = Reads(store, monkeypatch)
    assert await store.cancel_all(OWNER, N + 2, mark(N + 2)) == 0
    assert reads.rows == 0


async def test_a_timer_set_after_a_deletion_is_cancelled_by_the_next(
    store: PartitionedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await deleted_once(store)
    reads = Reads(store, monkeypatch)
    assert await store.put(timer("again", N + 5))
    assert await store.cancel_all(OWNER, N + 3, mark(N + 3)) == 0  # set later: kept
    assert await store.cancel_all(OWNER, N + 6, mark(N + 6)) == 1
    again = await store.find(OWNER, "again")
    assert again is not None and again.status is TimerStatus.CANCELLED
    assert reads.rows == 0


async def test_a_paused_or_parked_timer_stays_known_live(store: PartitionedStore) -> None:
    await deleted_once(store)
    assert await store.put(timer("p", N + 2))
    assert await store.pause(OWNER, "p", N + 2)
    assert await store.cancel_all(OWNER, N + 3, mark(N + 3)) == 1
    assert await store.put(timer("r", N + 4))
    assert await store.pause(OWNER, "r", N + 4)
    assert await store.resume(OWNER, "r", N + 4, 2_000) is not None
    assert await store.cancel_all(OWNER, N + 5, mark(N + 5)) == 1


async def test_rows_restored_since_a_deletion_are_read_again(
    store: PartitionedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restore writes rows no write of the store's own did: what was known of the owner
    is forgotten, and the next deletion reads its rows and cancels the restored one."""
    await deleted_once(store)
    restored = timer("restored", N + 2)
    key = row_key(OWNER, "restored")
    await store.apply_changelog(0, [(7, key, encode_timer(restored))])
    reads = Reads(store, monkeypatch)
    assert await store.cancel_all(OWNER, N + 3, mark(N + 3)) == 1
    assert reads.rows == N + 2  # its rows, the restored one and its deletion mark
    assert await store.cancel_all(OWNER, N + 4, mark(N + 4)) == 0
    assert reads.rows == N + 2  # known again since


async def test_a_partition_served_again_reads_the_owners_rows_again(
    store: PartitionedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await deleted_once(store)
    await store.revoke({0})
    await store.assign({0})
    reads = Reads(store, monkeypatch)
    assert await store.cancel_all(OWNER, N + 2, mark(N + 2)) == 0
    assert reads.rows == N + 1


async def test_a_rolled_back_cancel_leaves_its_rows_live_again(store: PartitionedStore) -> None:
    """A cancel whose commit did not land is written back (`PartitionHandle.roll_back`):
    the rows it cancelled are live again, and the next serving's deletion cancels them."""
    await store.put_many([timer(f"k{i}", i + 1) for i in range(3)])
    handle = store.partition(0)
    befores = {row_key(OWNER, f"k{i}"): await store.find(OWNER, f"k{i}") for i in range(3)}
    assert await handle.cancel_all(OWNER, 10, mark(10)) == 3
    befores[row_key(OWNER, "\x00deleted")] = None
    assert await handle.roll_back(befores) == 4
    known = store._live[0].rows_of(owner_prefix(OWNER))
    assert known == {row_key(OWNER, f"k{i}") for i in range(3)}  # live again, kept so
    await store.revoke({0})
    await store.assign({0})
    assert await store.cancel_all(OWNER, 10, mark(10)) == 3


def test_the_rows_kept_are_bounded() -> None:
    live = LiveRows(owners=2, rows=3)
    live.know(b"a", {b"a1"})
    live.know(b"b", {b"b1"})
    live.know(b"c", set())  # past 2 owners: "a", the least recently known, is forgotten
    assert live.rows_of(b"a") is None
    assert live.rows_of(b"b") == {b"b1"}  # now the most recently known
    live.know(b"c", {b"c1", b"c2"})  # 3 rows in all: kept
    live.wrote(b"c", b"c3", active=True)  # past 3 rows in all: "b" is forgotten
    assert live.rows_of(b"b") is None
    assert live.rows_of(b"c") == {b"c1", b"c2", b"c3"}
    live.wrote(b"c", b"c4", active=True)  # more than it keeps in all: forgotten
    assert live.rows_of(b"c") is None
    live.know(b"big", {b"1", b"2", b"3", b"4"})
    assert live.rows_of(b"big") is None
    live.know(b"d", {b"d1"})
    live.wrote(b"d", b"d1", active=False)
    live.wrote(b"x", b"x1", active=True)  # an owner not known: nothing kept
    assert live.rows_of(b"d") == set()
    assert live.rows_of(b"x") is None


async def test_a_write_landed_in_one_partition_of_two_is_not_missed(tmp_path: Path) -> None:
    """RocksDB writes a batch a partition in turn: when a later one fails, an earlier one
    has landed. What is kept of the partitions written is forgotten, so the owner's next
    deletion and the status counts read the landed rows (kept on, both missed them)."""
    store = open_timer_store(f"rocksdb://{tmp_path / 'db'}", partitions=2)
    assert isinstance(store, RocksDBTimerStore)
    other = AggregateRef(context="shop", aggregate="order", id="p")
    await store.put(timer("a", 1))
    assert await store.cancel_all(OWNER, 2) == 1  # read whole: its live rows kept
    assert store.status_counts(0)[TimerStatus.PENDING] == 0
    real = store._write

    def failing(partition: int, batch: Any, options: Any = None) -> None:
        if partition == 1 and options is None:
            raise StoreError("disk full", partition=1)
        real(partition, batch, options)

    store._write = failing  # type: ignore[method-assign]
    with pytest.raises(StoreError):
        # Partition 0's batch lands, partition 1's fails.
        await store.put_many(
            [timer("b", 3), timer("c", 1, other).model_copy(update={"partition": 1})]
        )
    store._write = real  # type: ignore[method-assign]
    held = await store.find(OWNER, "b")
    assert held is not None and held.status is TimerStatus.PENDING
    assert store.status_counts(0)[TimerStatus.PENDING] == 1
    assert await store.cancel_all(OWNER, 4) == 1
    held = await store.find(OWNER, "b")
    assert held is not None and held.status is TimerStatus.CANCELLED
    await store.close()
