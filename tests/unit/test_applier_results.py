"""What an applier returns is stored only when a later load can read it back.

An applier's result is the aggregate's next state. pydantic's `model_copy(update=...)`
validates nothing, so an applier may hand back a field its type cannot hold (an int
field holding "many"); dumped as it is (pydantic only warns), the stored state would
fail every later load, so every later command on the aggregate would be answered ERROR.
An applier may also return something that is not the state at all. Either way, the
command that emitted the event is answered ERROR and dead-lettered, the aggregate stays
as it was and takes the next command. A restore passes over such an event.

pydantic's serializer warning is ignored here, as it is in production: the suite's
`-W error` would otherwise turn it into the very refusal under test.
"""

from __future__ import annotations

from typing import Any

import pytest
from fakes import CommitLog
from pydantic import BaseModel

from app.commands.processor import CommandProcessor, state_key
from app.kafka import Record
from app.model.aggregate import AggregateType, Command, Decision
from app.model.decide import StoredAggregate, fold
from app.protocol.wire import CommandEnvelope, EventEnvelope, ResultCode, encode
from tables import AggregateRef
from tables.aggregate_store import MemoryAggregateStore
from tables.partitioner import partition_of

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

T0 = 1_800_000_000_000
PARTITIONS = 4


class Counter(BaseModel):
    count: int = 0


class Other(BaseModel):
    count: int = 0


counters = AggregateType("shop", "counter", Counter)


@counters.command("shop.Count")
def count(state: Counter, cmd: Command, d: Decision) -> None:
    d.emit(cmd.body["as"], {"to": cmd.body["to"]})


@counters.applies("shop.Counted")
def counted(state: Counter, e: Any) -> Counter:
    return state.model_copy(update={"count": e.body["to"]})  # not validated


@counters.applies("shop.AsDict")
def as_dict(state: Counter, e: Any) -> Any:
    return {"count": e.body["to"]}


@counters.applies("shop.AsOther")
def as_other(state: Counter, e: Any) -> Any:
    return Other(count=e.body["to"])


@counters.applies("shop.AsNone")
def as_none(state: Counter, e: Any) -> Any:
    return None


REF = AggregateRef(context="shop", aggregate="counter", id="c-1")
P = partition_of(REF.id, PARTITIONS)


def command(request_id: str, as_: str, to: Any, offset: int) -> Record:
    cmd = CommandEnvelope(
        request_id=request_id,
        type="shop.Count",
        aggregate=REF,
        issued_at=T0,
        body={"as": as_, "to": to},
    )
    return Record("shop.counter.commands", P, offset, REF.id.encode(), encode(cmd), T0)


@pytest.mark.parametrize(
    ("as_", "to", "why"),
    [
        ("shop.Counted", "many", "serializ"),  # pydantic's serialization error
        ("shop.Counted", 1.5, "serializ"),
        ("shop.AsDict", 2, "returned dict, not Counter"),
        ("shop.AsOther", 2, "returned Other, not Counter"),
        ("shop.AsNone", 2, "returned NoneType, not Counter"),
    ],
)
async def test_a_state_an_applier_made_unreadable_is_not_stored(
    as_: str, to: Any, why: str
) -> None:
    log, states = CommitLog(), MemoryAggregateStore()
    proc = CommandProcessor(
        counters, P, partitions=PARTITIONS, states=states, commit=log, now=lambda: T0
    )
    await proc.handle([command("r-1", "shop.Counted", 1, 0)])
    await proc.handle([command("r-2", as_, to, 1), command("r-3", "shop.Counted", 3, 2)])
    results = log.last("results")
    assert [(r["request_id"], r["code"]) for r in results] == [
        ("r-2", ResultCode.ERROR),
        ("r-3", ResultCode.COMMITTED),
    ]
    assert why in results[0]["message"]
    assert len(log.last("dead-letters")) == 1
    stored = proc._states.stored(state_key(REF))
    assert stored is not None and stored.state == {"count": 3} and stored.version == 2
    # And the aggregate still takes commands: its stored state loads.
    await proc.handle([command("r-4", "shop.Counted", 4, 3)])
    assert [r["code"] for r in log.last("results")] == [ResultCode.COMMITTED]


def event(version: int, as_: str, to: Any) -> EventEnvelope:
    return EventEnvelope(
        id=f"e-{version}",
        type=as_,
        aggregate=REF,
        version=version,
        created_at=T0,
        body={"to": to},
    )


def test_fold_refuses_a_wrong_typed_field_and_folds_a_valid_one() -> None:
    stored = StoredAggregate(version=1, state={"count": 1})
    with pytest.raises(Exception, match="serializ"):
        fold(counters, stored, [event(2, "shop.Counted", "many")])
    with pytest.raises(TypeError, match="returned dict"):
        fold(counters, stored, [event(2, "shop.AsDict", 2)])
    folded = fold(counters, stored, [event(2, "shop.Counted", 7)])
    assert folded.state == {"count": 7} and folded.version == 2


class Counted(BaseModel):
    to: int


@counters.command("shop.CountModel")
def count_model(state: Counter, cmd: Command, d: Decision) -> None:
    body = Counted(to=1).model_copy(update={"to": cmd.body["to"]})  # not validated
    d.emit("shop.Noted", body)  # no applier: only the event carries it


async def test_an_event_body_model_with_a_wrong_typed_field_is_the_handlers_error() -> None:
    log, states = CommitLog(), MemoryAggregateStore()
    proc = CommandProcessor(
        counters, P, partitions=PARTITIONS, states=states, commit=log, now=lambda: T0
    )
    bad = CommandEnvelope(
        request_id="r-1", type="shop.CountModel", aggregate=REF, issued_at=T0, body={"to": "x"}
    )
    good = bad.model_copy(update={"request_id": "r-2", "body": {"to": 5}})
    await proc.handle(
        [
            Record("shop.counter.commands", P, 0, REF.id.encode(), encode(bad), T0),
            Record("shop.counter.commands", P, 1, REF.id.encode(), encode(good), T0),
        ]
    )
    results = log.last("results")
    assert [(r["request_id"], r["code"]) for r in results] == [
        ("r-1", ResultCode.ERROR),
        ("r-2", ResultCode.COMMITTED),
    ]
    assert "serializ" in results[0]["message"]
    assert [e["body"] for e in log.last("events")] == [{"to": 5}]
