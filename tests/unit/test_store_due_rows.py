"""The TimerStore's `due_rows`: `due()`'s rows, in its order, each built only when asked
(the same contract on both backends; memory is the reference)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from test_store_contract import P, change, into, ref, timer

from tables import DueRow, StoreClosed, Timer, TimerStatus, TimerStore, open_timer_store

FIRING = TimerStatus.FIRING


@pytest.fixture(params=["memory", "rocksdb"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[TimerStore]:
    url = "memory://" if request.param == "memory" else f"rocksdb://{tmp_path / 'a'}"
    opened = open_timer_store(url, partitions=P)
    yield opened
    await opened.close()


def unbuilt(rows: list[DueRow]) -> list[tuple[int, str, int, Timer]]:
    return [(r.due_at, r.id, r.partition, r.timer()) for r in rows]


def as_due(timers: list[Timer]) -> list[tuple[int, str, int, Timer]]:
    return [(t.due_at, t.id, t.partition, t) for t in timers]


async def test_due_rows_are_dues_rows_in_its_order(store: TimerStore) -> None:
    # Ids that need the key's escaping, ties across partitions, FIRING claims, and rows
    # in no due index.
    names = ["a", "a\x00", "a\x00b", "a\x01", "ab", "é", "\u4e2d", "A", "z\x00"]
    for i, name in enumerate(names):
        assert await store.put(
            timer(ref(f"o{i}"), id=name, due=1_000 + 100 * (i % 3), partition=i % P)
        )
    claimed = await into(store, timer(ref("c"), id="c", partition=1), FIRING, due_at=1_150)
    await into(store, timer(ref("f"), id="f", partition=2), TimerStatus.FIRED)
    await into(store, timer(ref("p"), id="p", partition=3), TimerStatus.PARKED)
    await into(store, timer(ref("h"), id="h", partition=0), TimerStatus.PAUSED)
    every = set(range(P))
    for partitions, until, limit in [
        (every, 10_000, 100),
        (every, 10_000, 4),
        (every, 1_100, 100),
        (every, 1_099, 1),
        ({1, 3}, 10_000, 100),
        ({0}, 999, 100),
        (set(), 10_000, 100),
    ]:
        due = await store.due(partitions, until, limit)
        assert unbuilt(await store.due_rows(partitions, until, limit)) == as_due(due)
    rows = await store.due_rows(every, 10_000, 100)
    assert len(rows) == len(names) + 1
    assert next(r for r in rows if r.id == "c").timer() == claimed


async def test_a_due_row_is_the_row_as_read_not_as_written_since(store: TimerStore) -> None:
    t = timer(due=1_000)
    assert await store.put(t)
    [row] = await store.due_rows({0}, 2_000, 10)
    claim = change(t, status=FIRING, due_at=9_000)
    assert await store.settle([claim]) == 1
    # Built after the claim: still the PENDING row it read, which a conditional write
    # against it (as loaded) must now fail on.
    assert row.timer() == t
    assert row.timer() is row.timer()  # built once
    assert await store.settle([change(row.timer(), status=FIRING, due_at=9_500)]) == 0
    assert unbuilt(await store.due_rows({0}, 10_000, 10)) == as_due([claim.next])


@pytest.mark.parametrize(
    ("partitions", "until", "limit", "error"),
    [
        ({P}, 0, 1, "partition"),
        ({-1}, 0, 1, "partition"),
        ({0}, 0, 0, "limit"),
        ({0}, 0, True, "limit"),
        ({0}, 1.5, 1, "until"),
    ],
)
async def test_due_rows_rejects_bad_arguments_as_due_does(
    store: TimerStore, partitions: set[int], until: int, limit: int, error: str
) -> None:
    for call in (store.due, store.due_rows):
        with pytest.raises(ValueError, match=error):
            await call(partitions, until, limit)


async def test_due_rows_of_a_revoked_partition_or_a_closed_store_is_store_closed(
    store: TimerStore,
) -> None:
    assert await store.put(timer(partition=1))
    await store.revoke({1})
    with pytest.raises(StoreClosed, match="partition 1"):
        await store.due_rows({1}, 10_000, 10)
    assert await store.due_rows({0}, 10_000, 10) == []
    await store.close()
    with pytest.raises(StoreClosed):
        await store.due_rows({0}, 10_000, 10)


def test_a_due_row_needs_its_bytes_or_its_timer() -> None:
    with pytest.raises(ValueError, match="bytes or its Timer"):
        DueRow(1, "a", 0)
    t = timer(id="x", due=5, partition=2)
    row = DueRow.of(t)
    assert (row.due_at, row.id, row.partition, row.timer()) == (5, "x", 2, t)
