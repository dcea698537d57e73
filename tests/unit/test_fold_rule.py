"""A restore folds the events the live follow folds, no more (`app.commands.folds`).

The restore folded every event of the log; the live follow folds another writer's event
only when it is ahead of the aggregate. Another writer's stale append (an event at a
version the aggregate is past: a late `wow.AggregateDeleted`, a user event) was passed
over live and folded by a node restoring the partition from the log: after the retake
every command on a deleted-in-the-restore aggregate was REJECTED where the live node
answered COMMITTED. An unknown `wow.` event, refused live before it is followed
(dead-lettered), was folded by a restore too: the aggregate jumped to its version."""

from __future__ import annotations

from collections.abc import Sequence

import orjson
import pytest
from fakes import T0, OneBatchLog
from pydantic import BaseModel

from app.commands.folds import Mark, continues, folds
from app.commands.processor import CommandProcessor, state_key
from app.kafka import OutRecord, Record
from app.model.aggregate import AggregateType, Command, Decision, Event
from app.protocol.wire import (
    AGGREGATE_DELETED,
    SCHEDULE_SET,
    CommandEnvelope,
    EventEnvelope,
    encode,
    unknown_system_event,
)
from tables import AggregateRef
from tables.aggregate_store import MemoryAggregateStore
from tables.partitioner import partition_of

PARTITIONS = 4
ORDER = AggregateRef(context="shop", aggregate="order", id="o-1")
P = partition_of(ORDER.id, PARTITIONS)
EVENTS = "shop.order.events"


class Order(BaseModel):
    reminded: int = 0


orders = AggregateType("shop", "order", Order)


@orders.command("shop.Remind")
def remind(state: Order, cmd: Command, d: Decision) -> None:
    d.emit("shop.Reminded", {})


@orders.applies("shop.Reminded")
def reminded(state: Order, e: Event) -> Order:
    return state.model_copy(update={"reminded": state.reminded + 1})


class Commits:
    def __init__(self) -> None:
        self.records: list[OutRecord] = []

    async def __call__(self, records: Sequence[OutRecord], offsets: object) -> list[int]:
        start = len(self.records)
        self.records += list(records)
        return list(range(start, len(self.records)))


def processor(commits: Commits) -> tuple[CommandProcessor, MemoryAggregateStore]:
    store = MemoryAggregateStore()
    node = CommandProcessor(
        orders, P, partitions=PARTITIONS, states=store, commit=commits, now=lambda: T0
    )
    return node, store


def remind_cmd(request_id: str) -> CommandEnvelope:
    return CommandEnvelope(
        request_id=request_id,
        type="shop.Remind",
        aggregate=ORDER,
        issued_at=T0,
        in_process=True,
    )


def other(type_: str, version: int) -> EventEnvelope:
    return EventEnvelope(
        id=f"other-{type_}-{version}",
        type=type_,
        aggregate=ORDER,
        version=version,
        created_at=T0,
        body={},
    )


async def live_then_restored(
    stale: EventEnvelope, *, followed: bool = False
) -> tuple[object, object, bool, bool]:
    """Decides versions 1 and 2 live, then another writer's `stale` at offset 2 is followed
    (unless the subscription refuses it first); a fresh copy restores the same log. The
    aggregate as each keeps it, and whether each took `stale`'s request as applied."""
    commits = Commits()
    live, live_store = processor(commits)
    await live.handle([], local=[remind_cmd("r-1")])
    await live.handle([], local=[remind_cmd("r-2")])
    batch = live.begin()
    if unknown_system_event(stale.type, orders.appliers.keys()) is None:
        assert live.follow(batch, stale, 2) is followed
    live.staged(batch)
    live.committed(batch, [])
    log = [
        Record(EVENTS, P, i, r[2], r[3], T0, ())
        for i, r in enumerate(r for r in commits.records if r[0] == EVENTS)
    ]
    assert len(log) == 2
    log.append(Record(EVENTS, P, 2, ORDER.id.encode(), encode(stale), T0, ()))
    fresh, fresh_store = processor(Commits())
    await fresh.restore(OneBatchLog(log))
    aid, rid = state_key(ORDER), f"event:{stale.id}"
    return (
        orjson.loads(live_store.get(P, aid) or b"null"),
        orjson.loads(fresh_store.get(P, aid) or b"null"),
        live_store.seen(P, aid, rid),
        fresh_store.seen(P, aid, rid),
    )


@pytest.mark.parametrize(
    "stale",
    [
        other("shop.Reminded", 1),  # a stale user event: behind the aggregate
        other("shop.Reminded", 2),  # at its version, of no request folded
        other(AGGREGATE_DELETED, 1),  # a stale delete
        other(AGGREGATE_DELETED, 2),
        other("wow.Bogus", 50),  # refused live, whatever its version
    ],
    ids=["user-behind", "user-at", "delete-behind", "delete-at", "unknown-system-ahead"],
)
async def test_a_restore_folds_what_the_live_follow_folds(stale: EventEnvelope) -> None:
    live, restored, live_applied, restored_applied = await live_then_restored(stale)
    assert live == {"version": 2, "deleted": False, "state": {"reminded": 2}}
    assert restored == live
    assert restored_applied is live_applied is False


async def test_an_event_ahead_is_folded_by_both() -> None:
    live, restored, live_applied, restored_applied = await live_then_restored(
        other("shop.Reminded", 3), followed=True
    )
    assert live == {"version": 3, "deleted": False, "state": {"reminded": 3}}
    assert restored == live
    assert restored_applied is live_applied is True


async def test_a_delete_ahead_is_folded_by_both() -> None:
    live, restored, *_ = await live_then_restored(other(AGGREGATE_DELETED, 3), followed=True)
    assert live == {"version": 3, "deleted": True, "state": {"reminded": 2}}
    assert restored == live


async def test_a_restore_folds_every_event_of_a_decision() -> None:
    # This node's decisions (one version each) and another writer's of two events at one
    # version, read back: all folded, as they were live.
    commits = Commits()
    live, live_store = processor(commits)
    await live.handle([], local=[remind_cmd("r-1")])
    theirs = [
        EventEnvelope(
            id=f"w-1/{i}",
            type="shop.Reminded",
            aggregate=ORDER,
            version=2,
            request_id="w-1",
            created_at=T0,
            body={},
        )
        for i in range(2)
    ]
    batch = live.begin()
    assert [live.follow(batch, e, 1 + i) for i, e in enumerate(theirs)] == [True, True]
    live.staged(batch)
    live.committed(batch, [])
    await live.handle([], local=[remind_cmd("r-2")])
    own = [r for r in commits.records if r[0] == EVENTS]
    values = [own[0][3], *(encode(e) for e in theirs), own[1][3]]
    log = [Record(EVENTS, P, i, ORDER.id.encode(), v, T0, ()) for i, v in enumerate(values)]
    fresh, fresh_store = processor(Commits())
    await fresh.restore(OneBatchLog(log))
    aid = state_key(ORDER)
    assert orjson.loads(fresh_store.get(P, aid) or b"") == {
        "version": 3,
        "deleted": False,
        "state": {"reminded": 4},
    }
    assert fresh_store.get(P, aid) == live_store.get(P, aid)
    for rid in ("r-1", "w-1", "r-2"):
        assert fresh_store.folded(P, aid, rid) and live_store.folded(P, aid, rid)


def test_the_rule() -> None:
    # Of a request not folded yet: ahead alone.
    assert folds(3, 2, folded=False, continues=False)
    assert not folds(2, 2, folded=False, continues=False)
    assert not folds(1, 2, folded=False, continues=False)
    # The next event of the request folded last: at the version too.
    assert folds(2, 2, folded=True, continues=True)
    assert folds(3, 2, folded=True, continues=True)
    assert not folds(1, 2, folded=True, continues=True)
    # Of a request folded before, not the next of the last: never (its own read back).
    assert not folds(3, 2, folded=True, continues=False)
    assert continues(Mark("r", 4, ("e-4",), 1), "r", 5, "e-5", 1)
    assert not continues(Mark("r", 4, ("e-4",), 1), "r", 4, "e-5", 1)
    assert not continues(Mark("r", 4, ("e-4",), 1), "s", 5, "e-5", 1)
    assert not continues(Mark("r", 4, ("e-4",), 1), "r", 5, "e-4", 1)  # appended again
    # The request decided again (its ids are the request's), at another version.
    assert continues(Mark("r", 4, ("e-4",), 1), "r", 5, "e-4", 2)
    assert not continues(None, "r", 5, "e-5", 1)
    assert unknown_system_event("wow.Bogus", ()) is not None
    assert unknown_system_event("wow.Bogus", ("wow.Bogus",)) is None
    assert unknown_system_event(AGGREGATE_DELETED, ()) is None
    assert unknown_system_event(SCHEDULE_SET, ()) is None
    assert unknown_system_event("shop.Anything", ()) is None
