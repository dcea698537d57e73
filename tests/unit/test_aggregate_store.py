"""One contract for both aggregate state store backends."""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rocksdict import Rdict, ReadOptions

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


def test_rocksdb_request_ids_are_filtered(tmp_path: Path) -> None:
    """Nearly every command's id was never applied: each partition's tables carry a bloom
    filter, so such a miss reads no block of a level (`bench.dedupe_bench`). RocksDB
    writes the options a DB was opened with beside it."""
    s = RocksAggregateStore(tmp_path)
    s.write(0, {}, [("a", "r")], 1)
    s.close()
    (options,) = sorted((tmp_path / "p0.db").glob("OPTIONS-*"))[-1:]
    policies = [
        line.strip() for line in options.read_text().splitlines() if "filter_policy" in line
    ]
    assert policies and all("bloomfilter" in line for line in policies), policies


def test_two_tenants_aggregates_of_one_id_are_kept_apart() -> None:
    from app.commands.processor import state_key
    from tables import AggregateRef

    a = AggregateRef(context="c", aggregate="a", tenant="acme", id="x")
    b = AggregateRef(context="c", aggregate="a", tenant="globex", id="x")
    tricky = AggregateRef(context="c", aggregate="a", tenant="ac", id="me/x")
    assert len({state_key(a), state_key(b), state_key(tricky)}) == 3


def test_request_ids_older_than_the_window_are_forgotten_oldest_first(
    store: AggregateStateStore,
) -> None:
    store.write(0, {}, [("a", "r1"), ("b", "r1")], 1, applied_at=1_000)
    store.write(0, {}, [("a", "r2")], 2, applied_at=2_000)
    store.write(0, {}, [("a", "r3")], 3, applied_at=3_000)
    store.write(1, {}, [("a", "r1")], 4, applied_at=500)
    assert store.expire_requests(0, before=999, limit=10) == 0
    assert store.expire_requests(0, before=2_000, limit=2) == 2
    assert not store.seen(0, "a", "r1") and not store.seen(0, "b", "r1")
    assert store.seen(0, "a", "r2") and store.seen(0, "a", "r3")
    assert store.seen(1, "a", "r1"), "another partition's"
    assert store.expire_requests(0, before=2_000, limit=2) == 1
    assert not store.seen(0, "a", "r2") and store.seen(0, "a", "r3")
    assert store.expire_requests(0, before=-1, limit=2) == 0


def test_a_request_id_applied_again_counts_from_its_latest_write(
    store: AggregateStateStore,
) -> None:
    store.write(0, {}, [("a", "r")], 1, applied_at=1_000)
    store.write(0, {}, [("a", "r")], 2, applied_at=5_000)
    assert store.expire_requests(0, before=4_000, limit=10) == 0
    assert store.seen(0, "a", "r")
    assert store.expire_requests(0, before=5_000, limit=10) == 1
    assert not store.seen(0, "a", "r")


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("abc"), st.sampled_from(["r1", "r2", "r3"]), st.integers(0, 9)),
        max_size=15,
    ),
    st.integers(-1, 10),
    st.integers(1, 5),
)
def test_both_backends_forget_what_the_window_says(
    writes: list[tuple[str, str, int]], before: int, limit: int
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        stores: list[AggregateStateStore] = [
            MemoryAggregateStore(),
            RocksAggregateStore(Path(folder)),
        ]
        latest: dict[tuple[str, str], int] = {}
        for a, r, at in writes:
            latest[(a, r)] = at
            for s in stores:
                s.write(0, {}, [(a, r)], None, applied_at=at)
        # Oldest first, ties in the stores' key order (the aggregate id length-prefixed).
        expired = sorted(
            (at, len(a).to_bytes(2, "big") + a.encode() + r.encode(), a, r)
            for (a, r), at in latest.items()
            if at <= before
        )
        forgotten = {(a, r) for _, _, a, r in expired[:limit]}
        for s in stores:
            assert s.expire_requests(0, before, limit) == len(forgotten)
            assert {k for k in latest if s.seen(0, *k)} == set(latest) - forgotten
            s.close()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            # A write of request id r of aggregate a applied at `at`; a sweep up to `before`.
            st.tuples(st.sampled_from(["ax", "ay", "bx", "bz"]), st.integers(0, 9), st.just(0)),
            st.tuples(st.just(""), st.integers(-1, 10), st.integers(1, 3)),
        ),
        max_size=25,
    )
)
def test_writes_and_sweeps_interleaved_forget_as_the_reference_does(
    steps: list[tuple[str, int, int]],
) -> None:
    """RocksDB's sweep starts from the last id it forgot: one applied earlier since (a
    restore's), or again, is still found."""
    ids = [("a", "x"), ("a", "y"), ("b", "x"), ("b", "z")]
    with tempfile.TemporaryDirectory() as folder:
        reference, rocks = MemoryAggregateStore(), RocksAggregateStore(Path(folder))
        for written, at_or_before, limit in steps:
            if written:
                for s in (reference, rocks):
                    s.write(0, {}, [(written[0], written[1])], None, applied_at=at_or_before)
            else:
                want = reference.expire_requests(0, at_or_before, limit)
                assert rocks.expire_requests(0, at_or_before, limit) == want
            held = {k for k in ids if reference.seen(0, *k)}
            assert {k for k in ids if rocks.seen(0, *k)} == held
        rocks.close()


class _KeysSpy:
    """A partition's DB whose key scans are recorded: where each started."""

    def __init__(self, db: Rdict) -> None:
        self.db = db
        self.starts: list[bytes] = []

    def keys(self, *, from_key: bytes, read_opt: ReadOptions) -> Iterator[bytes]:
        self.starts.append(from_key)
        return cast(Iterator[bytes], self.db.keys(from_key=from_key, read_opt=read_opt))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


def test_a_sweep_never_scans_the_ids_it_forgot_before(tmp_path: Path) -> None:
    """Forgotten ids leave tombstones in RocksDB until a compaction: a sweep (one every
    commit) scanning from the front stepped over all of them each time (measured: 33 ms a
    commit with nothing to forget, after 200,000 forgotten)."""
    store = RocksAggregateStore(tmp_path)
    store.write(0, {}, [(f"a{n}", "r") for n in range(10)], None, applied_at=1_000)
    store.write(0, {}, [("b", "r")], None, applied_at=5_000)
    spy = _KeysSpy(store._db(0))
    store._dbs[0] = cast(Rdict, spy)
    assert store.expire_requests(0, before=2_000, limit=4) == 4
    assert store.expire_requests(0, before=2_000, limit=4) == 4
    assert store.expire_requests(0, before=2_000, limit=4) == 2
    assert store.expire_requests(0, before=2_000, limit=4) == 0
    # Each scan starts at the last id the one before forgot.
    assert spy.starts[0] == b"w" and all(a < b for a, b in itertools.pairwise(spy.starts))
    assert store.expire_requests(0, before=3_000, limit=4) == 0
    assert spy.starts[-1] == b"w" + (2_001).to_bytes(8, "big")  # past the last one's window
    store.write(0, {}, [("c", "r")], None, applied_at=500)  # a restore's, applied long ago
    assert store.expire_requests(0, before=2_000, limit=4) == 1
    assert not store.seen(0, "c", "r") and store.seen(0, "b", "r")
    store.close()


def test_an_id_passed_over_is_seen_not_folded_until_applied(store: AggregateStateStore) -> None:
    store.write(0, {}, [("a", "r1")], 1, 10, passed=[("a", "r1"), ("a", "r2")])
    assert store.seen(0, "a", "r1") and store.folded(0, "a", "r1"), "applied wins"
    assert store.seen(0, "a", "r2") and not store.folded(0, "a", "r2")
    store.write(0, {}, [], 2, 20, passed=[("a", "r1")])
    assert store.folded(0, "a", "r1"), "never made passed over once applied"
    store.write(0, {}, [("a", "r2")], 3, 30)
    assert store.folded(0, "a", "r2")
    # One sweep entry each, at its latest write: r1 (10) goes first, r2 (30) stays.
    assert store.expire_requests(0, 25, 10) == 1
    assert not store.seen(0, "a", "r1") and store.folded(0, "a", "r2")
    store.write(0, {}, [], 4, 40, passed=[("b", "r3")])
    assert store.expire_requests(0, 35, 10) == 1 and not store.seen(0, "a", "r2")
    assert store.seen(0, "b", "r3") and not store.folded(0, "b", "r3")
    assert store.expire_requests(0, 40, 10) == 1 and not store.seen(0, "b", "r3")


def test_each_request_id_is_kept_from_its_own_date(store: AggregateStateStore) -> None:
    """A restore's batch writes ids of events a window apart: each is kept (and judged
    folded by an event's date, `since`) from its own, the others' from `applied_at`."""
    dates = {("a", "r1"): 1_000, ("a", "r2"): 5_000, ("b", "r3"): 2_000}
    store.write(0, {}, [("a", "r1"), ("a", "r2"), ("a", "r4")], 1, 3_000, [("b", "r3")], dates)
    assert store.folded(0, "a", "r1", since=999) and not store.folded(0, "a", "r1", since=1_000)
    assert store.folded(0, "a", "r2", since=4_999) and store.folded(0, "a", "r1")
    assert not store.folded(0, "b", "r3", since=0), "passed over, whatever its date"
    assert store.expire_requests(0, before=2_000, limit=10) == 2
    assert not store.seen(0, "a", "r1") and not store.seen(0, "b", "r3")
    assert store.seen(0, "a", "r2") and store.seen(0, "a", "r4")
    assert store.expire_requests(0, before=3_000, limit=10) == 1
    assert not store.seen(0, "a", "r4") and store.seen(0, "a", "r2")
    # One dated before those forgotten (RocksDB's sweep starts past them): still found.
    store.write(0, {}, [("c", "r"), ("c", "r5")], 2, 9_000, dates={("c", "r"): 500})
    assert store.expire_requests(0, before=2_000, limit=10) == 1
    assert not store.seen(0, "c", "r") and store.seen(0, "c", "r5")
