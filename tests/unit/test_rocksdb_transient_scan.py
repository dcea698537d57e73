"""A scan that rocksdict ended early at a block it could not read *once* (a transient I/O
error: the check's fresh read of it succeeds) is a `StoreError` of its partition, not the
end of the index: taken for the end, the due scan moved its low-water mark past every row
it skipped, and later scans (from that mark) never saw them, those timers unfired until a
retake; the sweep's finished scan alike. The due and finished scans are read through in
one call, no write in between, so a row past where the scan ended is one it skipped."""

from __future__ import annotations

from itertools import islice
from pathlib import Path
from typing import Any

import pytest
from test_store_retention import timer as finished_timer
from test_store_rocksdb_fast_paths import record, timer

from tables import AggregateRef, StoreError, TimerStatus, TimerStore, open_timer_store
from tables.keys import DUE, FINISHED, PARKED, ROW


class _Short:
    """As rocksdict's items() at a block whose read failed this once: of the scans of the
    index that starts with `kind`, the one after `skip` others ends after `after` items."""

    def __init__(self, db: Any, kind: bytes, after: int, skip: int = 0) -> None:
        self.db, self.kind, self.after = db, kind, after
        self.skip: int | None = skip

    def items(self, *args: Any, **kwargs: Any) -> Any:
        items = self.db.items(*args, **kwargs)
        if self.skip is None or not kwargs.get("from_key", b"").startswith(self.kind):
            return items
        if self.skip:
            self.skip -= 1
            return items
        self.skip = None
        return islice(items, self.after)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


async def _store(path: Path, partitions: int, timers: list[Any]) -> TimerStore:
    store = open_timer_store(f"rocksdb://{path}", partitions=partitions)
    for p in range(partitions):
        rows = [t for t in timers if t.partition == p]
        await store.apply_changelog(p, [record(i, t) for i, t in enumerate(rows)])
        await store.end_restore(p)
    return store


@pytest.mark.parametrize("after", [0, 40])
async def test_a_transient_short_due_scan_fails_and_hides_no_row(
    tmp_path: Path, after: int
) -> None:
    timers = [timer(n, 0, 1_000 + n) for n in range(100)]
    store = await _store(tmp_path / "t", 1, timers)
    try:
        s: Any = store
        s._dbs[0] = _Short(s._dbs[0], DUE, after)
        for call in (store.due, store.due_rows):
            with pytest.raises(StoreError) as raised:
                await call({0}, 5_000, 1_000)
            assert raised.value.partition == 0
            s._dbs[0].skip = 0  # once more: the other call's scan
        s._dbs[0].skip = None
        # The I/O error is gone; the rows are all there, due long ago.
        assert len(await store.due({0}, 10_000, 1_000)) == len(timers)
        assert len(await store.due_rows({0}, 10_000, 1_000)) == len(timers)
    finally:
        await store.close()


async def test_a_transient_short_chunk_of_the_merge_fails(tmp_path: Path) -> None:
    """Two partitions: partition 0's first chunk is full (70 of 100), its second ends short."""
    timers = [timer(n, 0, 1_000 + n) for n in range(100)]
    store = await _store(tmp_path / "t", 2, timers)
    try:
        s: Any = store
        s._dbs[0] = _Short(s._dbs[0], DUE, 80)
        with pytest.raises(StoreError) as raised:
            await store.due_rows({0, 1}, 5_000, 100)
        assert raised.value.partition == 0
        assert len(await store.due_rows({0, 1}, 5_000, 100)) == len(timers)
    finally:
        await store.close()


async def test_a_due_scan_that_reaches_its_bound_is_no_fault(tmp_path: Path) -> None:
    """A row past `until`, under no bound of the scan's, is not taken for one it skipped."""
    timers = [timer(n, n % 2, 1_000 + n) for n in range(100)]
    store = await _store(tmp_path / "t", 2, timers)
    try:
        for until in (999, 1_000, 1_049, 1_099, 5_000):
            for limit in (1, 7, 30, 1_000):
                got = await store.due_rows({0, 1}, until, limit)
                assert len(got) == min(limit, max(0, until - 999), 100)
    finally:
        await store.close()


@pytest.mark.parametrize("after", [0, 40])
async def test_a_transient_short_finished_scan_fails_the_sweep_and_hides_no_row(
    tmp_path: Path, after: int
) -> None:
    timers = [finished_timer(n, due=1_000 + n, status=TimerStatus.FIRED) for n in range(100)]
    store = await _store(tmp_path / "t", 1, timers)
    try:
        s: Any = store
        s._dbs[0] = _Short(s._dbs[0], FINISHED, after)
        with pytest.raises(StoreError) as raised:
            await store.expire(0, 10_000, 0, 1_000)
        assert raised.value.partition == 0
        # Again, the I/O error gone: every row expires, none left behind.
        assert await store.expire(0, 10_000, 0, 1_000) == len(timers)
        assert await store.expire(0, 10_000, 0, 1_000) == 0
    finally:
        await store.close()


async def test_a_transient_short_parked_scan_fails(tmp_path: Path) -> None:
    target = AggregateRef(context="shop", aggregate="order", id="target")
    timers = [
        timer(n, n % 2, 1_000 + n).model_copy(
            update={"status": TimerStatus.PARKED, "target": target}
        )
        for n in range(100)
    ]
    store = await _store(tmp_path / "t", 2, timers)
    try:
        s: Any = store
        s._dbs[1] = _Short(s._dbs[1], PARKED, 10)
        with pytest.raises(StoreError) as raised:
            await store.parked(target)
        assert raised.value.partition == 1
        assert len(await store.parked(target)) == len(timers)
    finally:
        await store.close()


async def test_an_owner_scan_cut_short_fails_and_cancels_nothing_half(tmp_path: Path) -> None:
    """A review: an owner's `CancelAllTimers` whose scan a read error cut short (10 of 50
    rows) cancelled the 10 and said so: the other 40 stayed PENDING and would fire for an
    owner that was deleted. Now the call raises, and done again cancels every one."""
    base = timer(0, 0, 1_000)
    mine = [base.model_copy(update={"key": f"k{n:03d}", "id": f"t{n}"}) for n in range(50)]
    store = await _store(tmp_path / "t", 1, mine)
    try:
        s: Any = store
        s._dbs[0] = _Short(s._dbs[0], ROW, 10)
        with pytest.raises(StoreError) as raised:
            await store.cancel_all(base.owner, 99)
        assert raised.value.partition == 0
        s._dbs[0] = s._dbs[0].db
        assert await store.cancel_all(base.owner, 99) == 50
        left = [t for t in await store.timers_of(base.owner) if t.status is TimerStatus.PENDING]
        assert left == []
    finally:
        await store.close()


async def test_status_counts_cut_short_fail_rather_than_count_wrong(tmp_path: Path) -> None:
    timers = [timer(n, 0, 1_000 + n) for n in range(100)]
    store = await _store(tmp_path / "t", 1, timers)
    try:
        s: Any = store
        s._dbs[0] = _Short(s._dbs[0], DUE, 30)
        with pytest.raises(StoreError):
            store.status_counts(0)
        s._dbs[0] = s._dbs[0].db
        assert store.status_counts(0)[TimerStatus.PENDING] == 100
    finally:
        await store.close()
