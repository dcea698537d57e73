"""The RocksDB store opens each partition's DB with its own options (`tables.rocksdb_io`),
whatever options the DB was last opened with; an emptied partition's restore writes to
vector memtables (`RocksDBTimerStore._bulk`), and its DB is reopened as every other is
when the restore ends or the node first writes to it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from rocksdict import Options, Rdict

from app.kafka.memory import MemoryLog
from app.kafka.records import TopicSpec
from app.timers.restore import restore_partition
from tables import AggregateRef, CommandSpec, OnceRule, Timer, open_timer_store
from tables.aggregate_store import RocksAggregateStore
from tables.keys import encode_timer, row_key

VECTOR = "{id=VectorRepFactory;count=0;}"
SKIP_LIST = "SkipListFactory"


def _latest_options(db: Path) -> dict[str, str]:
    """The `key=value` lines of the DB's latest OPTIONS file (RocksDB writes one an open)."""
    latest = max(db.glob("OPTIONS-*"), key=lambda p: int(p.name.split("-")[1]))
    pairs = (line.strip().split("=", 1) for line in latest.read_text().splitlines())
    return {pair[0]: pair[1] for pair in pairs if len(pair) == 2}


def test_a_partition_db_is_reopened_with_the_stores_options(tmp_path: Path) -> None:
    async def run() -> None:
        store = open_timer_store(f"rocksdb://{tmp_path}/s", partitions=1)
        await store.close()
        # Opened once with other options (an older version's, say): they are its latest.
        other = Options(raw_mode=True)
        other.set_write_buffer_size(1 << 20)
        Rdict(str(tmp_path / "s" / "p0.db"), other, column_families={"default": other}).close()
        assert _latest_options(tmp_path / "s" / "p0.db")["write_buffer_size"] == str(1 << 20)
        store = open_timer_store(f"rocksdb://{tmp_path}/s", partitions=1)
        await store.close()

    asyncio.run(run())
    assert _latest_options(tmp_path / "s" / "p0.db")["write_buffer_size"] == str(16 << 20)


def timer(n: int) -> Timer:
    owner = AggregateRef(context="shop", aggregate="order", id=f"o{n}")
    return Timer(
        id=f"t{n}",
        owner=owner,
        key="k",
        version=1,
        partition=0,
        rule=OnceRule(at=1_000 + n),
        target=owner,
        command=CommandSpec(type="Remind"),
        slot_due_at=1_000 + n,
        due_at=1_000 + n,
    )


def records(first: int, count: int) -> list[tuple[int, bytes, bytes | None]]:
    made = [timer(n) for n in range(first, first + count)]
    return [(int(t.id[1:]), row_key(t.owner, "k"), encode_timer(t)) for t in made]


def memtable(path: Path) -> str:
    return _latest_options(path / "s" / "p0.db")["memtable_factory"]


def test_a_restore_into_an_empty_partition_writes_in_bulk_until_it_ends(tmp_path: Path) -> None:
    async def run() -> None:
        store: Any = open_timer_store(f"rocksdb://{tmp_path}/s", partitions=1)
        try:
            assert store._bulk == {0} and memtable(tmp_path) == VECTOR
            await store.apply_changelog(0, records(0, 50))
            # Read while in bulk: right (each read copies and sorts the memtable).
            assert store.changelog_offset(0) == 49
            assert [t.id for t in await store.due({0}, 10**6, 3)] == ["t0", "t1", "t2"]
            await store.apply_changelog(0, records(50, 50))
            assert store._bulk == {0}
            await store.end_restore(0)
            assert store._bulk == set() and memtable(tmp_path) == SKIP_LIST
            assert store.changelog_offset(0) == 99
            assert len(await store.due({0}, 10**6, 1_000)) == 100
        finally:
            await store.close()

    asyncio.run(run())


def test_the_nodes_first_write_ends_a_bulk_restore(tmp_path: Path) -> None:
    async def run() -> None:
        store: Any = open_timer_store(f"rocksdb://{tmp_path}/s", partitions=1)
        try:
            await store.apply_changelog(0, records(0, 20))
            assert await store.put(timer(100))
            assert store._bulk == set() and memtable(tmp_path) == SKIP_LIST
            assert len(await store.due({0}, 10**6, 1_000)) == 21
        finally:
            await store.close()
        # Reopened holding rows: no bulk restore (a restore reads its old entries back).
        again: Any = open_timer_store(f"rocksdb://{tmp_path}/s", partitions=1)
        try:
            assert again._bulk == set() and memtable(tmp_path) == SKIP_LIST
            assert len(await again.due({0}, 10**6, 1_000)) == 21
        finally:
            await again.close()

    asyncio.run(run())


def test_a_restore_of_a_changelog_ends_its_bulk_writes(tmp_path: Path) -> None:
    async def run() -> None:
        log = MemoryLog([TopicSpec("t.changelog", 1)])
        await log.publisher().send_many([("t.changelog", 0, k, v) for _, k, v in records(0, 30)])
        store: Any = open_timer_store(f"rocksdb://{tmp_path}/s", partitions=1)
        try:
            assert await restore_partition(store, log.reader(batch=7), "t.changelog", 0) == 30
            assert store._bulk == set() and memtable(tmp_path) == SKIP_LIST
            assert len(await store.due({0}, 10**6, 1_000)) == 30
        finally:
            await store.close()

    asyncio.run(run())


def test_an_aggregate_states_db_is_reopened_with_the_stores_options(tmp_path: Path) -> None:
    other = Options(raw_mode=True)
    other.set_write_buffer_size(1 << 20)
    Rdict(str(tmp_path / "p0.db"), other, column_families={"default": other}).close()
    states = RocksAggregateStore(tmp_path)
    assert states.get(0, "a-1") is None  # opens p0
    states.close()
    assert _latest_options(tmp_path / "p0.db")["write_buffer_size"] == str(8 << 20)
