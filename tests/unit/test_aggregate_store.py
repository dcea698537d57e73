"""One contract for both aggregate state store backends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tables.aggregate_store import AggregateStateStore, MemoryAggregateStore, RocksAggregateStore
from tables.exceptions import StoreClosed


@pytest.fixture(params=["memory", "rocksdb"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AggregateStateStore]:
    s: AggregateStateStore = (
        MemoryAggregateStore() if request.param == "memory" else RocksAggregateStore(tmp_path)
    )
    yield s
    s.close()


def test_states_requests_and_offset_per_partition(store: AggregateStateStore) -> None:
    assert store.get(0, "a") is None
    assert store.offset(0) is None
    store.write(0, {"a": b"{}", "b": b'{"x":1}'}, [("a", "r1")], 41)
    assert store.get(0, "b") == b'{"x":1}'
    assert store.seen(0, "a", "r1")
    assert not store.seen(0, "b", "r1")
    assert not store.seen(1, "a", "r1")
    assert store.get(1, "a") is None
    assert store.offset(0) == 41
    store.write(0, {}, [], None)
    assert store.offset(0) == 41


def test_ids_cannot_collide_across_fields(store: AggregateStateStore) -> None:
    store.write(0, {}, [("ab", "c")], None)
    assert not store.seen(0, "a", "bc")


def test_drop_forgets_a_partition(store: AggregateStateStore) -> None:
    store.write(0, {"a": b"1"}, [("a", "r")], 3)
    store.write(1, {"a": b"2"}, [], 4)
    store.drop(0)
    assert store.get(0, "a") is None
    assert store.offset(0) is None
    assert store.get(1, "a") == b"2"


def test_closed(store: AggregateStateStore) -> None:
    store.close()
    with pytest.raises(StoreClosed):
        store.get(0, "a")


def test_rocksdb_survives_reopen(tmp_path: Path) -> None:
    s = RocksAggregateStore(tmp_path)
    s.write(2, {"a": b"x"}, [("a", "r")], 9)
    s.close()
    again = RocksAggregateStore(tmp_path)
    assert again.get(2, "a") == b"x"
    assert again.seen(2, "a", "r")
    assert again.offset(2) == 9
    again.close()


def test_two_tenants_aggregates_of_one_id_are_kept_apart() -> None:
    from app.commands.processor import state_key
    from tables import AggregateRef

    a = AggregateRef(context="c", aggregate="a", tenant="acme", id="x")
    b = AggregateRef(context="c", aggregate="a", tenant="globex", id="x")
    tricky = AggregateRef(context="c", aggregate="a", tenant="ac", id="me/x")
    assert len({state_key(a), state_key(b), state_key(tricky)}) == 3
