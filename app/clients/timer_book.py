"""A timer book: an aggregate type whose commands set, cancel, pause, resume and trigger
timers for clients that keep no Tickwheel aggregate of their own (a faust app, a service in
another language).

One book per client key (`<context>.<book>/<id>`): its log holds the `wow.ScheduleSet` /
`wow.ScheduleCancelled` events of that key's timers, and every timer's command goes to a
target of another type (by default the client's own `<context>.<target>/<id>`), whose
command topic the client reads. The client sends a command rather than writing the events:
the node that owns the book's partition appends them at the book's next version in its
partition transaction, de-duplicated by request id, so a client's retry or replay (faust
processes at least once) sets a timer once, and no other writer's version can collide
with the node's (an event appended from outside at the version the node appends next
would be a second event at one version).

    book = timer_book("reminders", "order-timers")
    service = Service(aggregates=(book,))     # tickwheel worker --service module:service

A book's state is what its own events say of each key: the timer last set under it (its
target and command) and whether it is paused, so that it answers a pause, resume or
trigger of a key it has no timer under (never set, or cancelled) REJECTED, a pause of a
paused timer and a resume of a running one UNCHANGED (nothing to do, no event), and sends
a trigger's command itself. Whether a timer has FIRED (a once rule's slot, a rule that
ended) is the timer table's, not the book's: a pause of such a key is appended and
changes nothing there (the web edge refuses it when its node keeps the table's row).
A book whose local state was folded by a version before this one knows only the keys set
since (a node restoring it from the log afresh knows them all).
"""

from __future__ import annotations

import logging
from typing import Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.model.aggregate import AggregateType, Command, Decision, Event
from app.protocol.wire import (
    SCHEDULE_CANCELLED,
    SCHEDULE_PAUSED,
    SCHEDULE_RESUMED,
    SCHEDULE_SET,
    SCHEDULE_TRIGGERED,
    ScheduleCancelled,
    ScheduleSet,
    ScheduleTriggered,
)
from tables import AggregateRef, CommandSpec
from tables.slots import first_slot

__all__ = [
    "CANCEL_TIMER",
    "PAUSE_TIMER",
    "RESUME_TIMER",
    "SET_TIMER",
    "TRIGGER_TIMER",
    "BookState",
    "BookTimer",
    "TimerKey",
    "book_reason",
    "timer_book",
]

logger = logging.getLogger(__name__)

SET_TIMER: Final = "wow.SetTimer"
"""Body: a `ScheduleSet` (key, rule, target, command); decided into `wow.ScheduleSet`."""
CANCEL_TIMER: Final = "wow.CancelTimer"
"""Body: a `ScheduleCancelled` (key); decided into `wow.ScheduleCancelled`."""
PAUSE_TIMER: Final = "wow.PauseTimer"
"""Body: a `TimerKey`; decided into `wow.SchedulePaused` (UNCHANGED when paused already)."""
RESUME_TIMER: Final = "wow.ResumeTimer"
"""Body: a `TimerKey`; decided into `wow.ScheduleResumed` (UNCHANGED when running)."""
TRIGGER_TIMER: Final = "wow.TriggerTimer"
"""Body: a `TimerKey`; the timer's command sent once now, as `<request id>>0`, recorded by
`wow.ScheduleTriggered`; its rule and next slot as they were."""


class TimerKey(BaseModel):
    """Body of a pause, resume or trigger: the key of the book's timer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str = Field(min_length=1, max_length=200)


class BookTimer(BaseModel):
    """What a book's events say of one key's timer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    target: AggregateRef
    command: CommandSpec
    paused: bool = False


class BookState(BaseModel):
    """The book's timers by key, as its events set, pause, resume and cancel them (the
    rows themselves, their slots and outcomes, live in the timer table). A state stored
    as `{}` (by a version before this one) reads as a book of no timers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    timers: dict[str, BookTimer] = Field(default_factory=dict)


def book_reason(
    book: AggregateType[BookState], body: ScheduleSet, now: int | None = None
) -> str | None:
    """Why a book refuses to set this timer, or None.

    Its command must go elsewhere: a book has handlers for its two commands only, so a
    timer that fired into the book itself would be answered ERROR, retried and parked.
    Its rule must have a slot left at `now` (the event's time, from which the timer's
    first slot is counted): one its `until` or `count` ended before then would set no
    timer, and its event would be dead-lettered where the client never looks.
    """
    if body.target is None:
        return f"{SET_TIMER} needs a target: a timer book's timers fire into another type"
    if body.target.type_name == book.type_name:
        return f"the target {body.target} is the book itself: its timers fire elsewhere"
    if now is not None and first_slot(body.rule, now) is None:
        ends = {k: v for k, v in body.rule.model_dump().items() if k in ("until", "count")}
        return f"the rule has no slot left at {now} (it ended: {ends or 'no match'})"
    return None


def timer_book(context: str, name: str) -> AggregateType[BookState]:
    """The aggregate type `<context>.<name>` taking `wow.SetTimer` and `wow.CancelTimer`."""
    book = AggregateType(context, name, BookState)

    @book.command(SET_TIMER)
    def _set(state: BookState, cmd: Command, d: Decision) -> None:
        try:
            body = ScheduleSet.model_validate(cmd.body)
        except ValidationError as exc:
            d.reject(f"invalid {SET_TIMER}: {_first_error(exc)}")
        if (why := book_reason(book, body, d.now)) is not None:
            d.reject(why)
        d.schedule(body.key, body.rule, body.command, body.target)

    @book.command(CANCEL_TIMER)
    def _cancel(state: BookState, cmd: Command, d: Decision) -> None:
        try:
            body = ScheduleCancelled.model_validate(cmd.body)
        except ValidationError as exc:
            d.reject(f"invalid {CANCEL_TIMER}: {_first_error(exc)}")
        # Emitted whether the key is set or not: the table cancels only what is active, and
        # a fact in the log makes the answer COMMITTED, not UNCHANGED, for either.
        d.cancel_schedule(body.key)

    @book.command(PAUSE_TIMER)
    def _pause(state: BookState, cmd: Command, d: Decision) -> None:
        key, timer = _known(state, cmd, PAUSE_TIMER, d)
        if not timer.paused:  # paused already: nothing to do, answered UNCHANGED
            d.pause_schedule(key)

    @book.command(RESUME_TIMER)
    def _resume(state: BookState, cmd: Command, d: Decision) -> None:
        key, timer = _known(state, cmd, RESUME_TIMER, d)
        if timer.paused:  # running: nothing to do, answered UNCHANGED
            d.resume_schedule(key)

    @book.command(TRIGGER_TIMER)
    def _trigger(state: BookState, cmd: Command, d: Decision) -> None:
        key, timer = _known(state, cmd, TRIGGER_TIMER, d)
        # Sent in this decision's transaction, its request id derived from the trigger's
        # (`Decision.send`): a trigger sent again is a DUPLICATE and sends nothing more. A
        # target whose command topic does not exist fails it there (`NoTarget`): answered
        # ERROR, not applied, so the same trigger goes through once the topic exists.
        d.send(timer.target, timer.command.type, timer.command.body)
        d.emit(SCHEDULE_TRIGGERED, ScheduleTriggered(key=key, request_id=d.commands[-1].request_id))

    @book.applies(SCHEDULE_SET)
    def _set_applied(state: BookState, event: Event) -> BookState:
        body = ScheduleSet.model_validate(event.body)
        timers = {k: t for k, t in state.timers.items() if k != body.key}
        if body.target is not None:
            # A set without one (another writer's: a book refuses it, `book_reason`) fires
            # into the book itself; the book does not pause or trigger it.
            timers[body.key] = BookTimer(target=body.target, command=body.command)
        return state.model_copy(update={"timers": timers})

    @book.applies(SCHEDULE_CANCELLED)
    def _cancel_applied(state: BookState, event: Event) -> BookState:
        key = ScheduleCancelled.model_validate(event.body).key
        return state.model_copy(
            update={"timers": {k: t for k, t in state.timers.items() if k != key}}
        )

    @book.applies(SCHEDULE_PAUSED)
    def _pause_applied(state: BookState, event: Event) -> BookState:
        return _marked(state, event, paused=True)

    @book.applies(SCHEDULE_RESUMED)
    def _resume_applied(state: BookState, event: Event) -> BookState:
        return _marked(state, event, paused=False)

    @book.applies(SCHEDULE_TRIGGERED)
    def _trigger_applied(state: BookState, event: Event) -> BookState:
        return state  # a record of what was sent; known to the book's log by this applier

    return book


def _marked(state: BookState, event: Event, *, paused: bool) -> BookState:
    key = str(event.body.get("key", ""))
    timer = state.timers.get(key)
    if timer is None:
        return state  # paused or resumed by another writer, never set here
    marked = timer.model_copy(update={"paused": paused})
    return state.model_copy(update={"timers": {**state.timers, key: marked}})


def _known(state: BookState, cmd: Command, name: str, d: Decision) -> tuple[str, BookTimer]:
    """The key a pause, resume or trigger names and the book's timer under it; refused
    when its body is no `TimerKey` or the book has no timer under that key."""
    try:
        key = TimerKey.model_validate(cmd.body).key
    except ValidationError as exc:
        d.reject(f"invalid {name}: {_first_error(exc)}")
    timer = state.timers.get(key)
    if timer is None:
        d.reject(f"{cmd.aggregate} has no timer {key!r} (never set, or cancelled)")
    return key, timer


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "body"
    return f"{where}: {err['msg']}"
