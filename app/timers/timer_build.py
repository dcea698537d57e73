"""The Timer a `wow.ScheduleSet` event sets (`build_timer`): its first slot and due time
computed (the same on every replay), every other field the event's and its body's,
validated with them. Built as its validation would build it, at half the cost; validated
when a number it computed is out of a Timer's bounds (the validation says why)."""

from __future__ import annotations

from pydantic import BaseModel

from app.errors import BadRecord
from app.protocol.wire import MAX_EVENT_ID, MAX_PARTITION, SCHEDULE_SET, EventEnvelope, ScheduleSet
from tables import Timer, TimerStatus
from tables.bounds import MAX_INSTANT, MAX_INT64
from tables.rules import OnceRule
from tables.slots import Slot, first_slot, jittered_due

__all__ = ["build_timer"]

# The Timer's validator called directly, without `model_validate`'s wrapper (as the
# subscription's body validator is).
_new_timer = Timer.__pydantic_validator__.validate_python
_TIMER_SET = {"id", "owner", "key", "version", "partition", "rule", "target", "command"} | {
    "slot",
    "slot_due_at",
    "due_at",
}
"""The fields `build_timer` names (a validated Timer's `model_fields_set`): one set shared by
every Timer it builds, as `tables.rowload` shares its own. A frozen model's set is never
changed in place (`model_copy` copies it first)."""


def _max_length(model: type[BaseModel], field: str) -> int:
    bounds = model.model_fields[field].metadata
    return min(int(m.max_length) for m in bounds if getattr(m, "max_length", None) is not None)


_ID_FITS = min(_max_length(Timer, "id"), _max_length(Timer, "cancel_id")) >= MAX_EVENT_ID
if not _ID_FITS or _max_length(Timer, "key") < _max_length(ScheduleSet, "key"):
    raise TypeError("build_timer builds Timers unvalidated: an event id or key may not fit one")
_set = object.__setattr__
_new = object.__new__


def _within(partition: int, slot: Slot, due_at: int) -> bool:
    """Whether a Timer of a validated event and body with these would validate: the only
    fields `build_timer` computes (the others are the event's and the body's, within the same
    bounds as a Timer's, as the check above keeps them)."""
    return (
        type(partition) is int
        and 0 <= partition <= MAX_PARTITION
        and type(slot.index) is int
        and 0 <= slot.index <= MAX_INT64
        and type(slot.due_at) is int
        and 0 <= slot.due_at <= MAX_INSTANT
        and type(due_at) is int
        and 0 <= due_at <= MAX_INT64
    )


def build_timer(event: EventEnvelope, body: ScheduleSet, partition: int) -> Timer:
    rule = body.rule
    if type(rule) is OnceRule and type(partition) is int and 0 <= partition <= MAX_PARTITION:
        # Its one slot: index 0 at `at`, validated an Instant, so within bounds jittered
        # or not (`at + jitter` < 2**63); the partition was the one thing left to check.
        # Built here without a Slot when there is no jitter (every ingested timer of the
        # benchmarks): `jittered_due` is then `at` itself.
        at = rule.at
        jitter = rule.jitter
        due_at = at if not jitter or jitter <= 1 else jittered_due(rule, event.id, Slot(0, at))
        return _built(event, body, partition, 0, at, due_at)
    if type(rule) is OnceRule:
        slot = Slot(0, rule.at)
        due_at = jittered_due(rule, event.id, slot)
        within = False
    else:
        # The first slot is counted from the event's own time, so a replay computes the
        # same one.
        found = first_slot(rule, event.created_at)
        if found is None:
            raise BadRecord(f"{SCHEDULE_SET} {event.id}: rule {rule!r} has no slot to fire")
        slot = found
        due_at = jittered_due(rule, event.id, slot)  # the same on every replay
        within = _within(partition, slot, due_at)
    if not within:
        # Out of a Timer's bounds: its validation says why (a dead letter).
        timer: Timer = _new_timer(
            {
                "id": event.id,
                "owner": event.aggregate,
                "key": body.key,
                "version": event.version,
                "partition": partition,
                "rule": body.rule,
                "target": body.target or event.aggregate,
                "command": body.command,
                "slot": slot.index,
                "slot_due_at": slot.due_at,
                "due_at": due_at,
            }
        )
        return timer
    return _built(event, body, partition, slot.index, slot.due_at, due_at)


def _built(
    event: EventEnvelope,
    body: ScheduleSet,
    partition: int,
    slot: int,
    slot_due_at: int,
    due_at: int,
) -> Timer:
    """The Timer of a validated event and body whose computed numbers are within bounds,
    built as its validation would build it, at half the cost: every other part was
    validated with the event and its body."""
    timer = _new(Timer)
    _set(
        timer,
        "__dict__",
        {
            "id": event.id,
            "owner": event.aggregate,
            "key": body.key,
            "version": event.version,
            "partition": partition,
            "status": TimerStatus.PENDING,
            "rule": body.rule,
            "target": body.target or event.aggregate,
            "command": body.command,
            "slot": slot,
            "slot_due_at": slot_due_at,
            "due_at": due_at,
            "attempts": 0,
            "skipped": 0,
            "outcome": None,
            "error_code": None,
            "error_text": None,
            "parked_when_paused": False,
            "retry_until": None,
            "cancel_id": None,
        },
    )
    _set(timer, "__pydantic_fields_set__", _TIMER_SET)
    _set(timer, "__pydantic_extra__", None)
    _set(timer, "__pydantic_private__", None)
    return timer
