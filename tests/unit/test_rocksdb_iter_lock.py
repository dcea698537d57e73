"""A failed scan keeps no RocksDB iterator alive. rocksdict closes a DB only once its
iterators are gone, and the `StoreError` of a scan that met a block it could not read kept
them through its traceback's frames (the check's iterator, a scan generator's, the due
merge's runs): the firing round keeps its fault in a reference cycle, which only a full
collection frees, seldom with the worker's collector tuning, so the partition's DB stayed
open past its revoke and every retake's open failed ("lock hold by current process") until
the node stopped. A LOCK this process still holds is also collected for, once, and the open
tried again; another process's never is."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from fakes import RunningNode, wait_until
from rocksdict import Rdict
from test_node_memory import PARTITIONS, SERVICE, TOPICS, schedule, task_of
from test_rocksdb_damaged_reads import N, damaged, rot
from test_store_rocksdb_fast_paths import record, timer

from app.kafka.memory import MemoryLog
from app.node.collector import tune_collector
from tables import AggregateRef, StoreError, TimerStatus, TimerStore, open_timer_store
from tables.partitioner import partition_of

# --- a real damaged block -----------------------------------------------------------------


@pytest.mark.parametrize("call", ["due_rows", "due", "status_counts", "census"])
async def test_a_held_scan_fault_keeps_no_iterator_the_db_closes_at_revoke(
    tmp_path: Path, call: str
) -> None:
    store, _ = await damaged(tmp_path / "timers", 1)
    held: list[BaseException] = []
    gc.disable()  # as a worker's seldom full collections: only reference counts free
    try:
        try:
            if call == "due_rows":
                await store.due_rows({0}, 10**12, N + 1)
            elif call == "due":
                await store.due({0}, 10**12, N + 1)
            elif call == "status_counts":
                store.status_counts(0)
            else:
                await store.census(0, 10**12)
        except StoreError as exc:
            held.append(exc)  # as PartitionFiring.fault keeps it
        assert held, "the damaged block went unnoticed"
        await store.revoke({0})
        await store.assign({0})  # the error still held: the DB closed all the same
    finally:
        gc.enable()
        held.clear()
        await store.close()


async def test_a_merge_fault_keeps_none_of_the_other_partitions_runs(tmp_path: Path) -> None:
    """8 partitions: the damage is met in a later chunk of the merge, the other partitions'
    runs still open (their rows due after all of partition 0's)."""
    store, _ = await damaged(tmp_path / "timers", 8)
    for p in range(1, 8):
        rows = [timer(N + 1_000 * p + n, p, 10**9 + n) for n in range(1_000)]
        await store.apply_changelog(p, [record(i, t) for i, t in enumerate(rows)])
        await store.end_restore(p)
    held: list[BaseException] = []
    gc.disable()
    try:
        try:
            await store.due_rows(set(range(8)), 10**12, N + 1)
        except StoreError as exc:
            held.append(exc)
        assert held and cast(StoreError, held[0]).partition == 0
        await store.revoke(set(range(8)))
        await store.assign(set(range(8)))
    finally:
        gc.enable()
        held.clear()
        await store.close()


async def test_a_parked_merge_fault_keeps_none_of_the_other_partitions_scans(
    tmp_path: Path,
) -> None:
    """Two partitions' timers parked on one target, partition 0's block damaged: its scan
    fails in the middle of the merge, partition 1's suspended there."""
    target = AggregateRef(context="shop", aggregate="order", id="target")
    url = f"rocksdb://{tmp_path / 'timers'}"
    store = open_timer_store(url, partitions=2)
    for p in range(2):
        rows = [
            timer(N * p + n, p, 1_000 + n).model_copy(
                update={"status": TimerStatus.PARKED, "target": target}
            )
            for n in range(N)
        ]
        await store.apply_changelog(p, [record(i, t) for i, t in enumerate(rows)])
        await store.end_restore(p)
    assert len(await store.parked(target)) == 2 * N
    await store.close()
    rot(tmp_path / "timers" / "p0.db")
    store = open_timer_store(url, partitions=2)
    held: list[BaseException] = []
    gc.disable()
    try:
        try:
            await store.parked(target)
        except StoreError as exc:
            held.append(exc)
        assert held and cast(StoreError, held[0]).partition == 0
        await store.revoke({0, 1})
        await store.assign({0, 1})
    finally:
        gc.enable()
        held.clear()
        await store.close()


# --- the open collects for a LOCK of this process's ---------------------------------------


async def _stored(path: Path) -> TimerStore:
    store = open_timer_store(f"rocksdb://{path}", partitions=1)
    rows = [timer(n, 0, 1_000 + n) for n in range(10)]
    await store.apply_changelog(0, [record(i, t) for i, t in enumerate(rows)])
    await store.end_restore(0)
    return store


class _Cycle:
    """Garbage that only a full collection frees, holding an iterator of a DB."""

    def __init__(self, it: Any) -> None:
        self.it, self.me = it, self


async def test_an_iterator_left_in_a_cycle_is_collected_and_the_open_tried_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = await _stored(tmp_path / "timers")
    gc.disable()
    try:
        s: Any = store
        _Cycle(s._db(0).iter())  # unreachable at once, freed by no reference count
        await store.revoke({0})
        with caplog.at_level(logging.WARNING, "tables.rocksdb_store"):
            await store.assign({0})
        assert "held by this process" in caplog.text
        assert len(await store.due({0}, 10**12, 100)) == 10, "the copy was not kept"
    finally:
        gc.enable()
        await store.close()


_HOLDER = """
import sys
from rocksdict import Options, Rdict
db = Rdict(sys.argv[1], Options(raw_mode=True))
print("held", flush=True)
sys.stdin.readline()
db.close()
"""


@pytest.fixture
def collections(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    made: list[int] = []
    collect = gc.collect

    def counted(generation: int = 2) -> int:
        made.append(generation)
        return collect(generation)

    monkeypatch.setattr(gc, "collect", counted)
    yield made


async def test_another_process_lock_is_never_collected_for_nor_the_copy_dropped(
    tmp_path: Path, collections: list[int]
) -> None:
    store = await _stored(tmp_path / "timers")
    try:
        await store.revoke({0})
        holder = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _HOLDER,
            str(tmp_path / "timers" / "p0.db"),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert holder.stdout is not None
            assert await asyncio.wait_for(holder.stdout.readline(), 30) == b"held\n"
            with pytest.raises(StoreError, match="LOCK") as refused:
                await store.assign({0})
            assert "lock hold by current process" not in str(refused.value)
            assert not collections, "collected for another process's lock"
        finally:
            await asyncio.wait_for(holder.communicate(b"\n"), 30)
        await store.assign({0})
        assert len(await store.due({0}, 10**12, 100)) == 10, "another holder's copy dropped"
    finally:
        await store.close()


# --- the node: a firing round's scan fault, its partition retaken -------------------------


class _Iter:
    def __init__(self, real: Any, fail: list[int]) -> None:
        self.real, self.fail = real, fail

    def seek(self, key: bytes) -> None:
        self.real.seek(key)

    def status(self) -> None:
        if self.fail[0] > 0:
            self.fail[0] -= 1
            self.real = None  # nothing of the check's iterator kept: only the scan's
            raise Exception("Corruption: block checksum mismatch: stored = 1, computed = 2")
        self.real.status()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


class _Damaged:
    """As rocksdict with a damaged block: items() end (here: at the index's end), the
    check's status() raises; real iterators underneath."""

    def __init__(self, db: Rdict, fails: int) -> None:
        self.db, self.fail = db, [fails]

    def iter(self, *args: Any, **kwargs: Any) -> Any:
        return _Iter(self.db.iter(*args, **kwargs), self.fail)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


@pytest.fixture
def log() -> MemoryLog:
    return MemoryLog()


@pytest.fixture
async def node(log: MemoryLog, tmp_path: Path) -> AsyncIterator[RunningNode]:
    n = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    yield n
    await n.stop()


@pytest.mark.parametrize("collector", ["disabled", "tuned"])
async def test_a_partition_whose_round_failed_a_scan_is_retaken(
    log: MemoryLog, node: RunningNode, collector: str
) -> None:
    messages: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())  # the text alone: no record kept

    handler = _Keep(logging.WARNING)
    logging.getLogger().addHandler(handler)
    await wait_until(node.runs)
    assert node.task is not None
    run = node.task
    bad = 0
    owner = next(f"o{i}" for i in range(1, 99) if partition_of(f"o{i}", PARTITIONS) == bad)
    task = node.node._tasks[task_of(bad)]
    store: Any = node.node.types[TOPICS.type_name].store
    damaged_db = _Damaged(store._db(bad), fails=1)
    store._dbs[bad] = cast(Rdict, damaged_db)
    thresholds = gc.get_threshold()
    if collector == "tuned":
        tune_collector(50_000)  # the worker's
    else:
        gc.disable()  # as a big heap: no full collection in the next seconds
    try:
        await schedule(log, owner, int(time.time() * 1000) + 300)
        await wait_until(lambda: damaged_db.fail[0] == 0, within=10)
        await wait_until(lambda: task.takes >= 2 or run.done(), within=40)
    finally:
        gc.enable()
        gc.set_threshold(*thresholds)
        gc.unfreeze()
        logging.getLogger().removeHandler(handler)
    assert not [m for m in messages if "lock hold" in m], messages
    assert task.takes >= 2 and not run.done()
