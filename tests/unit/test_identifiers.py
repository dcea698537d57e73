"""Control characters (U+0000-U+001F, U+007F) in a new tenant, aggregate id or timer key
are refused where new input comes in, with the reason; a row or a reference to what is
stored (a cancel's key, an operator's target) is taken as an older version stored it."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from app.errors import BadRecord
from app.protocol.wire import SCHEDULE_CANCELLED, SCHEDULE_SET, EventEnvelope, TimerOp, decode
from app.timers.subscription import CancelTimer, timer_op
from tables import AggregateRef, OnceRule, Timer
from tables.keys import decode_timer, encode_timer, row_key
from tables.refs import NEW_INPUT, control_character

REF = {"context": "shop", "aggregate": "order", "tenant": "t1", "id": "o-1"}
EVENT: dict[str, Any] = {
    "id": "e-1",
    "type": SCHEDULE_SET,
    "aggregate": REF,
    "version": 3,
    "created_at": 1_700_000_000_000,
    "body": {"key": "k", "rule": {"kind": "once", "at": 1}, "command": {"type": "shop.Cancel"}},
}
WHY = "holds the control character"


@pytest.mark.parametrize("char", ["\x00", "\x01", "\n", "\x1b", "\x1f", "\x7f"])
def test_each_c0_control_and_del_is_named(char: str) -> None:
    assert control_character(f"ab{char}") == (
        f"{WHY} U+{ord(char):04X} at index 2 (U+0000-U+001F and U+007F are refused in a "
        "tenant, an aggregate id or a timer key)"
    )


@pytest.mark.parametrize("text", ["o-1", "ünïcødé", "a b", "\u0080", "\u200f", "(0)"])
def test_other_text_is_an_identifier(text: str) -> None:
    assert control_character(text) is None
    ref = {**REF, "tenant": text, "id": text}
    assert AggregateRef.model_validate(ref, context=NEW_INPUT).id == text


@pytest.mark.parametrize(
    ("record", "where"),
    [
        ({**EVENT, "aggregate": {**REF, "id": "o\x00"}}, "aggregate.id: Value error, " + WHY),
        ({**EVENT, "aggregate": {**REF, "tenant": "t\n"}}, "aggregate.tenant: Value error, " + WHY),
    ],
)
def test_an_envelope_naming_an_aggregate_with_one_is_a_bad_record(
    record: dict[str, Any], where: str
) -> None:
    with pytest.raises(BadRecord, match="not a valid EventEnvelope") as info:
        decode(EventEnvelope, orjson.dumps(record))
    assert where in str(info.value)


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"key": "k\x00"}, "key: Value error, " + WHY + " U+0000"),
        ({"target": {**REF, "id": "p\x7f"}}, "target.id: Value error, " + WHY + " U+007F"),
    ],
)
def test_a_schedule_set_naming_a_new_timer_or_target_with_one_is_a_bad_record(
    body: dict[str, Any], where: str
) -> None:
    event = decode(EventEnvelope, orjson.dumps({**EVENT, "body": {**EVENT["body"], **body}}))
    with pytest.raises(BadRecord, match=r"wow\.ScheduleSet e-1") as info:
        timer_op(event, 0)
    assert where in str(info.value)


def test_a_cancel_of_a_key_stored_with_one_still_cancels_it() -> None:
    # the timer was set by an older version: its owner must still be able to cancel it
    raw = orjson.dumps({**EVENT, "type": SCHEDULE_CANCELLED, "body": {"key": "k\x00"}})
    op = timer_op(decode(EventEnvelope, raw), 0)
    assert isinstance(op, CancelTimer) and op.key == "k\x00"


def test_an_operators_timer_op_names_a_stored_target_as_it_is() -> None:
    op = {"request_id": "r", "action": "skip", "target": {**REF, "id": "p\x00"}, "requested_at": 1}
    with pytest.raises(BadRecord, match=r"target\.id: Value error, " + WHY):
        decode(TimerOp, orjson.dumps(op))
    assert decode(TimerOp, orjson.dumps(op), new_names=False).target.id == "p\x00"


def test_a_row_stored_with_one_still_loads_and_keeps_its_key() -> None:
    owner = AggregateRef(context="shop", aggregate="order", tenant="t\x1b", id="o\x00")
    row = Timer(
        id="t",
        owner=owner,
        key="k\n",
        version=3,
        partition=0,
        rule=OnceRule(at=5),
        target=owner,
        command={"type": "shop.Cancel"},
        slot_due_at=5,
        due_at=5,
    )
    again = decode_timer(encode_timer(row))
    assert again == row and row_key(again.owner, again.key) == row_key(owner, "k\n")
