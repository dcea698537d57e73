"""A corrupt stored row is a `StoreError` naming its partition, on every read that meets it
(`StoreError.partition`, and in its message): a runner fails that partition alone."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import T0, make_timer

from tables import DueRow, StoreError, open_timer_store
from tables.keys import due_key, row_key
from tables.timer import TimerChange, TimerStatus


async def test_every_read_of_a_corrupt_row_names_its_partition(tmp_path: Path) -> None:
    store = open_timer_store(f"rocksdb://{tmp_path / 's'}", partitions=3)
    try:
        good = make_timer(id="g", key="g", partition=0)
        bad = make_timer(id="b", key="b", partition=2)
        assert await store.put(good) and await store.put(bad)
        key = due_key(bad.due_at, bad.id, row_key(bad.owner, bad.key))
        store._db(2).put(key, b'{"id": "b"}')  # type: ignore[attr-defined]  # RocksDB's own

        def names_2(exc: pytest.ExceptionInfo[StoreError]) -> None:
            assert exc.value.partition == 2 and "of partition 2" in str(exc.value)

        with pytest.raises(StoreError) as exc:
            await store.due({0, 1, 2}, T0, 10)
        names_2(exc)
        rows = await store.due_rows({0, 1, 2}, T0, 10)
        with pytest.raises(StoreError) as exc:
            DueRow.built(rows)
        names_2(exc)
        with pytest.raises(StoreError) as exc:
            await store.find(bad.owner, bad.key)
        names_2(exc)
        claim = bad.model_copy(update={"status": TimerStatus.FIRING, "due_at": T0 + 1})
        with pytest.raises(StoreError) as exc:
            await store.settle([TimerChange(loaded=bad, next=claim)])
        names_2(exc)
        assert [t.id for t in await store.due({0, 1}, T0, 10)] == ["g"]
    finally:
        await store.close()
