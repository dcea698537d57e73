"""What a service author's code does is the record's that ran it, never the node's.

What an applier returns is stored only when a later load can read it back.

An applier's result is the aggregate's next state. pydantic's `model_copy(update=...)`
validates nothing, so an applier may hand back a field its type cannot hold (an int
field holding "many"); dumped as it is (pydantic only warns), the stored state would
fail every later load, so every later command on the aggregate would be answered ERROR.
An applier may also return something that is not the state at all. Either way, the
command that emitted the event is answered ERROR and dead-lettered, the aggregate stays
as it was and takes the next command. A restore passes over such an event.

Whatever a handler, an applier or a job function raises (SystemExit, KeyboardInterrupt,
GeneratorExit, a CancelledError, a MemoryError, an exception whose text cannot be read)
answers its command ERROR, and the partition goes on: before, the first two ended the
worker on every node that took the partition, the others retook it for ever. Neither can
change in place what the batch holds (the state it is given, an event's body), and an
`async def` handler is refused where it is declared.

pydantic's serializer warning is ignored here, as it is in production (a list in a tuple
field warns, and is right): the suite's `-W error` would otherwise raise it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any, ClassVar, NamedTuple

import pytest
from fakes import CommitLog
from pydantic import BaseModel, Field, ValidationError, model_validator

from app.commands.processor import CommandProcessor, state_key
from app.jobs import Job, JobRun, JobScope
from app.kafka import Record
from app.model.aggregate import MAX_DECISION_RECORDS, AggregateType, Command, Decision
from app.model.decide import StoredAggregate, decide, fold
from app.model.user_code import UserCodeFailed
from app.protocol.wire import CommandEnvelope, EventEnvelope, ResultCode, encode
from tables import AggregateRef, IntervalRule
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


class OnLog(NamedTuple):
    """A processor of `agg`'s aggregate `ref` (its partition's) committing to `log`."""

    proc: CommandProcessor
    log: CommitLog
    ref: AggregateRef

    def record(self, request_id: str, type_: str, body: dict[str, Any], offset: int) -> Record:
        """A command to `ref`, as its partition of the command topic holds it."""
        ref = self.ref
        cmd = CommandEnvelope(
            request_id=request_id, type=type_, aggregate=ref, issued_at=T0, body=body
        )
        topic = f"{ref.context}.{ref.aggregate}.commands"
        return Record(topic, self.proc.partition, offset, ref.id.encode(), encode(cmd), T0)

    def stored(self) -> dict[str, Any] | None:
        stored = self.proc._states.stored(state_key(self.ref))
        return None if stored is None else stored.state


def on_log(agg: AggregateType[Any]) -> OnLog:
    ref = REF.model_copy(update={"aggregate": agg.name})
    log = CommitLog()
    proc = CommandProcessor(
        agg,
        partition_of(ref.id, PARTITIONS),
        partitions=PARTITIONS,
        states=MemoryAggregateStore(),
        commit=log,
        now=lambda: T0,
    )
    return OnLog(proc, log, ref)


def command(request_id: str, as_: str, to: Any, offset: int) -> Record:
    return on_log(counters).record(request_id, "shop.Count", {"as": as_, "to": to}, offset)


@pytest.mark.parametrize(
    ("as_", "to", "why"),
    [
        ("shop.Counted", "many", "valid integer"),  # loaded back as the next load would
        ("shop.Counted", 1.5, "fractional part"),
        ("shop.AsDict", 2, "returned dict, not Counter"),
        ("shop.AsOther", 2, "returned Other, not Counter"),
        ("shop.AsNone", 2, "returned NoneType, not Counter"),
    ],
)
async def test_a_state_an_applier_made_unreadable_is_not_stored(
    as_: str, to: Any, why: str
) -> None:
    proc, log, _ = on = on_log(counters)
    await proc.handle([command("r-1", "shop.Counted", 1, 0)])
    await proc.handle([command("r-2", as_, to, 1), command("r-3", "shop.Counted", 3, 2)])
    results = log.last("results")
    assert [(r["request_id"], r["code"]) for r in results] == [
        ("r-2", ResultCode.ERROR),
        ("r-3", ResultCode.COMMITTED),
    ]
    assert why in results[0]["message"]
    assert len(log.last("dead-letters")) == 1
    assert on.stored() == {"count": 3}
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
    with pytest.raises(ValidationError, match="valid integer"):
        fold(counters, stored, [event(2, "shop.Counted", "many")])
    with pytest.raises(TypeError, match="returned dict"):
        fold(counters, stored, [event(2, "shop.AsDict", 2)])
    folded = fold(counters, stored, [event(2, "shop.Counted", 7)])
    assert folded.state == {"count": 7} and folded.version == 2


class Limited(BaseModel):
    count: int = Field(default=0, ge=0)


limited = AggregateType("shop", "limited", Limited)


@limited.command("shop.Count")
def count_limited(state: Limited, cmd: Command, d: Decision) -> None:
    d.emit("shop.Counted", {"to": cmd.body["to"]})


@limited.applies("shop.Counted")
def counted_limited(state: Limited, e: Any) -> Limited:
    return state.model_copy(update={"count": e.body["to"]})  # its constraint not checked


async def test_a_state_its_own_model_refuses_is_not_stored() -> None:
    """`ge=0` holds for no -1, though -1 is an int: the state is validated as a load
    would, not only dumped."""
    proc, log, _ = on = on_log(limited)
    await proc.handle(
        [on.record(f"r-{i}", "shop.Count", {"to": to}, i) for i, to in enumerate([-1, 2, 3])]
    )
    codes = [(r["request_id"], r["code"]) for r in log.last("results")]
    assert codes == [
        ("r-0", ResultCode.ERROR),
        ("r-1", ResultCode.COMMITTED),
        ("r-2", ResultCode.COMMITTED),
    ]
    assert on.stored() == {"count": 3}


class Raises(Exception):
    """An exception whose text cannot be read: its __str__ returns an int."""

    def __str__(self) -> str:
        return 7  # type: ignore[return-value]

    def __repr__(self) -> str:
        return 7  # type: ignore[return-value]


RAISED: dict[str, BaseException] = {
    "SystemExit": SystemExit(3),
    "KeyboardInterrupt": KeyboardInterrupt(),
    "GeneratorExit": GeneratorExit(),
    "CancelledError": asyncio.CancelledError(),
    "MemoryError": MemoryError(),
    "Raises": Raises(),
}

raisers = AggregateType("shop", "raiser", Counter)


@raisers.command("shop.Raise")
def raise_in_handler(state: Counter, cmd: Command, d: Decision) -> None:
    if cmd.body.get("in") == "handler":
        raise RAISED[cmd.body["what"]]
    d.emit("shop.Raised", cmd.body)


@raisers.applies("shop.Raised")
def raise_in_applier(state: Counter, e: Any) -> Counter:
    if e.body.get("in") == "applier":
        raise RAISED[e.body["what"]]
    return state.model_copy(update={"count": state.count + 1})


@pytest.mark.parametrize("where", ["handler", "applier"])
@pytest.mark.parametrize("what", sorted(RAISED))
async def test_whatever_user_code_raises_answers_its_command_error(where: str, what: str) -> None:
    proc, log, _ = on = on_log(raisers)
    await proc.handle(
        [
            on.record("r-1", "shop.Raise", {"in": where, "what": what}, 0),
            on.record("r-2", "shop.Raise", {}, 1),
        ]
    )
    results = log.last("results")
    assert [(r["request_id"], r["code"]) for r in results] == [
        ("r-1", ResultCode.ERROR),
        ("r-2", ResultCode.COMMITTED),
    ]
    assert what in results[0]["message"] or "cannot be read" in results[0]["message"]
    assert len(log.last("dead-letters")) == 1
    assert on.stored() == {"count": 1}


def test_a_restore_passes_over_an_event_whose_applier_raises_systemexit() -> None:
    event = EventEnvelope(
        id="e-1",
        type="shop.Raised",
        aggregate=REF.model_copy(update={"aggregate": "raiser"}),
        version=1,
        created_at=T0,
        body={"in": "applier", "what": "SystemExit"},
    )
    with pytest.raises(UserCodeFailed, match="SystemExit"):
        fold(raisers, None, [event])


class Holder(BaseModel):
    data: dict[str, Any] = Field(default_factory=dict)


holders = AggregateType("shop", "holder", Holder)


@holders.command("shop.Touch")
def touch(state: Holder, cmd: Command, d: Decision) -> None:
    if cmd.body.get("refuse"):
        state.data["inner"]["v"] += 1000  # changed in place, then refused
        d.reject("refused after changing what it was given")
    d.emit("shop.Touched", {"inner": {"v": cmd.body["v"]}, "keep": cmd.body["v"]})


@holders.applies("shop.Touched")
def touched(state: Holder, e: Any) -> Holder:
    keep = e.body.pop("keep")  # changes the body it is given
    state.data.setdefault("inner", {"v": 0})["v"] = e.body["inner"]["v"]
    e.body["inner"]["v"] = -1
    return state.model_copy(update={"data": {**state.data, "keep": keep}})


async def test_user_code_changing_what_it_is_given_changes_nothing_stored_or_written() -> None:
    """A handler that changes the state it is given in place and then refuses, and an
    applier that changes the event's body: the aggregate is what the log's events fold
    to, and the events are written as the handler emitted them."""
    proc, log, _ = on = on_log(holders)

    def rec(request_id: str, body: dict[str, Any], offset: int) -> Record:
        return on.record(request_id, "shop.Touch", body, offset)

    await proc.handle([rec("r-1", {"v": 1}, 0), rec("r-2", {"v": 1, "refuse": True}, 1)])
    assert [r["body"] for r in log.last("events")] == [{"inner": {"v": 1}, "keep": 1}]
    await proc.handle([rec("r-3", {"v": 2}, 2)])
    assert on.stored() == {"data": {"inner": {"v": 2}, "keep": 2}}
    # The same as a fold of the events written, from nothing.
    written = [
        EventEnvelope.model_validate(json.loads(r[3] or b""))
        for c in log.commits
        for r in c
        if r[0].endswith("events")
    ]
    assert fold(holders, None, written).state == on.stored()


def test_async_handlers_appliers_and_jobs_are_refused_where_declared() -> None:
    agg = AggregateType("shop", "asyncs", Counter)

    async def handler(state: Counter, cmd: Command, d: Decision) -> None:
        d.emit("shop.X", {})

    async def applier(state: Counter, e: Any) -> Counter:
        return state

    with pytest.raises(TypeError, match="not async def"):
        agg.command("shop.X")(handler)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not async def"):
        agg.applies("shop.X")(applier)  # type: ignore[arg-type]

    async def job(run: JobRun) -> None:
        run.send(REF, "shop.X")

    with pytest.raises(TypeError, match="not async def"):
        Job("nightly", JobScope.SYSTEM, IntervalRule(start=0, every=60_000), job)  # type: ignore[arg-type]


class AsyncCall:
    """A handler object whose `__call__` is async: declared, but its result is refused."""

    async def __call__(self, state: Counter, cmd: Command, d: Decision) -> None:
        d.emit("shop.Counted", {"to": 1})


async def test_a_handler_object_whose_call_is_async_answers_error() -> None:
    agg = AggregateType("shop", "counter", Counter)
    agg.command("shop.Count")(AsyncCall())  # type: ignore[arg-type]
    proc, log, _ = on_log(agg)
    await proc.handle([command("r-1", "shop.Counted", 1, 0)])
    results = log.last("results")
    assert [r["code"] for r in results] == [ResultCode.ERROR]
    assert "must not be async" in results[0]["message"]


class YieldingCall:
    """A handler object whose `__call__` yields: calling it runs none of its body."""

    ran: ClassVar[list[str]] = []

    def __call__(self, state: Counter, cmd: Command, d: Decision) -> Iterator[None]:
        self.ran.append(cmd.request_id)
        d.emit("shop.Counted", {})
        yield


def test_a_handler_object_whose_call_yields_is_refused_where_declared() -> None:
    agg = AggregateType("shop", "counter", Counter)
    with pytest.raises(TypeError, match="not a generator"):
        agg.command("shop.Count")(YieldingCall())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a generator"):
        agg.applies("shop.Counted")(YieldingCall())  # type: ignore[arg-type]
    assert YieldingCall.ran == []


changers = AggregateType("shop", "changer", Counter)


@changers.command("shop.Fire")
def fire(state: Counter, cmd: Command, d: Decision) -> None:
    if "cfg" in cmd.body:
        cmd.body["cfg"]["level"] = 99  # changed in place, nested
    cmd.body["seen"] = object()  # changes the command it is given: nothing JSON holds
    d.emit("shop.Fired", {})


def test_a_timers_command_its_handler_changes_is_written_as_sent() -> None:
    """A timer's command fired in-process is written to the command topic as the record
    of what was sent: encoded before its handler ran, which may change its body (here to
    what no encoder writes, which had failed the cycle and retaken the partition)."""
    proc, _, ref = on_log(changers)
    cmd = CommandEnvelope(
        request_id="t-1", type="shop.Fire", aggregate=ref, issued_at=T0, body={"n": 1}
    )
    batch = proc.begin()
    decided = proc.decide_local(batch, [cmd])
    assert [(c.request_id, code) for c, code, _ in decided] == [("t-1", ResultCode.COMMITTED)]
    sent = [r for r in batch.out if r[0].endswith("commands")]
    assert len(sent) == 1 and json.loads(sent[0][3] or b"")["body"] == {"n": 1}


class Loose(BaseModel):
    """Fields an applier's `model_copy` fills with a near type pydantic warns about while
    dumping and loading it back as it should."""

    tags: tuple[str, ...] = ()
    names: list[str] = []
    balance: Decimal = Decimal("1.5")
    count: int | None = None
    price: float = 0.0


looses = AggregateType("shop", "loose", Loose)


@looses.command("shop.Do")
def do(state: Loose, cmd: Command, d: Decision) -> None:
    d.emit("shop.Done", cmd.body)


@looses.applies("shop.Done")
def done(state: Loose, e: Any) -> Loose:
    match e.body["what"]:
        case "tag":
            return state.model_copy(update={"tags": [*state.tags, "x"]})  # a list in a tuple
        case "names":
            return state.model_copy(update={"names": ("a", "b")})  # a tuple in a list
        case "reset":
            return state.model_copy(update={"balance": 0})  # an int in a Decimal
        case "count":
            return state.model_copy(update={"count": 2.0})  # a float in int | None
    return state.model_copy(update={"price": float("nan")})


@pytest.mark.parametrize("what", ["tag", "names", "reset", "count"])
def test_a_near_type_that_loads_back_is_stored_as_before(what: str) -> None:
    """Refused while pydantic's serializer warnings counted as errors (a review caught it:
    every such command ERROR, a restore passing over its event)."""
    ref = REF.model_copy(update={"aggregate": "loose"})
    cmd = CommandEnvelope(
        request_id="r-1", type="shop.Do", aggregate=ref, issued_at=T0, body={"what": what}
    )
    d = decide(looses, None, cmd, now=T0, seen=False)
    assert d.code == ResultCode.COMMITTED, d.message
    assert d.stored is not None
    assert Loose.model_validate(d.stored.state) is not None


class Amount(BaseModel):
    value: float = 0.0


class Priced(BaseModel):
    price: Amount = Amount()

    @model_validator(mode="before")
    @classmethod
    def migrate(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("price"), dict):
            data["price"] = Amount(**data["price"])  # rewrites what it is given, in place
        return data


priced = AggregateType("shop", "priced", Priced)


@priced.command("shop.Price")
def price(state: Priced, cmd: Command, d: Decision) -> None:
    d.emit("shop.Priced", {})


@priced.applies("shop.Priced")
def priced_at(state: Priced, e: Any) -> Priced:
    return state.model_copy(update={"price": Amount(value=float("nan"))})


def test_a_number_json_cannot_hold_is_refused_whatever_a_validator_does_with_the_dict() -> None:
    """The state is loaded back from a copy of what is stored: a before-validator handed
    the stored dict itself put an object in it, whose NaN the finite check passed over
    (stored as null, every later load failed)."""
    ref = REF.model_copy(update={"aggregate": "priced"})
    cmd = CommandEnvelope(request_id="r-1", type="shop.Price", aggregate=ref, issued_at=T0)
    with pytest.raises(ValueError, match="not a finite number"):
        decide(priced, None, cmd, now=T0, seen=False)


class Unprintable(Exception):
    def __str__(self) -> str:
        raise SystemExit(3)

    def __repr__(self) -> str:
        raise SystemExit(3)


def test_an_exception_whose_text_raises_systemexit_is_still_the_commands() -> None:
    agg = AggregateType("shop", "unprintable", Counter)

    @agg.command("shop.X")
    def x(state: Counter, cmd: Command, d: Decision) -> None:
        raise Unprintable

    ref = REF.model_copy(update={"aggregate": "unprintable"})
    cmd = CommandEnvelope(request_id="r-1", type="shop.X", aggregate=ref, issued_at=T0)
    d = decide(agg, None, cmd, now=T0, seen=False)
    assert d.code == ResultCode.ERROR and "cannot be read" in d.message


def test_a_handler_changing_its_commands_body_changes_not_the_command_given() -> None:
    """An in-process timer's command shares its row's body, from which its next slot's
    command is made: a handler's change of it in place reached every later slot."""
    body = {"cfg": {"level": 1}}
    ref = REF.model_copy(update={"aggregate": "changer"})
    cmd = CommandEnvelope(
        request_id="t-1", type="shop.Fire", aggregate=ref, issued_at=T0, body=body
    )
    decide(changers, None, cmd, now=T0, seen=False)
    assert cmd.body == {"cfg": {"level": 1}} and body == {"cfg": {"level": 1}}


rejecters = AggregateType("shop", "rejecter", Counter)


@rejecters.command("shop.Reject")
def reject_as_told(state: Counter, cmd: Command, d: Decision) -> None:
    d.reject("told so", code=cmd.body["code"], refusal=cmd.body.get("refusal"))


@pytest.mark.parametrize(
    ("code", "refusal", "answered"),
    [
        ("ERROR", None, ResultCode.ERROR),  # a plain string: read as its code
        ("REJECTED", "RULE_ENDED", ResultCode.REJECTED),
        ("NOPE", None, ResultCode.ERROR),  # no code: the handler's error
        (42, None, ResultCode.ERROR),
        ("REJECTED", "NOPE", ResultCode.ERROR),
    ],
)
async def test_a_rejections_code_given_as_a_string_or_none_answers_and_goes_on(
    code: Any, refusal: Any, answered: ResultCode
) -> None:
    """A code given as a plain string was kept as it was, and failed the partition's cycle
    once it was answered (`.value` of a str, for a timer fired in-process; a code that is
    none failed the result's validation): the partition was retaken for ever."""
    proc, log, _ = on = on_log(rejecters)
    body = {"code": code, "refusal": refusal}
    await proc.handle(
        [on.record("r-1", "shop.Reject", body, 0), on.record("r-2", "shop.Reject", body, 1)]
    )
    results = log.last("results")
    assert [r["code"] for r in results] == [answered, answered]
    if answered is ResultCode.ERROR and code != "ERROR":
        assert "a rejection's" in results[0]["message"]
        assert len(log.last("dead-letters")) == 2
    stored = decide(
        rejecters,
        None,
        CommandEnvelope(
            request_id="r-3", type="shop.Reject", aggregate=REF, issued_at=T0, body=body
        ),
        now=T0,
        seen=False,
    )
    assert type(stored.code) is ResultCode


class ReadOnce(Exception):
    """An exception whose text can be read once (it reads a response closed since)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def __str__(self) -> str:
        self.reads += 1
        if self.reads > 2:
            raise RuntimeError("the response is closed")
        return "the first read"


failers = AggregateType("shop", "failer", Counter)


@failers.command("shop.Fail")
def fail_once_readable(state: Counter, cmd: Command, d: Decision) -> None:
    raise ReadOnce()


async def test_an_exception_whose_text_fails_when_read_again_is_still_dead_lettered() -> None:
    proc, log, _ = on = on_log(failers)
    await proc.handle([on.record("r-1", "shop.Fail", {}, 0), on.record("r-2", "shop.Fail", {}, 1)])
    assert [r["code"] for r in log.last("results")] == [ResultCode.ERROR, ResultCode.ERROR]
    assert len(log.last("dead-letters")) == 2


starters = AggregateType("shop", "starter", Counter)
STARTED: list[str] = []


async def _side_effect() -> None:
    STARTED.append("ran")


@starters.command("shop.Start")
def start_a_task(state: Counter, cmd: Command, d: Decision) -> Any:
    d.emit("shop.Started", {})
    return asyncio.ensure_future(_side_effect())


async def test_a_task_a_handler_returns_is_cancelled_with_its_refusal() -> None:
    proc, log, _ = on = on_log(starters)
    await proc.handle([on.record("r-1", "shop.Start", {}, 0)])
    results = log.last("results")
    assert [r["code"] for r in results] == [ResultCode.ERROR]
    assert "must not be async" in results[0]["message"]
    for _ in range(5):
        await asyncio.sleep(0)
    assert STARTED == [], "the refused handler's task ran on"


floods = AggregateType("shop", "flood", Counter)


@floods.command("shop.Flood")
def flood(state: Counter, cmd: Command, d: Decision) -> None:
    for i in range(cmd.body["events"]):
        d.emit("shop.Counted", {"to": i})
    for _ in range(cmd.body["sends"]):
        d.send(REF, "shop.Count", {})


@floods.applies("shop.Counted")
def flooded(state: Counter, e: Any) -> Counter:
    return state.model_copy(update={"count": e.body["to"]})


@pytest.mark.parametrize(
    ("events", "sends", "code"),
    [
        (MAX_DECISION_RECORDS, 0, ResultCode.COMMITTED),
        (MAX_DECISION_RECORDS - 1, 1, ResultCode.COMMITTED),
        (MAX_DECISION_RECORDS + 1, 0, ResultCode.ERROR),
        (MAX_DECISION_RECORDS, 1, ResultCode.ERROR),
        (1_000_000, 0, ResultCode.ERROR),  # refused at the bound, not after a million
    ],
)
async def test_a_decision_makes_a_bounded_number_of_records(
    events: int, sends: int, code: ResultCode
) -> None:
    """One command emitting 100,000 events was one transaction of 100,002 records, the
    loop held 5 s and 169 MiB; a million ran the node out of memory on every retake."""
    proc, log, _ = on = on_log(floods)
    body = {"events": events, "sends": sends}
    await proc.handle([on.record("r-1", "shop.Flood", body, 0)])
    [result] = log.last("results")
    assert result["code"] == code
    if code is ResultCode.ERROR:
        assert f"at most {MAX_DECISION_RECORDS} events and commands" in result["message"]
        assert on.stored() is None and len(log.last("dead-letters")) == 1


forwarders = AggregateType("shop", "forwarder", Counter)


@forwarders.command("shop.Forward")
def forward(state: Counter, cmd: Command, d: Decision) -> None:
    d.send(REF.model_copy(update={"id": "elsewhere"}), "shop.Counted", {})  # no event


async def test_a_decision_sending_commands_without_an_event_says_they_were_not_sent() -> None:
    on = on_log(forwarders)
    await on.proc.handle([on.record("r-1", "shop.Forward", {}, 0)])
    log = on.log
    results = log.last("results")
    assert [r["code"] for r in results] == [ResultCode.UNCHANGED]
    assert "1 command(s) not sent" in results[0]["message"]
