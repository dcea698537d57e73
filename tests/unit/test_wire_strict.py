"""Records are read strictly, as the published schemas say: `"3"`, `3.0` or `true` for an
integer and `"true"` or `1` for a boolean are refused with the field and the value, not
coerced. The timer table's rows stay lax: an older version's row still loads."""

from __future__ import annotations

import json
import re
from typing import Any

import orjson
import pytest

from app.clients.timer_book import SET_TIMER, timer_book
from app.errors import BadRecord
from app.jobs import effective_rule
from app.model.decide import decide
from app.protocol.wire import (
    SCHEDULE_CANCELLED,
    SCHEDULE_SET,
    CommandEnvelope,
    CommandResult,
    EventEnvelope,
    TimerOp,
    decode,
)
from app.timers.subscription import timer_op
from tables import AggregateRef, InvalidRule, OnceRule, Timer, parse_rule
from tables.keys import decode_timer, encode_timer

REF = {"context": "shop", "aggregate": "order", "tenant": "t1", "id": "o-1"}
RULE = {"kind": "once", "at": 1_700_000_060_000}
EVENT: dict[str, Any] = {
    "id": "e-1",
    "type": SCHEDULE_SET,
    "aggregate": REF,
    "version": 3,
    "created_at": 1_700_000_000_000,
    "body": {"key": "deadline", "rule": RULE, "command": {"type": "shop.Cancel"}},
}
CMD: dict[str, Any] = {
    "request_id": "r-1",
    "type": "shop.Cancel",
    "aggregate": REF,
    "issued_at": 1_700_000_000_000,
}
RESULT: dict[str, Any] = {
    "request_id": "r-1",
    "code": "COMMITTED",
    "aggregate": REF,
    "version": 4,
    "decided_at": 1_700_000_000_000,
}
OP: dict[str, Any] = {
    "request_id": "op-1",
    "action": "retry",
    "target": REF,
    "requested_at": 1_700_000_000_000,
}


INT = "Input should be a valid integer"
BOOL = "Input should be a valid boolean"
STR = "Input should be a valid string"


@pytest.mark.parametrize(
    ("model", "record", "reason"),
    [
        (EventEnvelope, {**EVENT, "version": "3"}, f'version: {INT} (got the string "3")'),
        (EventEnvelope, {**EVENT, "version": True}, f"version: {INT} (got the boolean true)"),
        (EventEnvelope, {**EVENT, "version": 3.0}, f"version: {INT} (got the number 3.0)"),
        (EventEnvelope, {**EVENT, "created_at": "1700000000000"}, f"created_at: {INT}"),
        (EventEnvelope, {**EVENT, "id": 7}, f"id: {STR} (got the integer 7)"),
        (CommandEnvelope, {**CMD, "issued_at": True}, f"issued_at: {INT}"),
        (CommandEnvelope, {**CMD, "in_process": "no"}, f'in_process: {BOOL} (got the string "no")'),
        (CommandEnvelope, {**CMD, "in_process": 1}, f"in_process: {BOOL} (got the integer 1)"),
        (CommandEnvelope, {**CMD, "reply_partition": "0"}, f"reply_partition: {INT}"),
        (CommandResult, {**RESULT, "version": "4"}, f"version: {INT}"),
        (CommandResult, {**RESULT, "decided_at": 1.7e12}, f"decided_at: {INT}"),
        (TimerOp, {**OP, "requested_at": "1700000000000"}, f"requested_at: {INT}"),
        (TimerOp, {**OP, "target": {**REF, "id": 1}}, f"target.id: {STR}"),
    ],
)  # fmt: skip
def test_an_envelope_of_a_coerced_type_is_refused_naming_field_and_value(
    model: type[Any], record: dict[str, Any], reason: str
) -> None:
    with pytest.raises(BadRecord, match="not a valid") as info:
        decode(model, orjson.dumps(record))
    assert reason in str(info.value)


def test_what_the_schemas_allow_still_reads() -> None:
    # an enum by its string, a number field's integer, and anything in a body or an
    # unknown field: all JSON the schemas take
    result = decode(CommandResult, orjson.dumps({**RESULT, "refusal": "SOME_NEW_CODE"}))
    assert result.code == "COMMITTED" and result.refusal is None
    event = decode(EventEnvelope, orjson.dumps({**EVENT, "trace": "3", "body": EVENT["body"]}))
    assert event.version == 3 and event.model_extra == {"trace": "3"}
    op = decode(TimerOp, orjson.dumps(OP))
    assert op.action == "retry"
    cmd = decode(CommandEnvelope, orjson.dumps({**CMD, "body": {"n": "3", "b": 1.0}}))
    assert cmd.body == {"n": "3", "b": 1.0}


def _set(rule: dict[str, Any]) -> EventEnvelope:
    return decode(EventEnvelope, orjson.dumps({**EVENT, "body": {**EVENT["body"], "rule": rule}}))


@pytest.mark.parametrize(
    ("rule", "reason"),
    [
        ({"kind": "once", "at": "1700000060000"}, f"rule.once.at: {INT}"),
        ({"kind": "once", "at": 1_700_000_060_000.0}, f"rule.once.at: {INT}"),
        ({**RULE, "coalesce": "false"}, f"rule.once.coalesce: {BOOL}"),
        ({**RULE, "jitter": True}, f"rule.once.jitter: {INT}"),
        ({"kind": "interval", "start": 0, "every": 1000.0}, f"rule.interval.every: {INT}"),
        ({"kind": "cron", "expr": "* * * * *", "count": "2"}, f"rule.cron.count: {INT}"),
    ],
)
def test_a_schedule_set_body_of_a_coerced_type_is_a_bad_record(
    rule: dict[str, Any], reason: str
) -> None:
    with pytest.raises(BadRecord, match=r"wow\.ScheduleSet e-1: ") as info:
        timer_op(_set(rule), 0)
    assert reason in str(info.value)


def test_a_cancel_body_with_a_key_not_a_string_is_a_bad_record() -> None:
    raw = orjson.dumps({**EVENT, "type": SCHEDULE_CANCELLED, "body": {"key": 5}})
    with pytest.raises(BadRecord, match="key: Input should be a valid string"):
        timer_op(decode(EventEnvelope, raw), 0)


def test_a_timer_books_set_of_a_coerced_rule_is_rejected_with_the_reason() -> None:
    book = timer_book("shop", "reminders")
    owner = AggregateRef(context="shop", aggregate="reminders", id="o")
    body = {
        "key": "k",
        "rule": {"kind": "once", "at": "1700000060000"},
        "target": REF,
        "command": {"type": "shop.Cancel"},
    }
    cmd = CommandEnvelope(
        request_id="r", type=SET_TIMER, aggregate=owner, body=body, issued_at=1_700_000_000_000
    )
    decided = decide(book, None, cmd, now=1_700_000_000_000, seen=False)
    assert decided.code == "REJECTED"
    assert "rule.once.at: Input should be a valid integer" in decided.message


def test_a_rule_given_now_is_strict_and_one_kept_before_is_lax() -> None:
    with pytest.raises(InvalidRule, match="at: Input should be a valid integer"):
        parse_rule({"kind": "once", "at": "5"}, strict=True)
    assert parse_rule({"kind": "once", "at": "5"}) == OnceRule(at=5)
    default = OnceRule(at=1)
    with pytest.raises(InvalidRule, match="coalesce: Input should be a valid boolean"):
        effective_rule(default, {"coalesce": "false"}, strict=True)
    assert effective_rule(default, {"coalesce": "false"}) == OnceRule(at=1, coalesce=False)


def test_a_timer_row_stays_lax_so_a_row_stored_before_still_loads() -> None:
    # A node wrote every row through the serializer; but a row is never refused for a
    # shape an older version took (`tables.rowload` falls back to this on any doubt).
    row = Timer(
        id="t",
        owner=AggregateRef(**REF),
        key="k",
        version=3,
        partition=0,
        rule=OnceRule(at=5),
        target=AggregateRef(**REF),
        command={"type": "shop.Cancel"},
        slot_due_at=5,
        due_at=5,
    )
    loose = orjson.loads(encode_timer(row))
    loose["version"], loose["rule"]["at"] = "3", 5.0
    assert decode_timer(orjson.dumps(loose)) == row


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (10**4000, "the integer of 13288 bits"),  # past what orjson or str() writes
        (2**64 + 5, "the integer of 65 bits"),
        (2**63, "the integer 9223372036854775808"),
        ("x" * 100, 'the string "' + "x" * 40 + '"...'),
        (1e300, "the number 1e+300"),
    ],
)
def test_a_value_of_any_size_is_named_in_the_reason_never_an_error_of_its_own(
    value: object, shown: str
) -> None:
    raw = json.dumps({**CMD, "in_process": value}).encode()  # orjson writes no such integer
    with pytest.raises(BadRecord, match=re.escape(f"in_process: {BOOL} (got {shown})")):
        decode(CommandEnvelope, raw)
