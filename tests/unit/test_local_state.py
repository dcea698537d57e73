"""A data directory written against another Kafka cluster is dropped before it is read
(issue 10, item 1: TICKWHEEL_DATA_DIR reused against another cluster), every type's copy
in it, and a data directory is one worker's alone (`DataDirLock`)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakes import RunningNode, wait_until
from pydantic import BaseModel
from test_node_memory import PARTITIONS, SERVICE, TOPICS, schedule, timer_rows

from app.errors import ConfigError
from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType
from app.node.local_state import CleanMark, CleanMarks, DataDirLock, keep_for_cluster
from app.service import Service
from tables import AggregateRef


class Nothing(BaseModel):
    pass


OTHER = Service(aggregates=(AggregateType("mem", "other", Nothing),))
"""A service of another type alone."""


def state_of(data: Path, name: str) -> Path:
    (data / name / "timers").mkdir(parents=True)
    (data / name / "timers" / "000001.sst").write_bytes(b"rows")
    return data / name


def test_a_first_run_marks_the_directory_and_keeps_what_is_there(tmp_path: Path) -> None:
    kept = state_of(tmp_path, "shop.order")
    assert keep_for_cluster(tmp_path, "c-1") == []
    assert kept.exists() and (tmp_path / "cluster-id").read_text() == "c-1\n"


def test_the_same_cluster_keeps_the_local_state(tmp_path: Path) -> None:
    keep_for_cluster(tmp_path, "c-1")
    kept = state_of(tmp_path, "shop.order")
    assert keep_for_cluster(tmp_path, "c-1") == []
    assert (kept / "timers" / "000001.sst").exists()


def test_another_cluster_drops_every_types_state_and_marks_the_new_one(tmp_path: Path) -> None:
    keep_for_cluster(tmp_path, "c-1")
    order = state_of(tmp_path, "shop.order")
    # Not run by the node now, but its copy is of the old cluster all the same.
    other = state_of(tmp_path, "billing.account")
    # Not a type's copy: left alone (a name of that shape alone is not enough).
    for name in ("notes", "a.b.c", "backup.2026-12-01"):
        (tmp_path / name / "data").mkdir(parents=True)
    (tmp_path / "prometheus.data").write_text("a file")
    assert keep_for_cluster(tmp_path, "c-2") == [other, order]
    assert not order.exists() and not other.exists()
    for name in ("notes", "a.b.c", "backup.2026-12-01", "prometheus.data"):
        assert (tmp_path / name).exists(), name
    assert (tmp_path / "cluster-id").read_text() == "c-2\n"
    assert keep_for_cluster(tmp_path, "c-2") == []


def test_an_empty_cluster_id_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    kept = state_of(tmp_path, "shop.order")
    with pytest.raises(ValueError, match="cluster id"):
        keep_for_cluster(tmp_path, " ")
    assert kept.exists() and not (tmp_path / "cluster-id").exists()


async def test_a_type_not_run_at_a_cluster_change_fires_nothing_of_the_old_cluster(
    tmp_path: Path,
) -> None:
    """The hunt's scenario: the directory marked as the new cluster's by a node running
    another type; its old copy of mem.counter was kept, and read on (clean) when the
    type ran again: the old cluster's timer was found, and fired, in the new one."""
    old, new = MemoryLog(), MemoryLog()
    a = await RunningNode(old, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(a.runs)
        await schedule(old, "o-old", int(time.time() * 1000) + 3_600_000)
        await wait_until(lambda: len(timer_rows(old)) == 1)
    finally:
        await a.stop()
    a = await RunningNode(new, tmp_path, "a", OTHER, PARTITIONS).start()
    try:
        await wait_until(a.runs)
    finally:
        await a.stop()
    # The new cluster's own timers (another node's), its changelog past the old copy's
    # offset: else the copy is dropped as ahead of its topic's end.
    b = await RunningNode(new, tmp_path, "b", SERVICE, PARTITIONS).start()
    try:
        await wait_until(b.runs)
        for i in range(6):
            await schedule(new, f"n{i}", int(time.time() * 1000) + 3_600_000)
        await wait_until(lambda: len(timer_rows(new)) == 6)
    finally:
        await b.stop()
    a = await RunningNode(new, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(a.runs)
        store = a.node.types[TOPICS.type_name].store
        owner = AggregateRef(context="mem", aggregate="counter", id="o-old")
        assert await store.find(owner, "k") is None
    finally:
        await a.stop()


def test_a_second_holder_of_a_data_directory_is_refused_until_the_first_lets_go(
    tmp_path: Path,
) -> None:
    first, second = DataDirLock(tmp_path), DataDirLock(tmp_path)
    first.acquire()
    with pytest.raises(ConfigError, match=rf"{tmp_path} is in use by another worker \(pid \d+\)"):
        second.acquire()
    first.release()
    second.acquire()
    second.release()


def test_a_worker_that_died_leaves_the_data_directory_free(tmp_path: Path) -> None:
    """Held by a process: one killed (no stop, no release) holds nothing."""
    code = (
        "import os, sys; from pathlib import Path; "
        "from app.node.local_state import DataDirLock; "
        f"DataDirLock(Path({str(tmp_path)!r})).acquire(); os._exit(0)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])
    lock = DataDirLock(tmp_path)
    lock.acquire()
    lock.release()


async def test_a_second_node_on_a_data_directory_is_refused_and_drops_nothing(
    tmp_path: Path,
) -> None:
    """A second worker given the directory against another cluster dropped the first's
    live stores (its copy of another cluster's topics) before RocksDB's own lock was
    asked, and both wrote into one copy."""
    first_log, second_log = MemoryLog(), MemoryLog()
    a = await RunningNode(first_log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(a.runs)
        await schedule(first_log, "o-1", int(time.time() * 1000) + 3_600_000)
        await wait_until(lambda: len(timer_rows(first_log)) == 1)
        b = RunningNode(second_log, tmp_path, "a", SERVICE, PARTITIONS)
        with pytest.raises(ConfigError, match="in use by another worker"):
            await b.node.start()
        await b.node.stop()
        store = a.node.types[TOPICS.type_name].store
        owner = AggregateRef(context="mem", aggregate="counter", id="o-1")
        assert await store.find(owner, "k") is not None
        assert (tmp_path / "a" / TOPICS.type_name).exists()
    finally:
        await a.stop()


def test_a_clean_mark_whose_sync_fails_is_not_left_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk as the mark is synced: the close says the copy is not marked (restored
    whole next), so no mark may stay that the next start would trust."""
    marks = CleanMarks(tmp_path)

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space"):
        marks.mark(0, 1_700_000_000_000)
    monkeypatch.undo()
    assert not marks.take(0)
    marks.mark(0, 1_700_000_000_000)
    assert marks.take(0)


def test_a_clean_marks_removal_is_synced_before_the_take_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The take then writes without a WAL: a removal lost to a power loss would leave a
    mark vouching for a copy that holds uncommitted writes (read on, never restored)."""
    marks = CleanMarks(tmp_path)
    marks.mark(0, 1_700_000_000_000)
    synced: list[bool] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(not (tmp_path / "clean-p0").exists())  # the removal, then its sync
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    assert marks.take(0)
    assert synced == [True]
    assert not marks.take(0)  # no mark: nothing to sync
    assert synced == [True]

    def full(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", full)
    marks2 = CleanMarks(tmp_path)
    (tmp_path / "clean-p1").touch()
    with pytest.raises(OSError, match="Input/output"):
        marks2.take(1)  # the take fails: it must not write on an unsynced removal


def test_a_data_directory_the_os_refuses_is_a_configuration_error_naming_it(
    tmp_path: Path,
) -> None:
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ConfigError, match=r"cannot be used: .*\(TICKWHEEL_DATA_DIR\)"):
        DataDirLock(tmp_path / "afile" / "sub").acquire()


@pytest.mark.parametrize("call", ["ftruncate", "pwrite"])
def test_a_data_directory_on_a_full_disk_is_a_configuration_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    """The holder's pid written as the lock is taken: a full disk there failed the start
    with "unexpected OSError: [Errno 28]", naming no setting."""

    def full(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, call, full)
    with pytest.raises(
        ConfigError,
        match=rf"{tmp_path} cannot be used: No space left on device \(TICKWHEEL_DATA_DIR\)",
    ):
        DataDirLock(tmp_path).acquire()
    monkeypatch.undo()
    lock = DataDirLock(tmp_path)  # the failed one holds nothing
    lock.acquire()
    lock.release()


def test_a_clean_mark_says_when_its_copy_was_last_in_step(tmp_path: Path) -> None:
    """The time it was marked with, read back by the take; a mark of the version before
    (an empty file) or one unreadable is of no known time (the copy restored whole)."""
    marks = CleanMarks(tmp_path)
    marks.mark(0, 1_700_000_000_123)
    assert marks.take(0) == CleanMark(1_700_000_000_123)
    assert marks.take(0) is None
    (tmp_path / "clean-p1").touch()  # an older version's
    assert marks.take(1) == CleanMark(None)
    (tmp_path / "clean-p2").write_text("-5\n")
    assert marks.take(2) == CleanMark(None)
    marks.mark(3, 5)
    marks.mark(3, 1_700_000_000_000)  # written over whole
    assert marks.take(3) == CleanMark(1_700_000_000_000)


def test_a_mark_holding_a_digit_int_does_not_read_is_a_mark_of_no_known_age(
    tmp_path: Path,
) -> None:
    """'²' is a digit to `str.isdigit` that `int` refuses: the take raised (a review's
    finding). A mark whose text is no time is one of no known age: restored whole."""
    marks = CleanMarks(tmp_path)
    (tmp_path / "clean-p0").write_text("²\n")
    taken = marks.take(0)
    assert taken is not None and taken.at is None
    assert marks.take(0) is None
