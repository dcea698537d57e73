"""Text a service's code gives holding a lone surrogate (bytes decoded with
errors="surrogateescape", as `os.fsdecode` does): a handler's rejection reason, the text of
what a handler or an applier raises. Unwritable as it is (UTF-8 holds no lone surrogate),
it once failed the partition's cycle at each retake, the same command decided again for
ever; it is written escaped (`\\udce9`), the command answered ERROR and dead-lettered."""

from __future__ import annotations

import orjson
import pytest
from fakes import T0, CommitLog
from pydantic import BaseModel

from app.commands.processor import CommandProcessor
from app.kafka import Record
from app.kafka.records import headers_of
from app.model.aggregate import AggregateType, Command, Decision, Event
from app.protocol.dead_letters import DeadLetter, Stage, dead_letter
from app.protocol.wire import CommandEnvelope, EventEnvelope, OpOutcome, TimerAction, encode
from app.timers.op_answers import answer_record
from app.timers.operator import new_op
from tables import AggregateRef
from tables.aggregate_store import MemoryAggregateStore
from tables.partitioner import partition_of
from tables.timer import MAX_ERROR_TEXT, error_text, writable_text

NAME = b"caf\xe9".decode("utf-8", "surrogateescape")
"""A name read as bytes and decoded leniently (a file name, a legacy system's field)."""
N = 4
THING = AggregateRef(context="shop", aggregate="thing", id="a-1")
P = partition_of(THING.id, N)


class S(BaseModel):
    n: int = 0


things = AggregateType("shop", "thing", S)


@things.command("shop.Raise")
def _raise(state: S, cmd: Command, d: Decision) -> None:
    raise LookupError(f"unknown customer {NAME}")


@things.command("shop.Reject")
def _reject(state: S, cmd: Command, d: Decision) -> None:
    d.reject(f"unknown customer {NAME}")


@things.command("shop.Ok")
def _ok(state: S, cmd: Command, d: Decision) -> None:
    d.emit("shop.Okayed", {})


@things.applies("shop.Okayed")
def _okayed(state: S, e: Event) -> S:
    return state


@things.applies("shop.Weird")
def _weird(state: S, e: Event) -> S:
    raise ValueError(f"cannot fold {NAME}")


def processor() -> CommandProcessor:
    return CommandProcessor(
        things, P, partitions=N, states=MemoryAggregateStore(), commit=CommitLog(), now=lambda: T0
    )


def command(request_id: str, type_: str, **fields: object) -> CommandEnvelope:
    return CommandEnvelope(
        request_id=request_id, type=type_, aggregate=THING, issued_at=T0, **fields
    )


def record(cmd: CommandEnvelope, offset: int) -> Record:
    return Record("shop.thing.commands", P, offset, THING.id.encode(), encode(cmd), T0, ())


@pytest.mark.parametrize("type_", ["shop.Raise", "shop.Reject"])
def test_a_handlers_text_with_a_surrogate_is_answered_and_the_partition_goes_on(
    type_: str,
) -> None:
    proc = processor()
    batch = proc.begin()
    cmds = [command("r-bad", type_), command("r-next", "shop.Ok")]
    assert proc.decide_records(batch, [record(c, i) for i, c in enumerate(cmds)]) == 2
    results = [orjson.loads(r[3] or b"") for r in batch.out if r[0] == "shop.results"]
    assert [(r["request_id"], r["code"]) for r in results] == [
        ("r-bad", "ERROR" if type_ == "shop.Raise" else "REJECTED"),
        ("r-next", "COMMITTED"),
    ]
    assert "unknown customer caf\\udce9" in results[0]["message"]
    letters = [r for r in batch.out if r[0] == "shop.dead-letters"]
    assert len(letters) == (type_ == "shop.Raise")
    for letter in letters:
        read = DeadLetter.read(letter[2], letter[3], headers_of(letter))
        assert read.error == "unknown customer caf\\udce9"


def test_a_timer_fired_in_process_whose_handler_says_a_surrogate_gets_writable_text() -> None:
    proc = processor()
    batch = proc.begin()
    [(_, code, message)] = proc.decide_local(batch, [command("t-1#0", "shop.Raise")])
    assert code == "ERROR" and message == "LookupError: unknown customer caf\\udce9"
    message.encode()  # what the timer's row keeps (`error_text`) is written as UTF-8


def test_another_writers_event_whose_applier_says_a_surrogate_is_dead_lettered() -> None:
    """The follow path: the applier's error goes to the event's dead letter's headers."""
    proc = processor()
    event = EventEnvelope(
        id="w-1", type="shop.Weird", aggregate=THING, version=1, created_at=T0, body={}
    )
    raw = Record("shop.thing.events", P, 3, THING.id.encode(), encode(event), T0, ())
    with pytest.raises(ValueError) as raised:
        proc.follow(proc.begin(), event, 3)
    letter = dead_letter(raw, raised.value, Stage.FOLLOW, T0)
    assert DeadLetter.read(letter[2], letter[3], letter[4]).error == "cannot fold caf\\udce9"
    letter = dead_letter(raw, f"said {NAME}", Stage.FOLLOW, T0)
    assert DeadLetter.read(letter[2], letter[3], letter[4]).error == "said caf\\udce9"


def test_writable_text_escapes_lone_surrogates_alone_and_error_text_cuts_after() -> None:
    assert writable_text("plain") == "plain"
    assert writable_text("café ✓ 😀") == "café ✓ 😀"
    assert writable_text(NAME) == "caf\\udce9"
    long = error_text(NAME * MAX_ERROR_TEXT)
    assert long is not None and len(long) == MAX_ERROR_TEXT
    long.encode()


def test_an_operators_request_failed_with_a_surrogate_in_its_error_is_answered() -> None:
    op = new_op(TimerAction.RETRY, THING, now=T0, request_id="o-1")
    out = answer_record(
        "shop.thing", op, 0, 3, OpOutcome.FAILED, partitions=N, now=T0, message=f"at {NAME}"
    )
    assert orjson.loads(out[3] or b"")["message"] == "at caf\\udce9"
