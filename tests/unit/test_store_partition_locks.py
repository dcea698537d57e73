"""The timer store's write lock per partition (issue #19), on both backends: a write
held in one partition (its changelog sink, or a restore's flush, awaited) never holds up
a write of another; a write over several partitions waits for those it writes only; and
a `PartitionHandle` reaches its partition alone and refuses once it is let go.

Nothing here is timed: a write that is not held up is done within a few turns of the
event loop (`turns`); one that is held up is not done however many turns go by, until
the held write is let through (an asyncio event)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_store_contract import P, change, ref, timer

from tables import ChangelogRecord, StoreClosed, TimerStatus, open_timer_store
from tables.keys import encode_timer, row_key
from tables.partitioned import PartitionedStore

TURNS = 50
"""Loop turns a write not held up is given (it needs a handful)."""


class GatedSink:
    """A changelog sink that holds every write of a partition in `gated` until it is
    let through (`release`); `entered` is set once such a write is held."""

    def __init__(self, *gated: int) -> None:
        self.gated = set(gated)
        self.entered = asyncio.Event()
        self._open = asyncio.Event()
        self.records: list[ChangelogRecord] = []

    def release(self) -> None:
        self._open.set()

    async def __call__(self, records: list[ChangelogRecord]) -> None:
        if {r.partition for r in records} & self.gated:
            self.entered.set()
            await self._open.wait()
        self.records += records


async def turns(n: int = TURNS) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def start(coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
    return asyncio.get_running_loop().create_task(coroutine)


@pytest.fixture(params=["memory", "rocksdb"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return "memory://" if request.param == "memory" else f"rocksdb://{tmp_path / 'a'}"


@pytest.fixture
async def gated(url: str) -> AsyncIterator[tuple[PartitionedStore, GatedSink]]:
    """A store whose partition 0's writes wait in the sink until released."""
    sink = GatedSink(0)
    store = open_timer_store(url, partitions=P, changelog=sink)
    assert isinstance(store, PartitionedStore)
    yield store, sink
    sink.release()
    await store.close()


async def held_in_p0(store: PartitionedStore, sink: GatedSink) -> asyncio.Task[Any]:
    """A put of partition 0 holding its lock, waiting in the sink."""
    task = start(store.put(timer(ref("held"), partition=0)))
    await sink.entered.wait()
    return task


async def test_a_write_of_one_partition_is_not_held_up_by_anothers(
    gated: tuple[PartitionedStore, GatedSink],
) -> None:
    store, sink = gated
    held = await held_in_p0(store, sink)
    other = start(store.put(timer(ref("free"), partition=1)))
    await turns()
    assert other.done() and other.result() is True
    assert not held.done()
    sink.release()
    assert await held is True
    assert {r.partition for r in sink.records} == {0, 1}


async def test_every_kind_of_write_of_another_partition_goes_on(
    gated: tuple[PartitionedStore, GatedSink],
) -> None:
    store, sink = gated
    t = timer(ref("o"), partition=2)
    assert await store.put(t)
    held = await held_in_p0(store, sink)
    writes = [
        store.put_many([timer(ref("m"), partition=1), timer(ref("n"), partition=3)]),
        store.settle([change(t, status=TimerStatus.FIRING, due_at=5_000)]),
        store.pause(ref("o"), "k", 1),
        store.resume(ref("o"), "k", 1, 2_000),
        store.cancel(ref("o"), "k", 1),
        # A row found nowhere: its partition's handle looks there alone (the store itself
        # looks again under every partition's lock: it might be a put still in its sink).
        store.partition(2).cancel(ref("absent"), "k", 1),
        store.cancel_all(ref("m"), 1),
        store.expire(3, 10_000_000, 0, 10),
        store.apply_changelog(2, []),
        store.revoke({3}),
        store.assign({3}),
        store.drop(1),
    ]
    for write in writes:
        task = start(write)
        await turns()
        assert task.done(), write
        task.result()
    assert not held.done()
    sink.release()
    assert await held is True


async def test_a_write_over_several_partitions_waits_for_the_held_one_only(
    gated: tuple[PartitionedStore, GatedSink],
) -> None:
    store, sink = gated
    held = await held_in_p0(store, sink)
    over = start(store.put_many([timer(ref("a"), partition=3), timer(ref("b"), partition=0)]))
    await turns()
    assert not over.done()  # it writes partition 0 too
    alone = start(store.put(timer(ref("c"), partition=3)))
    await turns()
    # Partition 3's lock is taken only with partition 0's, in partition order: the write
    # waiting for 0 holds none of 3 meanwhile.
    assert alone.done() and alone.result() is True
    sink.release()
    assert await held is True
    assert [t.owner.id for t in await over] == ["a", "b"]


async def test_a_cancel_of_the_held_partitions_row_waits_for_its_write(
    url: str,
) -> None:
    sink = GatedSink()
    store = open_timer_store(url, partitions=P, changelog=sink)
    t = timer(ref("o"), partition=0)
    assert await store.put(t)
    sink.gated.add(0)
    settle = start(store.settle([change(t, status=TimerStatus.FIRING, due_at=9_000)]))
    await sink.entered.wait()
    cancel = start(store.cancel(t.owner, t.key, 1))
    await turns()
    assert not cancel.done()
    sink.release()
    assert await settle == 1
    assert await cancel is True  # the row as the settle left it, cancelled
    found = await store.find(t.owner, t.key)
    assert found is not None and found.status is TimerStatus.CANCELLED
    await store.close()


@pytest.mark.parametrize("through", ["store", "handle"])
@pytest.mark.parametrize("op", ["cancel", "pause", "cancel_all"])
async def test_an_owners_write_waits_for_a_put_of_its_row_still_in_its_sink(
    gated: tuple[PartitionedStore, GatedSink], op: str, through: str
) -> None:
    # The put is not in the store yet: a look without its lock finds nothing, and the
    # cancel (pause, cancel-all) must still come after it, never be lost before it.
    store, sink = gated
    t = timer(ref("o"), partition=0)
    where: Any = store if through == "store" else store.partition(0)
    put = start(where.put(t))
    await sink.entered.wait()
    if op == "cancel":
        write = start(where.cancel(t.owner, t.key, 1))
    elif op == "pause":
        write = start(where.pause(t.owner, t.key, 1))
    else:
        write = start(where.cancel_all(t.owner, 1))
    await turns()
    assert not write.done()
    sink.release()
    assert await put is True
    assert await write  # it found the row the put wrote
    found = await store.find(t.owner, t.key)
    assert found is not None
    assert found.status is (TimerStatus.PAUSED if op == "pause" else TimerStatus.CANCELLED)


async def test_close_waits_for_every_partitions_write(
    gated: tuple[PartitionedStore, GatedSink],
) -> None:
    store, sink = gated
    held = await held_in_p0(store, sink)
    closing = start(store.close())
    await turns()
    assert not closing.done()
    behind = start(store.put(timer(ref("behind"), partition=0)))
    await turns()
    sink.release()
    assert await held is True  # the write in flight lands before the close
    await closing
    with pytest.raises(StoreClosed):  # queued behind the close: finds the store closed
        await behind


async def test_a_restores_flush_holds_up_its_own_partition_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # RocksDB: restored rows are written without the WAL and flushed before the next
    # write of their partition, in a thread; that flush holds partition 0's lock alone.
    flushing = asyncio.Event()
    flushed = asyncio.Event()
    to_thread = asyncio.to_thread

    async def gated_to_thread(func: Any, /, *args: Any) -> Any:
        flushing.set()
        await flushed.wait()
        return await to_thread(func, *args)

    store = open_timer_store(f"rocksdb://{tmp_path / 'r'}", partitions=P)
    source = open_timer_store("memory://", partitions=P, changelog=None)
    t = timer(ref("restored"), partition=0)
    assert await source.put(t)
    await store.apply_changelog(0, [(0, row_key(t.owner, t.key), encode_timer(t))])
    monkeypatch.setattr(asyncio, "to_thread", gated_to_thread)  # the store's flush thread
    after_restore = start(store.put(timer(ref("next"), partition=0)))
    await flushing.wait()
    other = start(store.put(timer(ref("other"), partition=1)))
    await turns()
    assert other.done() and other.result() is True
    assert not after_restore.done()
    flushed.set()
    assert await after_restore is True
    await store.close()
    await source.close()


# --- handles ---------------------------------------------------------------------------


async def test_a_handle_reaches_its_partition_only(url: str) -> None:
    store = open_timer_store(url, partitions=P)
    assert isinstance(store, PartitionedStore)
    mine, theirs = timer(ref("a"), partition=1), timer(ref("b"), partition=2)
    handle = store.partition(1)
    assert await handle.put(mine)
    assert await store.put(theirs)
    assert await handle.find(mine.owner, mine.key) == mine
    assert await handle.find(theirs.owner, theirs.key) is None
    assert await handle.timers_of(theirs.owner) == []
    assert not await handle.cancel(theirs.owner, theirs.key, 1)
    assert await handle.cancel_all(theirs.owner, 1) == 0
    assert not await handle.pause(theirs.owner, theirs.key, 1)
    assert await handle.resume(theirs.owner, theirs.key, 1, 0) is None
    assert [x.id for x in await handle.due(10_000, 10)] == [mine.id]
    assert [r.id for r in await handle.due_rows(10_000, 10)] == [mine.id]
    assert handle.status_counts()[TimerStatus.PENDING] == 1
    assert (await handle.census(10_000)).partition == 1
    with pytest.raises(ValueError, match="partition 2"):
        await handle.put(theirs)
    with pytest.raises(ValueError, match="partition 2"):
        await handle.put_many([mine, theirs])
    with pytest.raises(ValueError, match="partition 2"):
        await handle.settle([change(theirs, status=TimerStatus.FIRING)])
    assert await handle.settle([change(mine, status=TimerStatus.FIRING, due_at=5_000)]) == 1
    assert await handle.pause(mine.owner, mine.key, 1)
    assert await handle.resume(mine.owner, mine.key, 1, 6_000) is not None
    assert await handle.cancel(mine.owner, mine.key, 1)
    assert await handle.expire(10_000_000, 0, 10) == 1
    assert await store.find(theirs.owner, theirs.key) == theirs
    await store.close()


async def test_a_handle_refuses_once_its_partition_is_revoked_even_if_served_again(
    url: str,
) -> None:
    store = open_timer_store(url, partitions=P)
    assert isinstance(store, PartitionedStore)
    handle = store.partition(1)
    assert handle.serving
    await store.revoke({1})
    assert not handle.serving
    t = timer(partition=1)
    calls: list[Coroutine[Any, Any, Any]] = [
        handle.put(t),
        handle.put_many([t]),
        handle.settle([change(t, status=TimerStatus.FIRING)]),
        handle.expire(0, 0, 1),
        handle.cancel(t.owner, t.key, 1),
        handle.pause(t.owner, t.key, 1),
        handle.resume(t.owner, t.key, 1, 0),
        handle.cancel_all(t.owner, 1),
        handle.apply_changelog([]),
        handle.due(0, 1),
        handle.due_rows(0, 1),
        handle.find(t.owner, t.key),
        handle.timers_of(t.owner),
        handle.census(0),
    ]
    await store.assign({1})  # served again: a new take's, not this handle's
    for call in calls:
        with pytest.raises(StoreClosed):
            await call
    with pytest.raises(StoreClosed):
        handle.status_counts()
    with pytest.raises(StoreClosed):
        handle.changelog_offset()
    fresh = store.partition(1)
    assert await fresh.put(t)  # a new handle, of the new serving, writes
    await store.drop(1)  # before a restore from the changelog alone: a new handle's too
    with pytest.raises(StoreClosed):
        fresh.changelog_offset()
    assert store.partition(1).changelog_offset() is None
    await store.revoke({1})
    with pytest.raises(StoreClosed):
        store.partition(1)
    await store.close()
    with pytest.raises(StoreClosed):
        store.partition(0)


async def test_a_handles_write_waiting_while_its_partition_is_retaken_is_refused(
    gated: tuple[PartitionedStore, GatedSink],
) -> None:
    store, sink = gated
    handle = store.partition(0)
    held = await held_in_p0(store, sink)
    # Queued on partition 0's lock in this order: the revoke, the assign, then the
    # handle's write (checked before it waited, and again once it holds the lock).
    revoke = start(store.revoke({0}))
    await turns()
    assign = start(store.assign({0}))
    await turns()
    write = start(handle.put(timer(ref("stale"), partition=0)))
    await turns()
    assert not write.done()
    sink.release()
    assert await held is True
    await revoke
    await assign
    with pytest.raises(StoreClosed):
        await write
    assert await store.find(ref("stale"), "k") is None


# --- the property, over any partitions held and any write -------------------------------


@settings(max_examples=60, deadline=None)
@given(
    held=st.sets(st.integers(0, P - 1), max_size=P),
    written=st.sets(st.integers(0, P - 1), min_size=1, max_size=P),
)
def test_a_write_waits_exactly_when_it_writes_a_held_partition(
    held: set[int], written: set[int]
) -> None:
    async def run() -> None:
        sink = GatedSink(*held)
        store = open_timer_store("memory://", partitions=P, changelog=sink)
        holders = [start(store.put(timer(ref(f"h{p}"), partition=p))) for p in sorted(held)]
        await turns()
        batch = [timer(ref(f"w{p}"), partition=p) for p in sorted(written, reverse=True)]
        write = start(store.put_many(batch))
        await turns()
        assert write.done() == (not held & written)
        sink.release()
        await asyncio.gather(*holders)
        assert len(await write) == len(written)
        await store.close()

    asyncio.run(run())


async def test_a_cancel_all_waiting_for_a_partition_meets_rows_written_meanwhile(
    url: str,
) -> None:
    sink = GatedSink()
    store = open_timer_store(url, partitions=P, changelog=sink)
    owner = ref("o")
    a = timer(owner, "a", partition=0)
    assert await store.put(a)
    sink.gated.add(0)
    settle = start(store.settle([change(a, status=TimerStatus.FIRING, due_at=9_000)]))
    await sink.entered.wait()
    cancel_all = start(store.cancel_all(owner, 1))
    await turns()
    assert not cancel_all.done()  # found a row in partition 0: waits for its lock
    assert await store.put(timer(owner, "b", partition=2))  # partition 2 is not held
    sink.release()
    assert await settle == 1
    assert await cancel_all == 2  # looked again once it held partition 0: b too
    assert {t.status for t in await store.timers_of(owner)} == {TimerStatus.CANCELLED}
    await store.close()
