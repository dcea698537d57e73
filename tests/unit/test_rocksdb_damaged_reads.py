"""RocksDB reads that fail raise `StoreError` of their partition, never a short answer nor
a plain `Exception`: a damaged block on disk ends rocksdict's `items()` silently (the
due scan answered 8,821 of 20,000 timers, the rest never fired), and rocksdict raises its
read faults ("IO error: ...", "Corruption: ...") as a plain `Exception`, which a cycle
took for its record's fault (the ScheduleSet dead-lettered, the timer lost). As a
`StoreError` the node closes the partition dirty and restores it from its changelog."""

from __future__ import annotations

import asyncio
import glob
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
from fakes import RunningNode, wait_until
from rocksdict import Rdict
from test_node_memory import PARTITIONS, SERVICE, TOPICS, events, schedule, task_of
from test_store_rocksdb_fast_paths import record, timer

from app.kafka.memory import MemoryLog
from app.protocol.dead_letters import DeadLetter
from app.protocol.topics import ContextTopics
from tables import StoreError, Timer, TimerStore, open_timer_store
from tables.partitioner import partition_of
from tables.rocksdb_restore import restore_batch

N = 5_000


def rot(db: Path) -> None:
    """A few bytes of a data block of the DB's largest SST file overwritten (bit rot)."""
    sst = max(glob.glob(str(db / "*.sst")), key=os.path.getsize)
    with open(sst, "r+b") as f:  # a third in: a data block, far from the index at the end
        f.seek(os.path.getsize(sst) // 3)
        f.write(b"\xde\xad\xbe\xef" * 64)


async def damaged(path: Path, partitions: int) -> tuple[TimerStore, list[Timer]]:
    """A store of `partitions` whose partition 0 holds N due timers, reopened after its
    SST file `rot`."""
    url = f"rocksdb://{path}"
    store = open_timer_store(url, partitions=partitions)
    timers = [timer(n, 0, 1_000 + n) for n in range(N)]
    await store.apply_changelog(0, [record(i, t) for i, t in enumerate(timers)])
    await store.end_restore(0)  # flushed to an SST
    assert len(await store.due({0}, 10**12, N + 1)) == N
    await store.close()
    rot(path / "p0.db")
    return open_timer_store(url, partitions=partitions), timers


@pytest.mark.parametrize("partitions", [1, 8])
async def test_a_damaged_block_fails_the_due_scan_of_its_partition(
    tmp_path: Path, partitions: int
) -> None:
    """1 partition: the scan's first chunk runs into the damage; 8: a later chunk of the
    merge does (each chunk is an eighth of the limit and a bit)."""
    store, _ = await damaged(tmp_path / "timers", partitions)
    try:
        for call in (store.due, store.due_rows):
            with pytest.raises(StoreError) as raised:
                await call(set(range(partitions)), 10**12, N + 1)
            assert raised.value.partition == 0
            assert "Corruption" in str(raised.value.__cause__), raised.value.__cause__
        # Rows before the damage are still read; a run that ends at its bound is no fault.
        assert len(await store.due_rows(set(range(partitions)), 1_000 + 99, N + 1)) == 100
    finally:
        await store.close()


async def test_a_damaged_block_fails_the_scans_and_point_reads_of_its_partition(
    tmp_path: Path,
) -> None:
    store, timers = await damaged(tmp_path / "timers", 1)
    try:
        with pytest.raises(StoreError) as raised:
            store.status_counts(0)  # a scan of the whole due index (`tables.rocksdb_io.scan`)
        assert raised.value.partition == 0
        faults: list[BaseException] = []
        for t in timers:
            try:
                await store.find(t.owner, t.key)
            except Exception as exc:  # which ones: checked below
                faults.append(exc)
        assert faults, "no row was in the damaged block"
        assert all(isinstance(e, StoreError) and e.partition == 0 for e in faults), faults[:3]
    finally:
        await store.close()


class _FailingReads:
    """A partition's DB whose next `fails` multi-gets raise as rocksdict does when RocksDB
    cannot read a block; all else is the DB's."""

    def __init__(self, db: Rdict, fails: int) -> None:
        self.db, self.fails, self.raised = db, fails, 0

    def get(self, key: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(key, list) and self.raised < self.fails:
            self.raised += 1
            raise Exception("IO error: While pread offset 4096 len 16384: Input/output error")
        return self.db.get(key, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[RunningNode]:
    n = await RunningNode(MemoryLog(), tmp_path, "a", SERVICE, PARTITIONS).start()
    yield n
    await n.stop()


async def test_a_read_fault_in_a_cycle_retakes_the_partition_and_the_timer_fires(
    node: RunningNode,
) -> None:
    log = node.node.clients
    assert isinstance(log, MemoryLog)
    await wait_until(node.runs)
    bad = 0
    owner = next(f"o{i}" for i in range(1, 99) if partition_of(f"o{i}", PARTITIONS) == bad)
    task = node.node._tasks[task_of(bad)]
    store: Any = node.node.types[TOPICS.type_name].store  # a RocksDB store: its own DBs
    # The carry-out of the ScheduleSet and its read-back, each retried put by put: a
    # record's fault would be dead-lettered after all four.
    failing = _FailingReads(store._db(bad), fails=4)
    store._dbs[bad] = cast(Rdict, failing)
    await schedule(log, owner, int(time.time() * 1000) + 300)
    await wait_until(lambda: failing.raised > 0)
    await wait_until(lambda: owner in [e.aggregate.id for e in events(log, "Fired")], within=15)
    await asyncio.sleep(0.5)  # a dead letter written late would show now
    letters = [
        DeadLetter.read(r.key, r.value, r.headers)
        for p in range(log.partitions(ContextTopics("mem").dead_letters))
        for r in log.records(ContextTopics("mem").dead_letters, p)
    ]
    assert not letters, [d.context.exception_message for d in letters]
    # Closed dirty and taken afresh: its DB reopened (restored from the changelog).
    assert node.node._tasks[task_of(bad)] is task and task.takes == 2
    assert store._dbs[bad] is not failing


@pytest.mark.parametrize("again", [False, True])
def test_a_restore_batchs_failed_read_of_old_entries_is_a_store_error_of_its_partition(
    tmp_path: Path, again: bool
) -> None:
    """The old index entries a restore batch reads back (a copy restored over, or a key an
    earlier batch of an emptied copy wrote): rocksdict's plain `Exception` there was no
    `StoreError` of the partition."""
    db = Rdict(str(tmp_path / "p3.db"))
    try:
        failing = _FailingReads(db, fails=1)
        records = [record(i, timer(i, 3, 1_000 + i)) for i in range(3)]
        restored = {hash(records[0][1])} if again else None
        with pytest.raises(StoreError) as raised:
            restore_batch(lambda: cast(Rdict, failing), 3, list(records), restored)
        assert raised.value.partition == 3
        assert "Input/output error" in str(raised.value)
    finally:
        db.close()
