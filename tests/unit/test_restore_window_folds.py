"""A restore judges a request id folded as live did when it followed the event: within the
de-duplication window of that event's date.

- A request's event ids are the request's, the same on every decision of it: sent again
  once the window forgot it, it is decided again at the next version, and live folds both
  decisions. A restore took the second for the first's retried append (the same ids), or,
  with another decision between, found the first among the batch's ids whatever the
  window: a COMMITTED command left out of the state.

- A node's own copy taken back after a while held ids past the window that live had
  forgotten: a request sent again since and decided again elsewhere (its events the same
  ids, at the next version) was found folded in the store and left out of the state, and
  the node's next decision appended a second event at that version.
- Another writer's request decided twice within the window (its own de-duplication
  failed): live passes over the second; a restore reading both in one batch, once the
  first was past the window at the restore's time, folded it (the batch's ids judged by
  the restore's clock, not the event's).

Across batches (the store's ids, each at its event's date), `test_restore_id_dates`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
import pytest
from fakes import T0, OneBatchLog
from test_fold_rule import EVENTS, ORDER, PARTITIONS, Commits, P, orders, remind_cmd
from test_fold_rule_retried import OneByOne, ev

from app.commands.processor import CommandProcessor, state_key
from app.kafka import Record
from app.protocol.wire import encode
from tables.aggregate_store import MemoryAggregateStore

WINDOW = 1_000


class EventsOnly(Commits):
    """Keeps the events appended, in order (the log), and nothing else."""

    async def __call__(self, records: Sequence[Any], offsets: Any) -> list[int]:
        kept = []
        for r in records:
            if r[0] == EVENTS:
                self.records.append(r)
            kept.append(len(self.records) - 1 if r[0] == EVENTS else 0)
        return kept


def processor(store: MemoryAggregateStore, commits: Commits, clock: list[int]) -> CommandProcessor:
    return CommandProcessor(
        orders,
        P,
        partitions=PARTITIONS,
        states=store,
        commit=commits,
        now=lambda: clock[0],
        request_id_window=WINDOW,
    )


def state(store: MemoryAggregateStore) -> Any:
    return orjson.loads(store.get(P, state_key(ORDER)) or b"null")


def the_log(commits: Commits, stamps: list[int]) -> list[Record]:
    return [Record(EVENTS, P, i, r[2], r[3], stamps[i], ()) for i, r in enumerate(commits.records)]


async def test_a_copy_taken_back_past_the_window_folds_a_request_decided_again() -> None:
    clock = [T0]
    a_store, commits = MemoryAggregateStore(), EventsOnly()
    a = processor(a_store, commits, clock)
    await a.handle([], local=[remind_cmd("r-1")])
    await a.handle([], local=[remind_cmd("r-2")])
    stamps = [T0, T0]
    # B takes the partition, and decides r-1 again once the window forgot it.
    b_store = MemoryAggregateStore()
    b = processor(b_store, commits, clock)
    await b.restore(OneBatchLog(the_log(commits, stamps)))
    clock[0] += 10 * WINDOW
    await b._states.forget_expired(clock[0])
    await b.handle([], local=[remind_cmd("r-1")])
    assert state(b_store)["version"] == 3
    stamps.append(clock[0])
    # A takes it back, reading on from its own copy (at v2, r-1 among its ids).
    a_again = EventsOnly()
    await processor(a_store, a_again, clock).restore(OneBatchLog(the_log(commits, stamps)))
    assert state(a_store) == state(b_store)


async def test_another_writers_request_decided_twice_within_the_window_folds_once() -> None:
    theirs = [ev("e-1", 1, "w-1"), ev("e-2", 2, "w-2"), ev("e-1", 3, "w-1")]
    stamps = [T0, T0, T0 + WINDOW // 2]
    clock = [T0]
    live_store = MemoryAggregateStore()
    live = processor(live_store, Commits(), clock)
    for offset, event in enumerate(theirs):
        clock[0] = stamps[offset]
        batch = live.begin()
        live.follow(batch, event, offset)
        live.staged(batch)
        live.committed(batch, [])
    assert state(live_store)["version"] == 2  # the third passed over: w-1 kept
    log = [
        Record(EVENTS, P, i, ORDER.id.encode(), encode(e), stamps[i], ())
        for i, e in enumerate(theirs)
    ]
    clock[0] = T0 + WINDOW + 10  # v1 past the window by the restore's clock
    restored = MemoryAggregateStore()
    await processor(restored, Commits(), clock).restore(OneBatchLog(log))
    assert state(restored) == state(live_store)


@pytest.mark.parametrize("between", [False, True])
@pytest.mark.parametrize("one_by_one", [False, True])
async def test_a_request_decided_again_past_the_window_is_restored_as_live(
    between: bool, one_by_one: bool
) -> None:
    clock = [T0]
    store, commits = MemoryAggregateStore(), EventsOnly()
    live = processor(store, commits, clock)
    await live.handle([], local=[remind_cmd("r-1")])
    stamps = [T0]
    if between:
        await live.handle([], local=[remind_cmd("r-2")])
        stamps.append(T0)
    clock[0] += 10 * WINDOW
    await live._states.forget_expired(clock[0])
    await live.handle([], local=[remind_cmd("r-1")])
    stamps.append(clock[0])
    assert state(store)["version"] == len(stamps)
    log = the_log(commits, stamps)
    restored = MemoryAggregateStore()
    await processor(restored, Commits(), clock).restore(
        OneByOne(log) if one_by_one else OneBatchLog(log)
    )
    assert state(restored) == state(store)
