"""`tables.recent_rows`: a row read again from the same bytes is the Timer built from
them before (#20: a fired timer's row is read by its check and by its settle), and never
one built from other bytes."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import pytest
from test_store_rocksdb_fast_paths import timer

from tables import StoreError, TimerChange, TimerStatus, open_timer_store, recent_rows
from tables.keys import due_key, encode_timer, row_key
from tables.recent_rows import load_at
from tables.rowload import load_timer


def test_the_same_bytes_at_the_same_key_give_the_timer_built_before() -> None:
    t = timer(1, 0, 100)
    key, value = due_key(t.due_at, t.id, row_key(t.owner, t.key)), encode_timer(t)
    first = load_at(key, value, 0)
    assert first == load_timer(value) and load_at(key, bytes(value), 0) is first


def test_other_bytes_at_the_key_are_built_again() -> None:
    t = timer(2, 0, 100)
    key = due_key(t.due_at, t.id, row_key(t.owner, t.key))
    first = load_at(key, encode_timer(t), 0)
    changed = t.model_copy(update={"attempts": 3})
    again = load_at(key, encode_timer(changed), 0)
    assert again == changed and again is not first and first.attempts == 0


def test_a_corrupt_row_is_named_as_asked_and_not_kept() -> None:
    with pytest.raises(StoreError, match="b'the row'"):
        load_at(b"dkey", b"{not json", 3, b"the row")
    assert b"dkey" not in recent_rows._ROWS


def test_it_holds_at_most_its_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recent_rows, "_ROWS", OrderedDict())
    monkeypatch.setattr(recent_rows, "_held_bytes", 0)
    monkeypatch.setattr(recent_rows, "LIMIT", 3)
    timers = [timer(n, 0, 100 + n) for n in range(5)]
    for t in timers:
        load_at(t.id.encode(), encode_timer(t), 0)
    assert list(recent_rows._ROWS) == [b"t2", b"t3", b"t4"]


def test_it_holds_at_most_its_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows may be up to a MiB each: the bytes kept are bounded too, and counted right
    through rows written over and forgotten."""
    monkeypatch.setattr(recent_rows, "_ROWS", OrderedDict())
    monkeypatch.setattr(recent_rows, "_held_bytes", 0)
    values = {t.id.encode(): encode_timer(t) for t in (timer(n, 0, 100 + n) for n in range(6))}
    size = max(len(v) for v in values.values())
    monkeypatch.setattr(recent_rows, "LIMIT_BYTES", 3 * size)
    for key, value in values.items():
        load_at(key, value, 0)
        load_at(key, value, 0)  # the same row again: not counted twice
    assert list(recent_rows._ROWS) == [b"t3", b"t4", b"t5"]
    recent_rows.forget(b"t4")
    assert recent_rows._held_bytes == len(values[b"t3"]) + len(values[b"t5"])


async def test_a_read_after_a_settle_gives_the_row_as_written(tmp_path: Path) -> None:
    """Read, settled, read again: the second read is the settled row, not the one kept."""
    store = open_timer_store(f"rocksdb://{tmp_path / 's'}", partitions=1)
    t = timer(7, 0, 100)
    await store.put(t)
    loaded = await store.find(t.owner, t.key)
    assert loaded == t
    fired = t.model_copy(update={"status": TimerStatus.FIRING, "due_at": 30_100})
    assert await store.settle([TimerChange(loaded=t, next=fired)]) == 1
    assert await store.find(t.owner, t.key) == fired
    done = fired.model_copy(update={"status": TimerStatus.PENDING, "due_at": 100})
    assert await store.settle([TimerChange(loaded=fired, next=done)]) == 1
    # Back at the key it was first read at, with bytes equal to the first: the same row.
    assert await store.find(t.owner, t.key) == done == t
    await store.close()


async def test_a_due_row_built_is_what_its_find_and_settle_read(tmp_path: Path) -> None:
    """The row a round takes from the due index is built once: the cycle's check (`find`)
    and its settle read that very Timer back while the row is unchanged."""
    store = open_timer_store(f"rocksdb://{tmp_path / 's'}", partitions=1)
    t = timer(8, 0, 100)
    await store.put(t)
    [row] = await store.due_rows({0}, 1_000, 10)
    built = row.timer()
    assert built == t
    assert await store.find(t.owner, t.key) is built
    key = due_key(t.due_at, t.id, row_key(t.owner, t.key))
    assert recent_rows._ROWS[key][1] is built
    fired = built.model_copy(update={"status": TimerStatus.FIRED})
    assert await store.settle([TimerChange(loaded=built, next=fired)]) == 1
    assert key not in recent_rows._ROWS  # written over: forgotten
    assert await store.find(t.owner, t.key) == fired
    await store.close()
