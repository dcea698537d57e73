"""`timer_op`'s Timer of a `wow.ScheduleSet`: built without validating it a second time, it
is the very Timer its validation builds, and one out of a Timer's bounds is still refused
with the validation's reason."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.errors import BadRecord
from app.protocol.wire import SCHEDULE_SET, EventEnvelope, ScheduleSet, decode, encode
from app.timers.subscription import CancelTimer, PutTimer, timer_op
from tables import AggregateRef, Timer
from tables.bounds import MAX_INSTANT
from tables.keys import encode_timer
from tables.rules import parse_rule
from tables.slots import first_slot, jittered_due

T0 = 1_800_000_000_000
_NAMED = st.characters(codec="utf-8", exclude_characters=[*map(chr, range(32)), "\x7f"])
"""What a new name may hold: no control character (`tables.refs.control_character`)."""

_refs = st.builds(
    AggregateRef,
    context=st.just("shop"),
    aggregate=st.just("order"),
    tenant=st.sampled_from(["(0)", "t1"]),
    id=st.text(_NAMED, min_size=1, max_size=8),
)
_rules = st.one_of(
    st.fixed_dictionaries(
        {"kind": st.just("once"), "at": st.integers(0, MAX_INSTANT)},
        optional={"jitter": st.integers(1, 86_400_000), "coalesce": st.booleans()},
    ),
    st.fixed_dictionaries(
        {
            "kind": st.just("interval"),
            "start": st.integers(0, MAX_INSTANT),
            "every": st.integers(1, 10**15),
        },
        optional={"count": st.integers(1, 10**6)},
    ),
    st.fixed_dictionaries(
        {"kind": st.just("cron"), "expr": st.sampled_from(["*/5 * * * *", "0 9 * * 1-5"])},
        optional={"zone": st.sampled_from(["UTC", "Europe/Paris"])},
    ),
)


def _validated(event: EventEnvelope, partition: int) -> Timer:
    """The Timer as it was built before: every field through Timer's validation."""
    body = ScheduleSet.model_validate(event.body)
    op = timer_op(event, partition)
    assert isinstance(op, PutTimer)
    t = op.timer
    return Timer(
        id=event.id,
        owner=event.aggregate,
        key=body.key,
        version=event.version,
        partition=partition,
        rule=body.rule,
        target=body.target or event.aggregate,
        command=body.command,
        slot=t.slot,
        slot_due_at=t.slot_due_at,
        due_at=t.due_at,
    )


@given(
    owner=_refs,
    target=st.none() | _refs,
    rule=_rules,
    key=st.text(_NAMED, min_size=1, max_size=200),
    id=st.text(min_size=1, max_size=200),
    version=st.integers(1, 2**63 - 1),
    created_at=st.integers(0, MAX_INSTANT),
    partition=st.integers(0, 65_535),
    command_body=st.dictionaries(st.text(max_size=3), st.integers() | st.text(max_size=3)),
)
def test_the_timer_is_the_one_its_validation_builds(
    owner: AggregateRef,
    target: AggregateRef | None,
    rule: dict[str, Any],
    key: str,
    id: str,
    version: int,
    created_at: int,
    partition: int,
    command_body: dict[str, Any],
) -> None:
    body: dict[str, Any] = {"key": key, "rule": rule, "command": {"type": "Fire"}}
    if target is not None:
        body["target"] = target.model_dump()
    if command_body and all(abs(v) < 2**63 for v in command_body.values() if isinstance(v, int)):
        body["command"]["body"] = command_body
    raw = encode(
        EventEnvelope(
            id=id,
            type=SCHEDULE_SET,
            aggregate=owner,
            version=version,
            created_at=created_at,
            body=body,
        )
    )
    event = decode(EventEnvelope, raw)
    try:
        op = timer_op(event, partition)
    except BadRecord:
        return  # a rule with no slot from then on: no Timer either way
    if isinstance(op, CancelTimer):
        return  # a rule whose `until` or `count` ended by then cancels its key: no Timer
    assert isinstance(op, PutTimer)
    expected = _validated(event, partition)
    assert op.timer == expected
    assert list(map(type, op.timer.__dict__.values())) == list(
        map(type, expected.__dict__.values())
    )
    assert op.timer.model_fields_set == expected.model_fields_set
    assert encode_timer(op.timer) == encode_timer(expected)
    assert Timer.model_validate_json(encode_timer(op.timer)) == op.timer


def schedule_set(rule: dict[str, Any]) -> EventEnvelope:
    """A `wow.ScheduleSet` of timer `k` with `rule`, commanding `Fire`."""
    return EventEnvelope(
        id="e-1",
        type=SCHEDULE_SET,
        aggregate=AggregateRef(context="shop", aggregate="order", id="o-1"),
        version=1,
        created_at=T0,
        body={"key": "k", "rule": rule, "command": {"type": "Fire"}},
    )


def test_a_timer_out_of_bounds_is_refused_with_its_validations_reason() -> None:
    event = schedule_set({"kind": "once", "at": T0})
    with pytest.raises(BadRecord, match=r"^wow.ScheduleSet e-1: partition: Input should be"):
        timer_op(event, 65_536)


@given(partition=st.integers(-3, 70_000), jitter=st.none() | st.integers(1, 86_400_000))
def test_a_once_rules_timer_is_refused_outside_a_partitions_bounds_and_only_there(
    partition: int, jitter: int | None
) -> None:
    rule: dict[str, Any] = {"kind": "once", "at": MAX_INSTANT}
    if jitter is not None:
        rule["jitter"] = jitter
    event = schedule_set(rule)
    if 0 <= partition <= 65_535:
        assert _validated(event, partition) == _validated(event, partition)
        return
    with pytest.raises(BadRecord, match=r"^wow.ScheduleSet e-1: partition: Input should be"):
        timer_op(event, partition)


def test_the_timers_share_a_fields_set_no_copy_changes() -> None:
    event = decode(
        EventEnvelope,
        encode(
            EventEnvelope(
                id="e-1",
                type=SCHEDULE_SET,
                aggregate=AggregateRef(context="shop", aggregate="order", id="o-1"),
                version=1,
                created_at=T0,
                body={"key": "k", "rule": {"kind": "once", "at": T0}, "command": {"type": "F"}},
            )
        ),
    )
    first, second = timer_op(event, 1), timer_op(event, 2)
    assert isinstance(first, PutTimer) and isinstance(second, PutTimer)
    named = set(first.timer.model_fields_set)
    copied = first.timer.model_copy(update={"attempts": 1, "error_code": "BUSY"})
    assert copied.model_fields_set == named | {"attempts", "error_code"}
    assert first.timer.model_fields_set == second.timer.model_fields_set == named


@given(
    at=st.integers(0, MAX_INSTANT),
    jitter=st.none() | st.sampled_from([1, 2, 86_400_000]) | st.integers(1, 86_400_000),
    id=st.text(min_size=1, max_size=20),
)
def test_a_once_rules_timer_is_due_when_its_slot_is_with_its_jitter(
    at: int, jitter: int | None, id: str
) -> None:
    # The once rule's Timer is built without a Slot when it has no jitter: its due time is
    # still the one `first_slot` and `jittered_due` give, jittered or not.
    rule: dict[str, Any] = {"kind": "once", "at": at}
    if jitter is not None:
        rule["jitter"] = jitter
    event = schedule_set(rule).model_copy(update={"id": id})
    op = timer_op(event, 3)
    assert isinstance(op, PutTimer)
    parsed = parse_rule(rule)
    slot = first_slot(parsed, T0)
    assert slot is not None
    assert (op.timer.slot, op.timer.slot_due_at) == (slot.index, slot.due_at) == (0, at)
    assert op.timer.due_at == jittered_due(parsed, id, slot)
    assert op.timer == _validated(event, 3)
