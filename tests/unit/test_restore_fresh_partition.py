"""A restore into an emptied partition reads back only the old entries of keys an earlier
batch of it wrote (#20): its store ends exactly as one that reads every key's back."""

from __future__ import annotations

import asyncio
import tempfile
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tables import AggregateRef, CommandSpec, IntervalRule, Timer, TimerStatus, open_timer_store
from tables.keys import encode_timer, row_key

KEYS = 4
STATUSES = [TimerStatus.PENDING, TimerStatus.FIRED, TimerStatus.PAUSED, TimerStatus.PARKED]


def value(n: int, status: TimerStatus, due: int) -> bytes:
    owner = AggregateRef(context="shop", aggregate="order", id=f"o{n}")
    timer = Timer(
        id=f"t{due}",
        owner=owner,
        key="k",
        version=1,
        partition=0,
        rule=IntervalRule(start=due, every=60_000),
        target=AggregateRef(context="shop", aggregate="cart", id=f"c{due % 2}"),
        command=CommandSpec(type="Remind", body={}),
        slot_due_at=due,
        due_at=due,
    )
    return encode_timer(timer.model_copy(update={"status": status}))


def key(n: int) -> bytes:
    return row_key(AggregateRef(context="shop", aggregate="order", id=f"o{n}"), "k")


# A key of a few (so that keys repeat, in a batch and across batches), and what its record
# holds: a tombstone, a row (of some status, due time), or bytes that are no row.
record = st.tuples(
    st.integers(0, KEYS - 1),
    st.none() | st.just(b"{}") | st.tuples(st.sampled_from(STATUSES), st.integers(0, 5)),
)


def contents(fast: bool, batches: list[list[tuple[int, Any]]]) -> tuple[list[Any], list[Any]]:
    """Every entry the store holds after restoring `batches`, and what it passed over."""

    async def run(path: str) -> tuple[list[Any], list[Any]]:
        store: Any = open_timer_store(f"rocksdb://{path}/s", partitions=1)
        try:
            assert (0 in store._restored) is True  # opened empty: the fast path is on
            if not fast:
                store._restored.clear()
            offset, passed = 0, []
            for batch in batches:
                records = []
                for n, held in batch:
                    raw = held if held is None or isinstance(held, bytes) else value(n, *held)
                    records.append((offset, key(n), raw))
                    offset += 1
                passed += [(r.offset, r.key) for r in await store.apply_changelog(0, records)]
            assert (0 in store._restored) is fast
            return list(store._db(0).items()), passed
        finally:
            await store.close()

    with tempfile.TemporaryDirectory() as path:
        return asyncio.run(run(path))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(record, min_size=1, max_size=6), min_size=1, max_size=5))
def test_a_restore_into_an_empty_partition_ends_as_the_full_one(
    batches: list[list[tuple[int, Any]]],
) -> None:
    assert contents(True, batches) == contents(False, batches)


def test_the_fast_path_ends_with_a_write_of_the_nodes_and_starts_after_a_drop() -> None:
    async def run(path: str) -> None:
        store: Any = open_timer_store(f"rocksdb://{path}/s", partitions=1)
        try:
            await store.apply_changelog(0, [(0, key(0), value(0, TimerStatus.PENDING, 1))])
            assert 0 in store._restored
            # A write of the node's (with the WAL): the partition is no restore's alone.
            timer = Timer.model_validate_json(value(1, TimerStatus.PENDING, 2))
            assert await store.put(timer)
            assert 0 not in store._restored
            await store.close()
            # Reopened holding rows: not empty.
            store = open_timer_store(f"rocksdb://{path}/s", partitions=1)
            assert 0 not in store._restored
            await store.drop(0)
            await store.assign({0})
            assert 0 in store._restored
        finally:
            await store.close()

    with tempfile.TemporaryDirectory() as path:
        asyncio.run(run(path))
