"""The TimerStore's `due_after`: `due()` from a place in the due index on, so that a long
run is read a bounded page at a time (`GET /timers/upcoming`), each page from where the
last one ended; the same contract on both backends (memory is the reference)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from test_store_contract import P, into, ref, timer

from tables import Timer, TimerStatus, TimerStore, open_timer_store
from tables.keys import row_key
from tables.store import DuePosition

FIRING = TimerStatus.FIRING


@pytest.fixture(params=["memory", "rocksdb"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[TimerStore]:
    url = "memory://" if request.param == "memory" else f"rocksdb://{tmp_path / 'a'}"
    opened = open_timer_store(url, partitions=P)
    yield opened
    await opened.close()


def place(t: Timer) -> DuePosition:
    return (t.due_at, t.id, row_key(t.owner, t.key))


async def filled(store: TimerStore) -> None:
    # Ids that need the key's escaping, one id kept by two owners (ties broken by row
    # key), ties across partitions, a FIRING claim, and rows in no due index.
    names = ["a", "a\x00", "a\x00b", "a\x01", "ab", "é", "\u4e2d", "A", "z\x00", "a"]
    for i, name in enumerate(names):
        owner = ref(f"o{i}")
        assert await store.put(timer(owner, id=name, due=1_000 + 100 * (i % 3), partition=i % P))
    await into(store, timer(ref("c"), id="c", partition=1), FIRING, due_at=1_150)
    await into(store, timer(ref("f"), id="f", partition=2), TimerStatus.FIRED)
    await into(store, timer(ref("p"), id="p", partition=3), TimerStatus.PARKED)


async def test_pages_read_from_each_ones_last_row_are_due_whole(store: TimerStore) -> None:
    await filled(store)
    every = set(range(P))
    for partitions, until in [(every, 10_000), (every, 1_100), ({1, 3}, 10_000), ({0}, 1_000)]:
        whole = await store.due(partitions, until, 100)
        assert await store.due_after(partitions, until, 100, None) == whole
        for size in (1, 2, 3):
            read: list[Timer] = []
            after: DuePosition | None = None
            while page := await store.due_after(partitions, until, size, after):
                assert len(page) <= size
                read += page
                after = place(page[-1])
            assert read == whole, (partitions, until, size)


async def test_a_place_between_entries_starts_at_the_next_one(store: TimerStore) -> None:
    await filled(store)
    whole = await store.due(set(range(P)), 10_000, 100)
    at_1100 = [t for t in whole if t.due_at >= 1_100]
    assert await store.due_after(set(range(P)), 10_000, 100, (1_100, "", b"")) == at_1100
    # Of one due time and id, the rows after the place's row key: an id two owners keep.
    both = [t for t in whole if (t.due_at, t.id) == (1_000, "a")]
    assert len(both) == 2
    after = await store.due_after(set(range(P)), 10_000, 100, (1_000, "a", b""))
    assert after[:2] == both
    assert await store.due_after(set(range(P)), 10_000, 100, place(both[0])) == after[1:]
    assert await store.due_after(set(range(P)), 10_000, 100, (99_999, "", b"")) == []


async def test_a_read_from_a_later_place_hides_no_earlier_row_from_due(
    store: TimerStore,
) -> None:
    """RocksDB scans the due index from a low-water mark it raises to the first entry a
    scan finds: a scan that starts later must not raise it past rows it did not read."""
    await filled(store)
    whole = await store.due(set(range(P)), 10_000, 100)
    for place_ in [(1_150, "", b""), (99_999, "", b""), place(whole[-1])]:
        await store.due_after(set(range(P)), 10_000, 100, place_)
        await store.due_after(set(range(P)), 1_100, 1, place_)
        assert await store.due(set(range(P)), 10_000, 100) == whole
        rows = await store.due_rows(set(range(P)), 10_000, 100)
        assert [r.timer() for r in rows] == whole


@pytest.mark.parametrize(
    "bad",
    [(-1, "a", b""), (True, "a", b""), (1 << 63, "a", b""), (1, 2, b""), (1, "a", "r")],
)
async def test_a_place_that_is_none_is_a_value_error(
    store: TimerStore, bad: tuple[object, object, object]
) -> None:
    with pytest.raises(ValueError, match="after"):
        await store.due_after({0}, 10_000, 1, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="after"):
        await store.due_after({0}, 10_000, 1, (1, "\ud800", b""))
    with pytest.raises(ValueError, match="limit"):
        await store.due_after({0}, 10_000, 0, None)
