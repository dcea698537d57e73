"""The request ids a restore of the aggregate states writes: dated by the node's clock, never
by the events' writers alone, none already past the de-duplication window, and those of a
local copy that went past it while the partition decided nothing forgotten."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import T0, OneBatchLog, order_type

from app.commands.batch import CommandBatch
from app.commands.records import state_key
from app.commands.states import PartitionStates
from app.kafka import Record
from app.protocol.limits import InputLimits
from app.protocol.wire import EventEnvelope, encode
from tables import AggregateRef
from tables.aggregate_store import AggregateStateStore, MemoryAggregateStore, RocksAggregateStore
from tables.bounds import MAX_INSTANT
from tables.partitioner import partition_of

ORDER = AggregateRef(context="shop", aggregate="order", id="o-1")
AID = state_key(ORDER)
P = partition_of(ORDER.id, 4)
EVENTS = "shop.order.events"
HOUR = 3_600_000
WINDOW = 7 * 24 * HOUR
NOW = T0


@pytest.fixture(params=["memory", "rocksdb"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AggregateStateStore]:
    made: AggregateStateStore = (
        MemoryAggregateStore() if request.param == "memory" else RocksAggregateStore(tmp_path)
    )
    yield made
    made.close()


def log_of(*events: tuple[str, int]) -> OneBatchLog:
    """Events of the order, one a `(request id, created_at)`, at offsets 0, 1, …"""
    records = [
        Record(
            EVENTS,
            P,
            n,
            ORDER.id.encode(),
            encode(
                EventEnvelope(
                    id=f"e-{n}",
                    type="shop.Reminded",
                    aggregate=ORDER,
                    version=n + 1,
                    request_id=request_id,
                    created_at=created_at,
                    body={"n": n + 1},
                )
            ),
            created_at,
        )
        for n, (request_id, created_at) in enumerate(events)
    ]
    return OneBatchLog(records)


def states_on(store: AggregateStateStore, now: int = NOW) -> PartitionStates:
    return PartitionStates(
        order_type(),
        P,
        partitions=4,
        store=store,
        limits=InputLimits(),
        events_topic=EVENTS,
        request_id_window=WINDOW,
        now=lambda: now,
    )


def sweep_at(store: AggregateStateStore, t: int) -> int:
    """What a commit's sweep at time `t` forgets."""
    return store.expire_requests(P, t - WINDOW, 1_000)


async def test_a_restore_writes_no_request_id_already_past_the_window(
    store: AggregateStateStore,
) -> None:
    """A fresh node folding a log kept forever keeps only the ids it would not forget."""
    log = log_of(("old", NOW - WINDOW - HOUR), ("edge", NOW - WINDOW), ("in", NOW - WINDOW + 1))
    assert await states_on(store).restore(log) == 3
    assert not store.seen(P, AID, "old")
    assert not store.seen(P, AID, "edge"), "a sweep now forgets it: not written"
    assert store.seen(P, AID, "in")
    assert store.get(P, AID) is not None and store.offset(P) == 2, "the states folded all"


async def test_a_restore_dates_no_request_id_after_now(store: AggregateStateStore) -> None:
    """A writer's event dated year 9999 does not keep its id, nor its batch's, for good."""
    log = log_of(("mine", NOW - HOUR), ("forged", MAX_INSTANT))
    await states_on(store).restore(log)
    assert store.seen(P, AID, "mine") and store.seen(P, AID, "forged")
    assert sweep_at(store, NOW + WINDOW) == 2, "both forgotten a window after now"
    assert not store.seen(P, AID, "mine") and not store.seen(P, AID, "forged")


async def test_a_request_id_within_the_window_is_a_duplicate_after_a_restore_for_its_window(
    store: AggregateStateStore,
) -> None:
    """Restored, an id applied an hour ago (or dated a little ahead: a skewed clock) is
    found, and kept until the window after it was applied has passed."""
    log = log_of(("r-1", NOW - HOUR), ("r-2", NOW + 5_000))
    states = states_on(store)
    await states.restore(log)
    batch = CommandBatch(now=NOW)
    assert states.applied(batch, (AID, "r-1")) and states.applied(batch, (AID, "r-2"))
    assert sweep_at(store, NOW) == 0, "the next commit's sweep keeps them"
    assert sweep_at(store, NOW - HOUR + WINDOW - 1) == 0, "within r-1's window"
    assert store.seen(P, AID, "r-1") and store.seen(P, AID, "r-2")


async def test_a_restore_forgets_a_local_copys_request_ids_past_the_window(
    store: AggregateStateStore,
) -> None:
    """A partition that decides no command never sweeps: its take does, all of them (more
    than one sweep's worth)."""
    old = [(AID, f"old-{n}") for n in range(600)]
    store.write(P, {}, old, None, NOW - WINDOW - HOUR)
    store.write(P, {}, [(AID, "fresh")], 0, NOW - HOUR)
    assert await states_on(store).restore(log_of(("r-0", NOW - HOUR))) == 0, "read past 0"
    assert not any(store.seen(P, a, r) for a, r in old)
    assert store.seen(P, AID, "fresh")


def test_commits_of_more_ids_than_a_sweep_forget_as_many_as_expire(
    store: AggregateStateStore,
) -> None:
    """Batches of 500 ids, more than `_REQUEST_SWEEP`, committed steadily over three
    windows: what is held stays about one window's ids, not a backlog growing by each
    commit's surplus over a fixed sweep."""
    states = states_on(store)
    per_batch, per_window = 500, 20
    step = WINDOW // per_window
    commits = 3 * per_window
    for c in range(commits):
        batch = CommandBatch(now=NOW + c * step)
        batch.applied.update((AID, f"r-{c}-{i}") for i in range(per_batch))
        states.staged(batch)
        states.committed(batch, [])
    last = NOW + (commits - 1) * step
    assert sweep_at(store, last) == 0, "no id past the window is left by the last commit"
    held = store.expire_requests(P, MAX_INSTANT, 10**9)
    assert held <= (per_window + 1) * per_batch, f"{held} ids held: a window's and a batch's"
