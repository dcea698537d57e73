"""A take stopped or revoked while its timer table is restored from the changelog (a
rolling restart during a long restore) marks what it restored clean: the restore writes
without the WAL, and the store's revoke flushes it, each batch with its last offset. The
next take reads on from there, not from offset 0 again, and ends with the very table a
whole restore gives. A restore the store fails in is not marked: restored whole next."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any, cast

import pytest
from fakes import RunningNode, wait_until
from test_node_memory import PARTITIONS, SERVICE, TOPICS, schedule, task_of

from app.kafka import LogReader
from app.kafka.memory import MemoryLog
from app.node.task_state import TaskState
from app.timers.restore import restore_partition
from tables import StoreError, TimerStatus, TimerStore
from tables.partitioner import partition_of
from tables.rocksdb_store import RocksDBTimerStore
from tables.store import UnreadableRow

P = 1
OWNERS = [f"o{i}" for i in range(1, 999) if partition_of(f"o{i}", PARTITIONS) == P][:24]
AGAIN = OWNERS[:6]
"""Scheduled twice: their rows are written again later in the changelog."""
BATCH = 4
"""The records a read of the log hands over at most: a restore of many batches."""


class Restores:
    """Counts the changelog records each take's restore of P applies; once `cut_at`
    records were, the next batch of P waits for ever (till its take is cancelled), or
    raises a store fault (`failing`, once)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.runs: list[int] = []
        self.cut_at: int | None = None
        self.failing = False
        self.cut = asyncio.Event()
        apply = RocksDBTimerStore.apply_changelog

        async def restoring(
            store: TimerStore, reader: LogReader, topic: str, p: int, **kw: Any
        ) -> int:
            if p == P:
                self.runs.append(0)
            return await restore_partition(store, reader, topic, p, **kw)

        async def counted(
            store: RocksDBTimerStore, p: int, records: Iterable[tuple[int, bytes, bytes | None]]
        ) -> list[UnreadableRow]:
            records = list(records)
            if p == P and self.cut_at is not None and self.runs[-1] >= self.cut_at:
                self.cut.set()
                if self.failing:
                    self.cut_at = None
                    raise StoreError("the disk under partition 1 is gone", partition=P)
                await asyncio.Event().wait()
            if p == P:
                self.runs[-1] += len(records)
            return await apply(store, p, records)

        monkeypatch.setattr("app.node.partition_open.restore_partition", restoring)
        monkeypatch.setattr(RocksDBTimerStore, "apply_changelog", counted)


@pytest.fixture
async def log(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[MemoryLog]:
    reader = MemoryLog.reader

    def small(self: MemoryLog, **kw: Any) -> Any:
        return reader(self, **{**kw, "batch": BATCH})

    monkeypatch.setattr(MemoryLog, "reader", small)
    yield MemoryLog()


def changelog(log: MemoryLog) -> int:
    return len(log.records(TOPICS.timers_changelog, P))


async def written(log: MemoryLog, tmp_path: Path) -> int:
    """P's changelog written by a node "a" (its timers far off, none fires); its length."""
    a = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(a.runs)
        later = int(time.time() * 1000) + 3_600_000
        for owner in OWNERS:
            await schedule(log, owner, later)
        await wait_until(lambda: changelog(log) >= len(OWNERS), within=15)
        for owner in AGAIN:
            await schedule(log, owner, later + 60_000)
        await wait_until(lambda: changelog(log) >= len(OWNERS) + len(AGAIN), within=15)
    finally:
        await a.stop()
    return changelog(log)


def table(path: str) -> dict[bytes, bytes]:
    """Every entry of P's copy in the timer store at `path` (rows, indexes, offset)."""
    store = RocksDBTimerStore(path, PARTITIONS)
    try:
        return {cast(bytes, k): cast(bytes, v) for k, v in store._dbs[P].items()}  # raw mode
    finally:
        store._close()


async def restored_whole(log: MemoryLog, path: Path) -> dict[bytes, bytes]:
    """P's table as a whole restore of its changelog into an empty store gives it."""
    store = RocksDBTimerStore(str(path), PARTITIONS)
    try:
        await restore_partition(store, log.reader(), TOPICS.timers_changelog, P)
    finally:
        await store.close()
    return table(str(path))


@pytest.mark.parametrize("cut_by", ["a stop", "a revoke"])
async def test_a_take_cut_short_mid_restore_is_read_on_from_where_it_stopped(
    log: MemoryLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut_by: str
) -> None:
    total = await written(log, tmp_path)
    restores = Restores(monkeypatch)
    restores.cut_at = 3 * BATCH
    b = await RunningNode(log, tmp_path, "b", SERVICE, PARTITIONS).start()
    path = b.node.types[TOPICS.type_name].store._path  # type: ignore[attr-defined]
    marks = b.node.types[TOPICS.type_name].marks
    try:
        await wait_until(restores.cut.is_set)
        assert b.node._tasks[task_of(P)].state is TaskState.RESTORING
        before = restores.runs[-1]
        assert 0 < before < total and not marks._path(P).exists()
        restores.cut_at = None
        if cut_by == "a revoke":
            await b.node._revoked({(TOPICS.events, P)})
            assert marks._path(P).exists(), "what it restored: clean"
            assert b.node._consumer is not None
            await b.node._assigned(b.node._consumer.assignment())
            await wait_until(b.runs)
    finally:
        await b.stop()
    assert marks._path(P).exists()
    if cut_by == "a stop":
        again = await RunningNode(log, tmp_path, "b", SERVICE, PARTITIONS).start()
        try:
            await wait_until(again.runs)
            counts = again.node.types[TOPICS.type_name].store.status_counts(P)
            assert counts[TimerStatus.PENDING] == len(OWNERS)
        finally:
            await again.stop()
    # Read on from the last offset the cut restore applied: the rest of the changelog alone.
    assert restores.runs == [before, total - before], f"{total} records in all"
    assert changelog(log) == total
    whole = await restored_whole(log, tmp_path / "whole")
    assert len(whole) > 2 * len(OWNERS) and table(path) == whole


async def test_a_restore_the_store_failed_in_is_restored_whole_next(
    log: MemoryLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store fails in the restore: its copy is not trusted, and the take's next
    attempt restores it whole (never read on from what the failed write left)."""
    total = await written(log, tmp_path)
    restores = Restores(monkeypatch)
    restores.cut_at, restores.failing = 3 * BATCH, True
    b = await RunningNode(log, tmp_path, "b", SERVICE, PARTITIONS).start()
    path = b.node.types[TOPICS.type_name].store._path  # type: ignore[attr-defined]
    try:
        # The take fails, closes dirty and is tried again: from offset 0.
        await wait_until(b.runs, within=15)
    finally:
        await b.stop()
    assert restores.runs == [3 * BATCH, total]
    assert table(path) == await restored_whole(log, tmp_path / "whole")
