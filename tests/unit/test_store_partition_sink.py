"""A partition's own changelog sink (#19): its holder attaches it to the partition's handle
(`PartitionHandle.attach`, as a node's take attaches the partition's transaction) and the
partition's rows go there, whichever call wrote them (the handle's or the whole store's),
the other partitions' to the store's sink; once the partition is revoked (or dropped) and
served again, its rows go to the store's sink again until a new handle attaches its own.
A write over several partitions hands each sink its part, nothing written locally when
one fails (a sink called before the failing one holds its part). Both backends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fakes import make_timer

from tables import StoreClosed, StoreError, TimerStatus
from tables.backends import open_timer_store
from tables.partitioned import PartitionedStore
from tables.store import ChangelogRecord
from tables.timer import TimerChange


class Sink:
    def __init__(self) -> None:
        self.rows: list[tuple[int, str]] = []
        self.failing = False

    async def __call__(self, records: list[ChangelogRecord]) -> None:
        if self.failing:
            raise ConnectionError("broker down")
        self.rows += [(r.partition, r.key.decode(errors="replace")[-1]) for r in records]


@pytest.fixture(params=["memory", "rocksdb"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[PartitionedStore]:
    url = "memory://" if request.param == "memory" else f"rocksdb://{tmp_path / 'timers'}"
    s = open_timer_store(url, partitions=3, changelog=Sink())
    assert isinstance(s, PartitionedStore)
    await s.assign({0, 1, 2})
    yield s
    await s.close()


def shared(store: PartitionedStore) -> Sink:
    assert isinstance(store._sink, Sink)
    return store._sink


async def test_a_partitions_rows_go_to_the_sink_its_handle_attached(
    store: PartitionedStore,
) -> None:
    own = Sink()
    handle = store.partition(1)
    handle.attach(own)
    assert await handle.put(make_timer(id="a", key="a", partition=1))
    assert await store.put(make_timer(id="b", key="b", partition=1))  # the whole store's
    assert await store.put(make_timer(id="c", key="c", partition=2))
    assert own.rows == [(1, "a"), (1, "b")] and shared(store).rows == [(2, "c")]
    # One write over two partitions: each sink its part.
    a = await store.find(make_timer().owner, "a")
    c = await store.find(make_timer().owner, "c")
    assert a is not None and c is not None
    fired = [
        TimerChange(loaded=t, next=t.model_copy(update={"status": TimerStatus.FIRED}))
        for t in (a, c)
    ]
    assert await store.settle(fired) == 2
    assert own.rows[-1] == (1, "a") and shared(store).rows[-1] == (2, "c")


async def test_a_revoked_partitions_rows_no_longer_go_to_its_old_handles_sink(
    store: PartitionedStore,
) -> None:
    own = Sink()
    handle = store.partition(1)
    handle.attach(own)
    await store.revoke({1})
    await store.assign({1})
    with pytest.raises(StoreClosed):
        handle.attach(Sink())  # refused, as its writes
    assert await store.put(make_timer(id="a", key="a", partition=1))
    assert own.rows == [] and shared(store).rows == [(1, "a")]
    newer = Sink()
    store.partition(1).attach(newer)
    assert await store.put(make_timer(id="b", key="b", partition=1))
    assert newer.rows == [(1, "b")]


async def test_nothing_is_written_when_a_partitions_own_sink_fails(
    store: PartitionedStore,
) -> None:
    own = Sink()
    store.partition(1).attach(own)
    own.failing = True
    with pytest.raises(StoreError, match="changelog sink failed"):
        await store.put(make_timer(id="a", key="a", partition=1))
    assert await store.find(make_timer().owner, "a") is None
