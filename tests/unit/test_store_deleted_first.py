"""An owner's first deletion (`cancel_all`) after its partition was taken reads every row
the owner keeps, to know its live ones (`tables.live_rows`: later deletions read those
alone). Read whole in one turn of the event loop, an owner of 20,000 rows held it for
0.46-0.74 s on RocksDB. An owner of more rows than a chunk is now read a chunk at a time,
the loop given a turn between two, under the partition's write lock (no write of it
lands in between); what is cancelled is as before. Both backends."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_store_deleted_again import OWNER, mark, timer
from test_store_owner_chunks import Turns

import tables.partitioned_reads
from tables import ACTIVE, TimerStatus, open_timer_store
from tables.keys import owner_prefix, row_key
from tables.partitioned import PartitionedStore

N = 47
CHUNK = 10
LIVE = 3


class Reads:
    """The owner's rows the store read, by the loop's turn (whole or a chunk at a time)."""

    def __init__(self, store: Any, monkeypatch: pytest.MonkeyPatch, turns: Turns) -> None:
        self.by_turn: Counter[int] = Counter()
        owner_rows = store._owner_rows

        def whole(partition: int, prefix: bytes) -> Iterator[Any]:
            for found in owner_rows(partition, prefix):
                self.by_turn[turns.count] += 1
                yield found

        monkeypatch.setattr(store, "_owner_rows", whole)
        if (owner_chunk := getattr(store, "_owner_chunk", None)) is not None:

            def chunk(*args: Any) -> list[Any]:
                got: list[Any] = owner_chunk(*args)
                self.by_turn[turns.count] += len(got)
                return got

            monkeypatch.setattr(store, "_owner_chunk", chunk)


@pytest.fixture(params=["memory", "rocksdb"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[PartitionedStore]:
    monkeypatch.setattr(tables.partitioned_reads, "OWNER_CHUNK", CHUNK, raising=False)
    url = "memory://" if request.param == "memory" else f"rocksdb://{tmp_path / 'db'}"
    opened = open_timer_store(url, partitions=1)
    assert isinstance(opened, PartitionedStore)
    # N timers set and deleted (N CANCELLED rows and the deletion mark), then LIVE set
    # again; and the partition taken afresh: nothing known of the owner.
    await opened.put_many([timer(f"k{i:02}", i + 1) for i in range(N)])
    assert await opened.cancel_all(OWNER, N + 1, mark(N + 1)) == N
    await opened.put_many([timer(f"live{i}", N + 2) for i in range(LIVE)])
    await opened.revoke({0})
    await opened.assign({0})
    yield opened
    await opened.close()


async def test_the_first_deletion_after_a_take_reads_the_owners_rows_a_chunk_a_turn(
    store: PartitionedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    turns = Turns()
    reads = Reads(store, monkeypatch, turns)
    ticking = asyncio.create_task(turns.run())
    await asyncio.sleep(0)  # the ticker waits for its next turn
    try:
        cancelled = await store.partition(0).cancel_all(OWNER, N + 3, mark(N + 3))
    finally:
        turns.done = True
        await ticking
    assert cancelled == LIVE
    assert sum(reads.by_turn.values()) >= N + 1 + LIVE  # every row of it, read once at least
    assert max(reads.by_turn.values()) <= CHUNK, reads.by_turn
    for i in range(LIVE):
        held = await store.find(OWNER, f"live{i}")
        assert held is not None and held.status is TimerStatus.CANCELLED
    # Known since: the next deletion reads none of its rows.
    reads.by_turn.clear()
    assert await store.cancel_all(OWNER, N + 4, mark(N + 4)) == 0
    assert not reads.by_turn


async def test_writes_landing_while_the_deletion_reads_are_kept_known(
    store: PartitionedStore,
) -> None:
    """Puts and cancels of the owner land as the deletion reads (ready as it starts: after
    its first chunk; or once it reads under the partition's lock: after it): what is known
    of its live rows is what it holds, and the deletion cancels what was live when it
    wrote. The puts' keys sort before the rows read first (a key's length sorts first:
    `tables.keys.key_suffix`)."""
    deletion = asyncio.create_task(store.cancel_all(OWNER, N + 3, mark(N + 3)))
    early = asyncio.gather(store.put(timer("i", N + 5)), store.cancel(OWNER, "live1", N + 2))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    late = asyncio.gather(store.put(timer("j", N + 5)), store.cancel(OWNER, "live0", N + 2))
    cancelled = await deletion
    put_i, cancelled_1 = await early
    put_j, cancelled_0 = await late
    assert put_i and put_j  # set after the deletion: they stay
    assert cancelled + cancelled_0 + cancelled_1 == LIVE
    rows = await store.timers_of(OWNER)
    live = {row_key(OWNER, t.key) for t in rows if t.status in ACTIVE}
    assert live == {row_key(OWNER, "i"), row_key(OWNER, "j")}
    assert store._live[0].rows_of(owner_prefix(OWNER)) == live
    assert await store.cancel_all(OWNER, N + 6, mark(N + 6)) == 2
