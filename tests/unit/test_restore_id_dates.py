"""A restore keeps each request id from its own event's date, and judges an id folded
across its batches as within one: within the window of the later event's date.

- The restore wrote each batch's ids at the batch's newest date: an id was kept up to the
  batch's span past its own window. The same request decided again by another writer just
  past that window was taken for folded, left out of the state of the node that restored
  it, where the live node (each id at its own event's date) folded it.
- Another writer's request decided twice within the window: live passes the second over,
  and so does a restore reading both in one batch. Read one record a batch, or the copy
  taken back after the window at the restore's time, the store had forgotten the first
  (written only within the window at the restore's clock, swept at its start) and the
  second folded.
- An event of the request folded last, at the aggregate's version, dated past the window
  of its sibling: live, the request id forgotten, passes it over; a restore took it for
  the next event of that decision whatever the window, and folded it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from fakes import T0, OneBatchLog
from test_fold_rule import EVENTS, ORDER, PARTITIONS, Commits, P, orders
from test_fold_rule_retried import OneByOne, ev

from app.commands.processor import CommandProcessor, state_key
from app.kafka import Record
from app.protocol.wire import EventEnvelope, encode
from tables.aggregate_store import AggregateStateStore, MemoryAggregateStore, RocksAggregateStore

WINDOW = 1_000
AID = state_key(ORDER)


@pytest.fixture(params=["memory", "rocksdb"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[AggregateStateStore]]:
    """Two stores of the backend: the live node's and the restoring node's."""
    made: list[AggregateStateStore] = (
        [MemoryAggregateStore(), MemoryAggregateStore()]
        if request.param == "memory"
        else [RocksAggregateStore(tmp_path / "live"), RocksAggregateStore(tmp_path / "restored")]
    )
    yield made
    for s in made:
        s.close()


def processor(store: AggregateStateStore, clock: list[int]) -> CommandProcessor:
    return CommandProcessor(
        orders,
        P,
        partitions=PARTITIONS,
        states=store,
        commit=Commits(),
        now=lambda: clock[0],
        request_id_window=WINDOW,
    )


def follow(node: CommandProcessor, event: EventEnvelope, offset: int) -> None:
    """As the subscription follows one record: a batch of its own, committed."""
    batch = node.begin()
    node.follow(batch, event, offset)
    node.staged(batch)
    node.committed(batch, [])


def version(store: AggregateStateStore) -> Any:
    return orjson.loads(store.get(P, AID) or b"null")["version"]


def the_log(events: list[EventEnvelope], stamps: list[int]) -> list[Record]:
    return [
        Record(EVENTS, P, i, ORDER.id.encode(), encode(e), stamps[i], ())
        for i, e in enumerate(events)
    ]


def dated(event: EventEnvelope, at: int) -> EventEnvelope:
    return event.model_copy(update={"created_at": at})


async def test_a_restore_keeps_each_request_id_from_its_own_date(
    stores: list[AggregateStateStore],
) -> None:
    clock = [T0]
    stamps = [T0, T0 + WINDOW // 2]
    theirs = [dated(ev("e-1", 1, "w-1"), stamps[0]), dated(ev("e-2", 2, "w-2"), stamps[1])]
    live_store, restored = stores
    live = processor(live_store, clock)
    for offset, event in enumerate(theirs):
        clock[0] = stamps[offset]
        follow(live, event, offset)
    clock[0] += 1  # both within the window: a restore in one batch keeps both
    node = processor(restored, clock)
    await node.restore(OneBatchLog(the_log(theirs, stamps)))
    # Just past w-1's window (within w-2's): a sweep forgets it, and another writer
    # decides it again (its event ids the same) at the next version.
    clock[0] = T0 + WINDOW + 10
    again = dated(ev("e-1", 3, "w-1"), clock[0])
    for n, s in ((live, live_store), (node, restored)):
        await n._states.forget_expired(clock[0])
        assert not s.seen(P, AID, "w-1") and s.seen(P, AID, "w-2")
        follow(n, again, 2)
    assert version(live_store) == 3
    assert restored.get(P, AID) == live_store.get(P, AID)


@pytest.mark.parametrize("read", ["one batch", "one by one", "taken back"])
async def test_another_writers_request_decided_twice_within_the_window_folds_once(
    stores: list[AggregateStateStore], read: str
) -> None:
    stamps = [T0, T0, T0 + WINDOW // 2]
    theirs = [ev("e-1", 1, "w-1"), ev("e-2", 2, "w-2"), ev("e-1", 3, "w-1")]
    theirs = [dated(e, at) for e, at in zip(theirs, stamps, strict=True)]
    clock = [T0]
    live_store, restored = stores
    live = processor(live_store, clock)
    for offset, event in enumerate(theirs):
        clock[0] = stamps[offset]
        follow(live, event, offset)
    assert version(live_store) == 2  # the third passed over: w-1 kept
    log = the_log(theirs, stamps)
    if read == "taken back":
        clock[0] = T0 + 10  # a copy restored up to w-2, within w-1's window
        await processor(restored, clock).restore(OneBatchLog(log[:2]))
    clock[0] = T0 + WINDOW + 10  # w-1 past the window by the restore's clock
    await processor(restored, clock).restore(
        OneByOne(log) if read == "one by one" else OneBatchLog(log)
    )
    assert restored.get(P, AID) == live_store.get(P, AID)


@pytest.mark.parametrize("read", ["one batch", "one by one"])
async def test_the_next_event_of_a_request_past_its_window_is_passed_over_as_live(
    stores: list[AggregateStateStore], read: str
) -> None:
    stamps = [T0, T0 + WINDOW]
    theirs = [dated(ev("e-1", 1, "w-1"), stamps[0]), dated(ev("e-2", 1, "w-1"), stamps[1])]
    clock = [T0]
    live_store, restored = stores
    live = processor(live_store, clock)
    for offset, event in enumerate(theirs):
        clock[0] = stamps[offset]
        await live._states.forget_expired(clock[0])  # a commit's sweep, kept up
        follow(live, event, offset)
    assert orjson.loads(live_store.get(P, AID) or b"")["state"]["reminded"] == 1
    clock[0] += 10
    log = the_log(theirs, stamps)
    await processor(restored, clock).restore(
        OneByOne(log) if read == "one by one" else OneBatchLog(log)
    )
    assert restored.get(P, AID) == live_store.get(P, AID)


async def test_a_rebuild_of_a_long_log_writes_no_id_past_the_window_of_what_it_read_before(
    stores: list[AggregateStateStore],
) -> None:
    """Read one record a batch: an id dated a window before the newest event read ahead of
    it is one live had forgotten by then: not written (a rebuild of a long log writes no
    id of its old part only to sweep it at its end)."""
    stamps = [T0, T0 + 3 * WINDOW, T0 + WINDOW]  # the third dated back by its writer
    theirs = [ev("e-1", 1, "w-1"), ev("e-2", 2, "w-2"), ev("e-3", 3, "w-3")]
    theirs = [dated(e, at) for e, at in zip(theirs, stamps, strict=True)]
    _, restored = stores
    written: list[tuple[str, str]] = []
    write = restored.write

    def spied(partition: int, states: Any, requests: Any, *args: Any, **kw: Any) -> None:
        requests = list(requests)
        written.extend(requests)
        write(partition, states, requests, *args, **kw)

    restored.write = spied  # type: ignore[method-assign]
    await processor(restored, [T0 + 3 * WINDOW + 10]).restore(OneByOne(the_log(theirs, stamps)))
    assert [rid for _, rid in written] == ["w-1", "w-2"]
    assert version(restored) == 3, "folded all the same"
