"""The operator page's owner search (`owner_timers`) reads and decodes an owner's rows a
chunk at a time, the event loop given a turn between chunks: it read up to 10,000 rows in
one turn (~0.16 s for 20,000 rows on RocksDB, 0.24-0.27 s for 10,000 under load), the
loop that fires the node's timers held throughout. The same results and bounds (at most
`limit` held, the live ones first, of at most `scan_limit` read); both backends."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import tables.partitioned_reads
import tables.rocksdb_reads
from tables import AggregateRef, CommandSpec, OnceRule, StoreClosed, Timer, open_timer_store
from tables.owner_pick import OwnerPick, OwnerTimers
from tables.partitioned import PartitionedStore
from tables.rowload import load_timer
from tables.tombstones import CancelMark

OWNER = AggregateRef(context="shop", aggregate="order", id="o")
N = 47
CHUNK = 10


def timer(key: str, version: int = 1) -> Timer:
    return Timer(
        id=f"{OWNER.id}/{key}/{version}",
        owner=OWNER,
        key=key,
        version=version,
        partition=0,
        rule=OnceRule(at=5_000),
        target=OWNER,
        command=CommandSpec(type="C"),
        slot_due_at=5_000,
        due_at=5_000,
    )


@pytest.fixture(params=["memory", "rocksdb"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[PartitionedStore]:
    monkeypatch.setattr(tables.partitioned_reads, "OWNER_CHUNK", CHUNK)
    url = "memory://" if request.param == "memory" else f"rocksdb://{tmp_path / 'db'}"
    opened = open_timer_store(url, partitions=2)
    assert isinstance(opened, PartitionedStore)
    # N rows of one owner: every third cancelled, the rest live; and its deletion mark
    # (a row read, no timer: `tables.tombstones`).
    await opened.put_many([timer(f"k{i:02}", 2) for i in range(N)])
    for i in range(0, N, 3):
        assert await opened.cancel(OWNER, f"k{i:02}", 2)
    assert await opened.cancel_all(OWNER, 1, CancelMark(0, "deleted", 1_000)) == 0
    yield opened
    await opened.close()


async def reference(store: PartitionedStore, limit: int, scan_limit: int) -> OwnerTimers:
    """What one read took: the pick of the owner's first `scan_limit` rows."""
    rows = await store.timers_of(OWNER)
    pick = OwnerPick(limit)
    for t in rows[:scan_limit]:
        pick.add(t)
    return pick.result(complete=len(rows) <= scan_limit)


class Turns:
    def __init__(self) -> None:
        self.count = 0
        self.done = False

    async def run(self) -> None:
        while not self.done:
            await asyncio.sleep(0)
            self.count += 1


async def test_an_owners_rows_are_taken_and_decoded_a_chunk_a_turn(
    store: PartitionedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = await reference(store, 5, 10_000)
    turns = Turns()
    taken: Counter[int] = Counter()  # rows the pick took, by the loop's turn
    decoded: Counter[int] = Counter()  # rows RocksDB decoded, by the loop's turn

    class Counted(OwnerPick):
        def add(self, timer: Timer) -> None:
            taken[turns.count] += 1
            super().add(timer)

    def counted_load(*args: Any) -> Timer:
        decoded[turns.count] += 1
        return load_timer(*args)

    monkeypatch.setattr(tables.partitioned_reads, "OwnerPick", Counted)
    monkeypatch.setattr(tables.rocksdb_reads, "load_timer", counted_load)
    ticking = asyncio.create_task(turns.run())
    await asyncio.sleep(0)  # the ticker waits for its next turn
    try:
        got = await store.owner_timers(OWNER, limit=5, scan_limit=10_000)
    finally:
        turns.done = True
        await ticking
    assert got == expected
    assert sum(taken.values()) == N + 1  # its rows and its deletion mark
    assert max(taken.values()) <= CHUNK, taken
    assert len(taken) >= (N + 1) // CHUNK, taken  # not all in one turn
    assert not decoded or max(decoded.values()) <= CHUNK, decoded


@pytest.mark.parametrize("limit", [1, 5, N + 5])
async def test_the_chunks_take_what_one_read_took(store: PartitionedStore, limit: int) -> None:
    for scan_limit in (1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, N, N + 1, N + 2, 1_000):
        got = await store.owner_timers(OWNER, limit=limit, scan_limit=scan_limit)
        assert got == await reference(store, limit, scan_limit), (limit, scan_limit)
    nobody = AggregateRef(context="shop", aggregate="order", id="nobody")
    assert await store.owner_timers(nobody, limit=1, scan_limit=1) == OwnerTimers([], 0)


async def test_a_partition_let_go_between_two_chunks_ends_the_read(
    store: PartitionedStore,
) -> None:
    """The partition was revoked (its DB closed) while the search waited for its turn: the
    search answers StoreClosed (the page then reads the changelog), not rows of a
    partition no longer this node's, nor a read of a closed DB."""
    search = asyncio.create_task(store.owner_timers(OWNER, limit=5, scan_limit=10_000))
    await asyncio.sleep(0)  # its first chunk read
    await store.revoke({0})
    with pytest.raises(StoreClosed):
        await search
