"""The RocksDB store opens each partition's DB with its own options (`tables.rocksdb_io`),
whatever options the DB was last opened with."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rocksdict import Options, Rdict

from tables import open_timer_store


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
