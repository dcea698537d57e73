"""The TimerStore's `firing`: the FIRING rows of partitions whatever their claims' deadlines
(a take-over claims them all again), read only as far as each partition's last one (the
same contract on both backends; memory is the reference)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from test_store_contract import P, ids, into, ref, timer

from tables import TimerStatus, TimerStore, open_timer_store

FIRING, PENDING = TimerStatus.FIRING, TimerStatus.PENDING
HOUR = 3_600_000


@pytest.fixture(params=["memory", "rocksdb"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[TimerStore]:
    url = "memory://" if request.param == "memory" else f"rocksdb://{tmp_path / 'a'}"
    opened = open_timer_store(url, partitions=P)
    yield opened
    await opened.close()


async def test_firing_is_every_claim_whatever_its_deadline_in_due_order(store: TimerStore) -> None:
    # Claims due now and an hour on (a clock ahead), a tie broken by id, PENDING rows
    # between them and after, and rows in no due index.
    await into(store, timer(ref("a"), id="a", partition=0), FIRING, due_at=1_030)
    await into(store, timer(ref("b"), id="b", partition=0), FIRING, due_at=HOUR)
    await into(store, timer(ref("c"), id="c", partition=1), FIRING, due_at=1_030)
    await into(store, timer(ref("d"), id="d", partition=1), FIRING, due_at=2 * HOUR)
    for i, due in enumerate([500, 2_000, HOUR - 1, 3 * HOUR]):
        await into(store, timer(ref(f"p{i}"), id=f"p{i}", partition=i % 2, due=due), PENDING)
    await into(store, timer(ref("f"), id="f", partition=0), TimerStatus.FIRED)
    await into(store, timer(ref("k"), id="k", partition=1), TimerStatus.PARKED)
    await into(store, timer(ref("h"), id="h", partition=0), TimerStatus.PAUSED)
    assert ids(await store.firing({0, 1}, 100)) == ["a", "c", "b", "d"]
    assert ids(await store.firing({0, 1}, 3)) == ["a", "c", "b"]
    assert ids(await store.firing({1, 2}, 100)) == ["c", "d"]
    assert await store.firing(set(), 100) == []
    with pytest.raises(ValueError, match="limit"):
        await store.firing({0}, 0)


async def test_a_partition_holding_no_claim_is_not_read(store: TimerStore) -> None:
    """Its count (kept with each write) says it holds none: its due index, a week of rows
    in a large partition, is not read at a take-over."""
    await into(store, timer(ref("p"), id="p", partition=0), PENDING)
    await into(store, timer(ref("a"), id="a", partition=1), FIRING, due_at=1_030)
    scanned: list[tuple[int, int]] = []
    backend: Any = store
    scan = backend._firing

    def counted(partition: int, count: int) -> list[Any]:
        scanned.append((partition, count))
        return list(scan(partition, count))

    backend._firing = counted
    assert ids(await store.firing({0, 1}, 100)) == ["a"]
    assert scanned == [(1, 1)]


async def test_a_partition_handle_answers_its_own_claims_alone(store: TimerStore) -> None:
    await into(store, timer(ref("a"), id="a", partition=0), FIRING, due_at=HOUR)
    await into(store, timer(ref("b"), id="b", partition=1), FIRING, due_at=1_030)
    assert ids(await store.partition(0).firing(100)) == ["a"]
