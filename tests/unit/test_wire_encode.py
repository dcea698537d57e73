"""`encode` writes an envelope with pydantic's serializer (#20): byte for byte what the
reference, orjson of `model_dump(mode="json")`, writes for any valid envelope, and what
the reference refuses it refuses too."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from app.model.decide import StoredAggregate
from app.protocol.wire import (
    CommandEnvelope,
    CommandResult,
    EventEnvelope,
    ResultCode,
    ScheduleSet,
    TimerAction,
    TimerOp,
    encode,
)
from tables import AggregateRef, CommandSpec, CronRule, IntervalRule, OnceRule
from tables.bounds import MAX_INSTANT, MAX_INT64


def reference(model: BaseModel) -> bytes:
    """The encoding of 0.2 and before: the wire format itself."""
    return orjson.dumps(model.model_dump(mode="json"))


INT64 = st.integers(min_value=-MAX_INT64 - 1, max_value=MAX_INT64)
TEXT = st.text(max_size=20)
NAME = st.text(min_size=1, max_size=20)
INSTANT = st.integers(min_value=0, max_value=MAX_INSTANT)
SCALAR = st.none() | st.booleans() | INT64 | st.floats(allow_nan=False, allow_infinity=False)
JSON: st.SearchStrategy[Any] = st.recursive(
    SCALAR | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=20,
)
BODY = st.dictionaries(TEXT, JSON, max_size=5)
EXTRAS = st.dictionaries(st.text(max_size=10).map(lambda k: f"x_{k}"), JSON, max_size=3)
REF = st.builds(
    AggregateRef,
    context=st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True),
    aggregate=st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True),
    id=NAME,
)
RULE = (
    st.builds(OnceRule, at=INSTANT, coalesce=st.booleans())
    | st.builds(
        IntervalRule,
        start=INSTANT,
        every=st.integers(min_value=1, max_value=MAX_INT64),
        count=st.none() | st.integers(min_value=1, max_value=MAX_INT64),
    )
    | st.builds(CronRule, expr=st.sampled_from(["*/5 * * * *", "0 9 * * 1-5"]), start=INSTANT)
)


def _event(ref: AggregateRef, body: dict[str, Any], extras: dict[str, Any], v: int) -> BaseModel:
    return EventEnvelope(
        id="e/0", type="t", aggregate=ref, version=v, created_at=v, body=body, **extras
    )


def _command(ref: AggregateRef, body: dict[str, Any], extras: dict[str, Any], v: int) -> BaseModel:
    return CommandEnvelope(
        request_id="r#0",
        type="t",
        aggregate=ref,
        body=body,
        not_before=v if v % 2 else None,
        issued_at=v,
        reply_partition=v % 3 or None,
        in_process=bool(v % 2),
        **extras,
    )


def _result(ref: AggregateRef, body: dict[str, Any], extras: dict[str, Any], v: int) -> BaseModel:
    message = orjson.dumps(body).decode()
    return CommandResult(
        request_id="r#0", code=ResultCode.REJECTED, aggregate=ref, message=message, **extras,
        version=v, decided_at=v, refusal="RULE_ENDED" if v % 2 else None,
    )  # fmt: skip


MAKERS = [_event, _command, _result]


@settings(max_examples=300)
@given(
    maker=st.sampled_from(MAKERS),
    ref=REF,
    body=BODY,
    extras=EXTRAS,
    v=st.integers(min_value=1, max_value=MAX_INSTANT),
)
def test_an_envelope_is_written_as_the_reference_writes_it(
    maker: Any, ref: AggregateRef, body: dict[str, Any], extras: dict[str, Any], v: int
) -> None:
    model = maker(ref, body, extras, v)
    assert encode(model) == reference(model)


@settings(max_examples=100)
@given(key=NAME, rule=RULE, ref=st.none() | REF, body=BODY, extras=EXTRAS)
def test_a_schedule_and_a_timer_op_are_written_as_the_reference_writes_them(
    key: str, rule: Any, ref: AggregateRef | None, body: dict[str, Any], extras: dict[str, Any]
) -> None:
    schedule = ScheduleSet(
        key=key, rule=rule, target=ref, command=CommandSpec(type="t", body=body), **extras
    )
    assert encode(schedule) == reference(schedule)
    target = ref or AggregateRef(context="c", aggregate="a", id=key)
    op = TimerOp(request_id=key, action=TimerAction.SKIP, target=target, requested_at=1, **extras)
    assert encode(op) == reference(op)


def test_a_string_no_encoder_writes_is_refused_as_the_reference_refuses_it() -> None:
    # A lone surrogate (read from a `\ud800` escape): not UTF-8, refused by both.
    ref = AggregateRef(context="c", aggregate="a", id="o-1")
    event = _event(ref, {"s": "\ud800"}, {}, 1)
    with pytest.raises(orjson.JSONEncodeError):
        reference(event)
    with pytest.raises(orjson.JSONEncodeError):
        encode(event)


def test_a_state_past_64_bits_is_refused_as_before() -> None:
    # An aggregate's state is not bounded JSON: orjson's refusal of it stays the refusal.
    stored = StoredAggregate(version=1, state={"n": 1 << 70})
    with pytest.raises(orjson.JSONEncodeError):
        encode(stored)


@pytest.mark.parametrize("n", [1 << 64, -(1 << 63) - 1, 1 << 70], ids=["u64+1", "i64-1", "2^70"])
@pytest.mark.parametrize("maker", MAKERS, ids=["event", "command", "result"])
def test_an_integer_past_64_bits_put_in_after_validation_is_refused_as_before(
    maker: Any, n: int
) -> None:
    # Mutated after validation (its bounds no longer checked): pydantic would write it.
    ref = AggregateRef(context="c", aggregate="a", id="o-1")
    model = maker(ref, {}, {"x_n": 1}, 1)
    if isinstance(model, CommandResult):
        model.__pydantic_extra__ = {"x_n": {"deep": [n]}}
    else:
        assert isinstance(model, EventEnvelope | CommandEnvelope)
        model.body["n"] = {"deep": [n]}
    with pytest.raises(orjson.JSONEncodeError):
        reference(model)
    with pytest.raises(orjson.JSONEncodeError):
        encode(model)


@pytest.mark.parametrize(
    "value", [MAX_INT64, -MAX_INT64 - 1, (1 << 64) - 1, "1" * 40, 1e300], ids=repr
)
def test_a_long_number_within_64_bits_or_a_long_string_of_digits_is_written_as_before(
    value: Any,
) -> None:
    # Put in after validation too: a u64 past the bounds is one orjson writes.
    ref = AggregateRef(context="c", aggregate="a", id="9" * 30)
    event = _event(ref, {}, {"x_v": 0}, MAX_INSTANT)
    assert isinstance(event, EventEnvelope)
    event.body.update(v=value, w=[value])
    event.__pydantic_extra__ = {"x_v": value}
    assert encode(event) == reference(event)


def test_an_integer_past_64_bits_put_in_a_schedules_command_after_validation_is_refused() -> None:
    schedule = ScheduleSet(key="k", rule=OnceRule(at=1), command=CommandSpec(type="t"))
    schedule.command.body["n"] = 1 << 64
    with pytest.raises(orjson.JSONEncodeError):
        reference(schedule)
    with pytest.raises(orjson.JSONEncodeError):
        encode(schedule)
