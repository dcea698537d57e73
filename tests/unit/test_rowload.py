"""Reads trust the store's rows and still check their shape (#20): `load_timer` makes
exactly the Timer pydantic makes of a row's bytes, or raises a `StoreError` naming the
row; never a half-built Timer (a field of another type, a nested model left a dict)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from test_rowcheck import mangled, timers

from tables import AggregateRef, CommandSpec, IntervalRule, StoreError, Timer, open_timer_store
from tables.keys import decode_timer, due_key, encode_timer, row_key
from tables.rowload import _slot_setters, load_timer, load_timers


def _same_fields(loaded: BaseModel, expected: BaseModel) -> None:
    """Each field of `loaded` equal to `expected`'s and of its very type, nested models too
    (a StrEnum equals its string, a model its fields: `==` alone would not see a dict or a
    string left where a model or an enum belongs)."""
    assert type(loaded) is type(expected)
    for name in type(expected).model_fields:
        mine, theirs = getattr(loaded, name), getattr(expected, name)
        assert type(mine) is type(theirs), name
        if isinstance(theirs, BaseModel):
            _same_fields(mine, theirs)
        else:
            assert mine == theirs, name


def _as_pydantic_reads_it(key: bytes, value: bytes) -> None:
    try:
        expected = decode_timer(value)
    except ValueError:
        with pytest.raises(StoreError, match=re.escape(repr(key))):
            load_timer(value, key)
        return
    loaded = load_timer(value, key)
    _same_fields(loaded, expected)
    assert loaded.model_fields_set == expected.model_fields_set
    assert encode_timer(loaded) == encode_timer(expected)


@given(timers)
def test_a_stored_row_loads_as_pydantic_reads_it(timer: Timer) -> None:
    value = encode_timer(timer)
    _as_pydantic_reads_it(row_key(timer.owner, timer.key), value)
    assert encode_timer(load_timer(value)) == value


@settings(max_examples=600)
@given(mangled())
def test_a_row_with_fields_changed_loads_as_pydantic_reads_it_or_not_at_all(
    row: tuple[bytes, bytes],
) -> None:
    """Fields set next to their bounds, to other types, removed or added."""
    _as_pydantic_reads_it(*row)


@settings(max_examples=600)
@given(timers, st.data())
def test_corrupt_row_bytes_load_as_pydantic_reads_them_or_not_at_all(
    timer: Timer, data: st.DataObject
) -> None:
    """Bytes flipped, dropped, inserted or cut off anywhere in the row."""
    raw = bytearray(encode_timer(timer))
    for _ in range(data.draw(st.integers(1, 3))):
        if not raw:  # all of it cut or dropped already
            break
        at = data.draw(st.integers(0, len(raw) - 1))
        action = data.draw(st.sampled_from(["flip", "drop", "insert", "cut"]))
        if action == "flip":
            raw[at] = data.draw(st.integers(0, 255))
        elif action == "drop":
            del raw[at]
        elif action == "insert":
            raw[at:at] = data.draw(st.sampled_from([b"0", b"-", b"\\", b'"', b",", b"}", b"\xff"]))
        else:
            del raw[at + 1 :]
    _as_pydantic_reads_it(row_key(timer.owner, timer.key), bytes(raw))


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda raw: raw[:-20],  # cut short
        lambda raw: raw.replace(b'"due_at":', b'"due_on":'),  # a field renamed
        lambda raw: raw.replace(b'"status":"PENDING"', b'"status":"WAITING"'),
        lambda raw: raw.replace(b'"version":1', b'"version":"one"'),
        lambda raw: raw.replace(b'"owner":{', b'"owner":{"x":1,'),
        # nested past msgspec's depth (Python's recursion limit): a RecursionError
        lambda raw: raw.replace(b'"body":{', b'"body":{"x":' + b"[" * 2_000 + b"]" * 2_000 + b","),
    ],
)
async def test_due_names_the_row_it_cannot_read(tmp_path: Path, corrupt: object) -> None:
    store = open_timer_store(f"rocksdb://{tmp_path}/s", partitions=1)
    owner = AggregateRef(context="shop", aggregate="order", id="o-1")
    timer = Timer(
        id="t-1",
        owner=owner,
        key="k",
        version=1,
        partition=0,
        rule=IntervalRule(start=5, every=60_000),
        target=owner,
        command=CommandSpec(type="Go", body={"a": 1}),
        slot_due_at=5,
        due_at=5,
    )
    assert await store.put(timer)
    assert await store.due({0}, 10, 10) == [timer]
    key = due_key(timer.due_at, timer.id, row_key(owner, "k"))
    raw = encode_timer(timer)
    assert callable(corrupt)
    bad = corrupt(raw)
    assert bad != raw
    store._db(0).put(key, bad)  # type: ignore[attr-defined]  # a RocksDB store's own DB
    with pytest.raises(StoreError, match=re.escape(repr(key))) as raised:
        await store.due({0}, 10, 10)
    assert raised.value.partition == 0
    await store.close()


def _slots(model: BaseModel) -> tuple[object, ...]:
    return (
        type(model),
        model.__dict__,
        model.__pydantic_fields_set__,
        model.__pydantic_extra__,
        model.__pydantic_private__,
    )


def _all_slots(timer: Timer) -> list[tuple[object, ...]]:
    """The four slots of the Timer and of each model it holds, as pydantic's
    `model_construct` sets them (a slot left unset raises here)."""
    return [_slots(m) for m in (timer, timer.owner, timer.target, timer.rule, timer.command)]


@given(timers)
def test_the_fast_build_sets_each_models_slots_as_pydantic_does(timer: Timer) -> None:
    """`load_timer` sets the four slots of each model through BaseModel's own slot
    setters (#20): the same values pydantic's full validation leaves, for any timer."""
    value = encode_timer(timer)
    loaded, expected = load_timer(value), decode_timer(value)
    assert _all_slots(loaded) == _all_slots(expected)
    assert loaded == expected and hash(loaded.rule) == hash(expected.rule)


def test_a_slot_a_model_shadows_is_refused_at_import() -> None:
    """The setters are BaseModel's slots: a model that defined one of those names itself
    would keep its own attribute there, so the fast build refuses to start instead."""

    class Shadowing(BaseModel):
        x: int = 0

    type.__setattr__(Shadowing, "__pydantic_extra__", None)
    assert len(_slot_setters(Timer, AggregateRef)) == 4
    with pytest.raises(TypeError, match="Shadowing"):
        _slot_setters(Timer, Shadowing)


@settings(max_examples=50)
@given(st.lists(timers, min_size=1, max_size=8), st.data())
def test_load_timers_is_load_timer_of_each_row_and_names_a_corrupt_ones_partition(
    rows: list[Timer], data: st.DataObject
) -> None:
    """`due()`'s loop (`load_timers`) builds each row as `load_timer` does; one row it
    cannot read is a `StoreError` naming that row's key and partition."""
    read = [(row_key(t.owner, t.key), encode_timer(t), t.partition) for t in rows]
    assert [encode_timer(t) for t in load_timers(read)] == [v for _, v, _ in read]
    bad = data.draw(st.integers(0, len(read) - 1))
    key, value, partition = read[bad]
    read[bad] = (key, value.replace(b'"due_at":', b'"due_on":'), partition)
    with pytest.raises(StoreError, match=re.escape(repr(key))) as raised:
        load_timers(read)
    assert raised.value.partition == partition
