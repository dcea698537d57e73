"""A partition's RocksDB copy is only a cache of its changelog: one RocksDB cannot open or
read from its first key (a damaged CURRENT, MANIFEST or SST) is dropped with an error and
opened empty, so that the restore after reads the changelog whole; a DB another process
holds is a failure, never dropped. The format file (STORE.json) is written whole or not at
all, and an unreadable one drops the copies rather than fail every start. A drop or a
reopen that fails is a `StoreError` of the partition, whose reads then raise it too
(never a KeyError, nor the old copy reopened as if dropped)."""

from __future__ import annotations

import asyncio
import glob
import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fakes import RunningNode, wait_until
from test_node_memory import PARTITIONS, SERVICE, TOPICS, schedule, timer_rows
from test_store_rocksdb_fast_paths import record, timer

from app.kafka.memory import MemoryLog
from tables import StoreError, TimerStore, open_timer_store

ROOT = Path(__file__).resolve().parents[2]
ROWS = 50


def url(folder: Path) -> str:
    return f"rocksdb://{folder}"


async def written(folder: Path, partitions: int = 2) -> None:
    """Each partition's `ROWS` timers restored (flushed to an SST), at offsets 0..ROWS-1."""
    store = open_timer_store(url(folder), partitions=partitions)
    try:
        for p in range(partitions):
            rows = [timer(p * ROWS + n, p, 1_000 + n) for n in range(ROWS)]
            await store.apply_changelog(p, [record(i, t) for i, t in enumerate(rows)])
            await store.end_restore(p)
    finally:
        await store.close()


async def held(store: TimerStore, p: int) -> int:
    return len(await store.due({p}, 10**12, 10 * ROWS))


def sst(folder: Path, p: int) -> str:
    (found,) = glob.glob(str(folder / f"p{p}.db" / "*.sst"))
    return found


def damage_current(folder: Path) -> None:
    (folder / "p0.db" / "CURRENT").write_text("MANIFEST-999999\n")


def damage_manifest(folder: Path) -> None:
    (manifest,) = glob.glob(str(folder / "p0.db" / "MANIFEST-*"))
    with open(manifest, "r+b") as file:
        file.seek(10)
        file.write(b"\xde\xad" * 20)


def truncate_sst(folder: Path) -> None:
    path = sst(folder, 0)
    os.truncate(path, os.path.getsize(path) - 100)


def damage_first_block(folder: Path) -> None:
    with open(sst(folder, 0), "r+b") as file:
        file.write(b"\xde\xad\xbe\xef" * 16)


@pytest.mark.parametrize(
    "damage", [damage_current, damage_manifest, truncate_sst, damage_first_block]
)
async def test_a_damaged_copy_is_dropped_and_restored_whole(
    tmp_path: Path, damage: Callable[[Path], None], caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "s"
    await written(folder)
    damage(folder)
    with caplog.at_level(logging.ERROR, logger="tables.rocksdb_store"):
        store = open_timer_store(url(folder), partitions=2)
    try:
        # Dropped: no changelog offset, so the node restores it whole; p1 kept as it was.
        assert store.changelog_offset(0) is None
        assert await held(store, 0) == 0
        assert store.changelog_offset(1) == ROWS - 1 and await held(store, 1) == ROWS
        assert any(
            r.levelno == logging.ERROR and str(folder / "p0.db") in r.getMessage()
            for r in caplog.records
        ), caplog.text
        rows = [timer(n, 0, 1_000 + n) for n in range(ROWS)]
        await store.apply_changelog(0, [record(i, t) for i, t in enumerate(rows)])
        await store.end_restore(0)
        assert await held(store, 0) == ROWS and store.changelog_offset(0) == ROWS - 1
    finally:
        await store.close()


async def test_a_copy_another_process_holds_is_a_failure_not_a_drop(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    await written(folder)
    holder = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "import sys, rocksdict; db = rocksdict.Rdict(sys.argv[1]); print('held', flush=True); "
        "sys.stdin.read()",
        str(folder / "p0.db"),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and (await holder.stdout.readline()).strip() == b"held"
        with pytest.raises(StoreError, match=r"p0\.db"):
            open_timer_store(url(folder), partitions=2)
    finally:
        await holder.communicate(b"")
    store = open_timer_store(url(folder), partitions=2)
    try:
        assert store.changelog_offset(0) == ROWS - 1 and await held(store, 0) == ROWS
    finally:
        await store.close()


async def test_a_node_with_a_damaged_copy_starts_and_restores_it(tmp_path: Path) -> None:
    log = MemoryLog()
    a = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(a.runs)
        await schedule(log, "o1", int(time.time() * 1000) + 3_600_000)
        await wait_until(lambda: len(timer_rows(log)) == 1)
    finally:
        await a.stop()
    (t,) = timer_rows(log)
    timers = tmp_path / "a" / TOPICS.type_name / "timers"
    for p in range(PARTITIONS):
        (timers / f"p{p}.db" / "CURRENT").write_text("MANIFEST-999999\n")
    b = RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS)
    try:
        await b.start()
        await wait_until(b.runs)
        store = b.node.types[TOPICS.type_name].store
        found = await store.find(t.owner, t.key)
        assert found is not None and found.id == t.id
    finally:
        await b.stop()


# --- the format file ------------------------------------------------------------------

FULL_DISK = textwrap.dedent(
    """
    import resource, signal, sys
    sys.path.insert(0, sys.argv[2])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))  # as a full disk: no byte written
    from tables import open_timer_store
    open_timer_store("rocksdb://" + sys.argv[1], partitions=2)
    """
)


async def test_a_first_start_on_a_full_disk_leaves_no_broken_format_file(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "s"
    failed = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", FULL_DISK, str(folder), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert failed.returncode != 0
    assert "StoreError" in failed.stderr and str(folder / "STORE.json") in failed.stderr
    assert not (folder / "STORE.json").exists()
    assert not (folder / "STORE.json.tmp").exists()
    store = open_timer_store(url(folder), partitions=2)  # with room again: it opens
    await store.close()
    assert json.loads((folder / "STORE.json").read_text()) == {"format": 2, "partitions": 2}


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b'{"format": 2, "parti',
        b"\xff\xfe",
        b"[2]",
        pytest.param(b"[" * 2_000 + b"]" * 2_000, id="nested-past-the-recursion-limit"),
    ],
)
async def test_an_unreadable_format_file_drops_the_copies_and_is_written_again(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "s"
    await written(folder)
    (folder / "STORE.json").write_bytes(content)
    with caplog.at_level(logging.ERROR, logger="tables.rocksdb_restore"):
        store = open_timer_store(url(folder), partitions=2)
    try:
        assert [store.changelog_offset(p) for p in range(2)] == [None, None]
        assert await held(store, 0) == 0
        assert str(folder / "STORE.json") in caplog.text
    finally:
        await store.close()
    assert json.loads((folder / "STORE.json").read_text()) == {"format": 2, "partitions": 2}


# --- drops and reopens that fail ------------------------------------------------------


async def test_a_drop_that_fails_is_an_error_of_the_partition_never_the_old_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "s"
    await written(folder)
    store = open_timer_store(url(folder), partitions=2)
    try:
        unlink = os.unlink

        def refused(path: Any, *args: Any, **kwargs: Any) -> None:
            if str(path).endswith(".sst"):
                raise PermissionError(1, "Operation not permitted", str(path))
            unlink(path, *args, **kwargs)

        monkeypatch.setattr(os, "unlink", refused)
        with pytest.raises(StoreError, match=r"p0\.db") as raised:
            await store.drop(0)
        assert raised.value.partition == 0
        monkeypatch.undo()
        # Not served from the old copy, nor a KeyError: a fault of p0 until it is retaken.
        with pytest.raises(StoreError) as raised:
            await store.due({0}, 10**12, 10)
        assert raised.value.partition == 0
        with pytest.raises(StoreError):
            store.changelog_offset(0)
        assert await held(store, 1) == ROWS
        await store.drop(0)  # it can go now
        assert store.changelog_offset(0) is None and await held(store, 0) == 0
        await store.revoke({1})
        await store.drop(1)
        await store.drop(1)  # nothing left to remove: fine
        assert not (folder / "p1.db").exists()
    finally:
        await store.close()


async def test_a_bulk_reopen_that_fails_leaves_the_partition_failing_not_a_keyerror(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "s"
    store = open_timer_store(url(folder), partitions=2)  # empty: restored in bulk
    try:
        rows = [timer(n, 0, 1_000 + n) for n in range(ROWS)]
        await store.apply_changelog(0, [record(i, t) for i, t in enumerate(rows)])
        opened = store._open_db  # type: ignore[attr-defined]

        def failing(partition: int, *, bulk: bool) -> Any:
            if partition == 0 and not bulk:
                raise Exception("IO error: injected")  # as rocksdict raises
            return opened(partition, bulk=bulk)

        monkeypatch.setattr(store, "_open_db", failing)
        with pytest.raises(StoreError, match=r"p0\.db") as raised:
            await store.end_restore(0)
        assert raised.value.partition == 0
        for read in (
            lambda: store.due({0}, 10**12, 10),
            lambda: store.find(rows[0].owner, rows[0].key),
            lambda: store.apply_changelog(0, [record(ROWS, rows[0])]),
        ):
            with pytest.raises(StoreError) as raised:
                await read()
            assert raised.value.partition == 0
        with pytest.raises(StoreError):
            store.changelog_offset(0)
        assert await held(store, 1) == 0  # p1 is served as before
        monkeypatch.undo()
        # Retaken: opened again, with the restored rows flushed before the failed reopen.
        await store.revoke({0})
        await store.assign({0})
        assert store.changelog_offset(0) == ROWS - 1 and await held(store, 0) == ROWS
    finally:
        await store.close()
