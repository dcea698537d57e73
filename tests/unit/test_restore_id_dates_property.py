"""Property: as time passes through the de-duplication window, a copy restoring the log in
batches of any size ends with the states and request ids of the node that followed it
live.

Live decides its own commands (a request sent again: a duplicate within the window,
decided again after it) and follows other writers' appends (a request of theirs decided
again, within the window or after), each record logged and dated when it is decided.
Live's sweep is modelled as keeping up (a commit's, before each step): its ids are those
within the window of the step's time, as the restore judges them by each event's date.

Not in two takes: the request folded last (`app.commands.folds.Mark`) is not carried from
one take's restore to the next, so a decision's events split by a take fold as they do
not live, whatever the dates (that case, within one batch each, is in
`test_restore_id_dates`)."""

from __future__ import annotations

import asyncio
from typing import Any

from fakes import T0
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fold_rule_property import REFS, Log, Reader, follow, orders

from app.commands.processor import CommandProcessor, state_key
from app.kafka import Record
from app.protocol.wire import CommandEnvelope, EventEnvelope, encode
from tables.aggregate_store import MemoryAggregateStore

WINDOW = 1_000
STEPS = [0, 1, WINDOW // 2, WINDOW - 1, WINDOW, WINDOW + 1, 2 * WINDOW]

own = st.tuples(st.just("own"), st.sampled_from([0, 1]), st.sampled_from(["own-0", "own-1"]))
theirs = st.tuples(
    st.just("theirs"),
    st.sampled_from([0, 1]),
    st.sampled_from(["w-0", "w-1"]),
    st.integers(-1, 2),  # the version, from the aggregate's
)


def processor(clock: list[int], log: Log) -> tuple[CommandProcessor, MemoryAggregateStore]:
    store = MemoryAggregateStore()
    node = CommandProcessor(
        orders,
        0,
        partitions=4,
        states=store,
        commit=log.commit,
        now=lambda: clock[0],
        request_id_window=WINDOW,
    )
    return node, store


async def live_and_restored(steps: list[tuple[int, tuple[Any, ...]]], size: int) -> None:
    clock, log, stamps = [T0], Log(), []
    live, live_store = processor(clock, log)
    ids: set[tuple[str, str]] = set()
    for n, (delta, step) in enumerate(steps):
        clock[0] += delta
        await live._states.forget_expired(clock[0])
        ref = REFS[step[1]]
        aid, start = state_key(ref), len(log.values)
        if step[0] == "own":
            cmd = CommandEnvelope(
                request_id=step[2],
                type="shop.Add",
                aggregate=ref,
                issued_at=clock[0],
                body={"k": 1},
                in_process=True,
            )
            await live.handle([], local=[cmd])
        else:
            stored = live._states.stored(aid)
            event = EventEnvelope(
                id=f"t{n}",
                type="shop.Added",
                aggregate=ref,
                version=max(1, (stored.version if stored else 0) + step[3]),
                request_id=step[2],
                created_at=clock[0],
            )
            log.append(ref.id.encode(), encode(event))
        ids.add((aid, step[2]))
        stamps += [clock[0]] * (len(log.values) - start)
        await follow(live, log, start)
    records = [
        Record("shop.order.events", 0, i, k, v, stamps[i], ())
        for i, (k, v) in enumerate(zip(log.keys, log.values, strict=True))
    ]
    fresh, fresh_store = processor(clock, Log())
    await fresh.restore(Reader(records, size))
    await live._states.forget_expired(clock[0])
    for ref in REFS:
        aid = state_key(ref)
        assert fresh_store.get(0, aid) == live_store.get(0, aid), aid
    for aid, rid in sorted(ids):
        assert fresh_store.seen(0, aid, rid) == live_store.seen(0, aid, rid), rid
        assert fresh_store.folded(0, aid, rid) == live_store.folded(0, aid, rid), rid


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(STEPS), st.one_of(own, theirs)), max_size=10),
    st.integers(1, 4),
)
def test_a_restore_keeps_the_request_ids_live_kept_as_time_passes(
    steps: list[tuple[int, tuple[Any, ...]]], size: int
) -> None:
    asyncio.run(live_and_restored(steps, size))
