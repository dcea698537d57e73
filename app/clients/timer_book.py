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
trigger of a key it has no timer under (never set, cancelled, or forgotten as below)
REJECTED, a pause of a paused timer and a resume of a running one UNCHANGED (nothing to
do, no event), and sends a trigger's command itself. Whether a timer has FIRED is the
timer table's, not the book's, but when its rule ended is the book's (`ends`): a trigger
of a timer whose rule ended is REJECTED (`ended_refusal`), on whichever node it is asked,
as the web edge of the node keeping the table's row refuses a FIRED or CANCELLED one (a
trigger sent the fired once-timer's command again); its pause goes to the table, which
holds a PARKED row and leaves a FIRED one.
A book whose local state was folded by a version before this one knows only the keys set
since (a node restoring it from the log afresh knows them all).

A book forgets a timer whose rule has ended: each `BookTimer` records when its rule can
have no slot any more (`timer_end`: a once rule's `at`, a recurring rule's `until` or, if
cheaply counted, its `count`-th slot, plus its jitter; None for a rule without an end),
and every applier drops the running timers whose end lies more than the book's
`retention` (`BOOK_RETENTION`, 7 days, the timer table's default `finished_retention`)
before the event's own time (`live_timers`), so a replay folds to the same state and a
book of one-off timers under unique keys holds only the recent ones. A pause, resume or
trigger of a key dropped so, or past its end and retention when it comes, is refused as
one never set. The retention exceeds how long a slot may still be sent or retried
(`TimerOptions.expires_after`, a day by default), so no timer that may still fire, be
retried or sit parked is forgotten; a paused timer is kept whatever its end, as its row
in the timer table stays PAUSED until it is resumed or cancelled. A state stored before
`ends` existed reads as timers without an end: kept until cancelled, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.clients.book_state import BookState, BookTimer, gone, live_timers, timer_end
from app.errors import ConfigError
from app.model.aggregate import (
    MAX_TRIGGER_REQUEST_ID,
    AggregateType,
    Command,
    Decision,
    Event,
    send_fits,
)
from app.protocol.topics import aggregate_topics
from app.protocol.wire import (
    SCHEDULE_CANCELLED,
    SCHEDULE_PAUSED,
    SCHEDULE_RESUMED,
    SCHEDULE_SET,
    SCHEDULE_TRIGGERED,
    Refusal,
    ScheduleCancelled,
    ScheduleSet,
    ScheduleTriggered,
    error_reason,
)
from tables.bounds import STORED_INPUT
from tables.refs import NEW_INPUT
from tables.slots import first_slot

__all__ = [
    "BOOK_RETENTION",
    "CANCEL_TIMER",
    "MAX_BOOK_RETENTION",
    "MAX_BOOK_TIMERS",
    "PAUSE_TIMER",
    "RESUME_TIMER",
    "RULE_ENDED",
    "SET_TIMER",
    "TRIGGER_TIMER",
    "TimerKey",
    "book_reason",
    "ended_refusal",
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
"""Body: a `TimerKey`; the timer's command sent once now, as `<request id>>0@<digest>`, recorded by
`wow.ScheduleTriggered`; its rule and next slot as they were."""

BOOK_RETENTION: Final = 7 * 24 * 60 * 60 * 1000
"""How long (ms) past its end a book keeps a timer by default: the timer table's default
`TimerOptions.finished_retention`, well past `expires_after` (a day), after which none of
the timer's slots is sent or retried any more."""
MAX_BOOK_RETENTION: Final = 2 * 365 * 24 * 60 * 60 * 1000
"""The longest retention a book takes: the timer table's longest `finished_retention`
(2 years); a timer's row is gone by then."""
MAX_BOOK_TIMERS: Final = 1_000
"""Timers one book keeps at most: a set of a new key past it is REJECTED (a cancel, or the
end of a rule, makes room), so that one client key's endless timers cannot grow a state
each of its commands folds whole (`TICKWHEEL_MAX_STATE_BYTES` bounds its bytes too)."""


class TimerKey(BaseModel):
    """Body of a pause, resume or trigger: the key of the book's timer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str = Field(min_length=1, max_length=200)


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


def timer_book(
    context: str, name: str, *, retention: int = BOOK_RETENTION
) -> AggregateType[BookState]:
    """The aggregate type `<context>.<name>` taking `wow.SetTimer` and `wow.CancelTimer`
    (and pause, resume, trigger), keeping each timer `retention` ms past its rule's end.
    `ConfigError` for a name no topic can have (`aggregate_topics`, as the workers and the
    faust client check it) or a retention that is not a whole number of ms from 1 to
    `MAX_BOOK_RETENTION`."""
    aggregate_topics(context, name)
    # NaN compares false with every end: a book that never forgets, REJECTING every set
    # once `MAX_BOOK_TIMERS` ended timers have piled up.
    if (
        not isinstance(retention, int)
        or isinstance(retention, bool)
        or not 0 < retention <= MAX_BOOK_RETENTION
    ):
        raise ConfigError(
            f"a timer book's retention must be an integer of ms from 1 to {MAX_BOOK_RETENTION} "
            f"(2 years), got {retention!r}"
        )
    book = AggregateType(context, name, BookState)

    def pruned(state: BookState, timers: Mapping[str, BookTimer], now: int) -> BookState:
        return state.model_copy(update={"timers": live_timers(timers, now, retention)})

    @book.command(SET_TIMER)
    def _set(state: BookState, cmd: Command, d: Decision) -> None:
        try:
            body = ScheduleSet.model_validate(cmd.body, strict=True, context=NEW_INPUT)
        except ValidationError as exc:
            d.reject(f"invalid {SET_TIMER}: {_first_error(exc)}")
        if (why := book_reason(book, body, d.now)) is not None:
            d.reject(why)
        live = live_timers(state.timers, d.now, retention)  # as the applier will prune it
        if body.key not in live and len(live) >= MAX_BOOK_TIMERS:
            d.reject(
                f"{cmd.aggregate} keeps {len(live)} timers, the most a book keeps "
                f"({MAX_BOOK_TIMERS}): cancel one, or set it under another book key"
            )
        d.schedule(body.key, body.rule, body.command, body.target)

    @book.command(CANCEL_TIMER)
    def _cancel(state: BookState, cmd: Command, d: Decision) -> None:
        try:
            body = ScheduleCancelled.model_validate(cmd.body, strict=True, context=NEW_INPUT)
        except ValidationError as exc:
            d.reject(f"invalid {CANCEL_TIMER}: {_first_error(exc)}")
        # Emitted whether the key is set or not: the table cancels only what is active, and
        # a fact in the log makes the answer COMMITTED, not UNCHANGED, for either.
        d.cancel_schedule(body.key)

    @book.command(PAUSE_TIMER)
    def _pause(state: BookState, cmd: Command, d: Decision) -> None:
        key, timer = _known(state, cmd, PAUSE_TIMER, d, retention)
        if not timer.paused:  # paused already: nothing to do, answered UNCHANGED
            # Past its rule's end too: the table holds a PARKED row (`ended_refusal`).
            d.pause_schedule(key)

    @book.command(RESUME_TIMER)
    def _resume(state: BookState, cmd: Command, d: Decision) -> None:
        key, timer = _known(state, cmd, RESUME_TIMER, d, retention)
        if timer.paused:  # running: nothing to do, answered UNCHANGED
            d.resume_schedule(key)

    @book.command(TRIGGER_TIMER)
    def _trigger(state: BookState, cmd: Command, d: Decision) -> None:
        key, timer = _known(state, cmd, TRIGGER_TIMER, d, retention)
        _refuse_if_ended(cmd, TRIGGER_TIMER, key, timer, d)
        if not send_fits(cmd.request_id):
            # Another producer may write any request id a command may have: a trigger's
            # keeps the bound it had when its command was sent as `<request id>>0`.
            d.reject(
                f"{TRIGGER_TIMER} {cmd.request_id[:40]}…: a trigger's request id is at most "
                f"{MAX_TRIGGER_REQUEST_ID} characters"
            )
        # Sent in this decision's transaction, its request id derived from the trigger's
        # (`Decision.send`): a trigger sent again is a DUPLICATE and sends nothing more. A
        # target whose command topic does not exist fails it there (`NoTarget`): answered
        # ERROR, not applied, so the same trigger goes through once the topic exists.
        d.send(timer.target, timer.command.type, timer.command.body)
        d.emit(SCHEDULE_TRIGGERED, ScheduleTriggered(key=key, request_id=d.commands[-1].request_id))

    @book.applies(SCHEDULE_SET)
    def _set_applied(state: BookState, event: Event) -> BookState:
        # The book's own event, read back as stored (`STORED_INPUT`): its key and its
        # command's body as the version that took it did (a key with a control character,
        # a body past 64 bits: 0.2.0 took both), not refused as new input on a refold.
        body = ScheduleSet.model_validate(event.body, strict=True, context=STORED_INPUT)
        timers = {k: t for k, t in state.timers.items() if k != body.key}
        if body.target is not None:
            # A set without one (another writer's: a book refuses it, `book_reason`) fires
            # into the book itself; the book does not pause or trigger it.
            end = timer_end(body.rule, event.created_at)
            timers[body.key] = BookTimer(target=body.target, command=body.command, ends=end)
        return pruned(state, timers, event.created_at)

    # Every applier drops the ended timers at its event's own time, never the clock's, so
    # the state folded by a replay of the log is the state folded live.
    @book.applies(SCHEDULE_CANCELLED)
    def _cancel_applied(state: BookState, event: Event) -> BookState:
        key = ScheduleCancelled.model_validate(event.body, strict=True, context=STORED_INPUT).key
        timers = {k: t for k, t in state.timers.items() if k != key}
        return pruned(state, timers, event.created_at)

    @book.applies(SCHEDULE_PAUSED)
    def _pause_applied(state: BookState, event: Event) -> BookState:
        return pruned(state, _marked(state, event, paused=True), event.created_at)

    @book.applies(SCHEDULE_RESUMED)
    def _resume_applied(state: BookState, event: Event) -> BookState:
        return pruned(state, _marked(state, event, paused=False), event.created_at)

    @book.applies(SCHEDULE_TRIGGERED)
    def _trigger_applied(state: BookState, event: Event) -> BookState:
        # a record of what was sent; known to the book's log by this applier
        return pruned(state, state.timers, event.created_at)

    return book


def _marked(state: BookState, event: Event, *, paused: bool) -> Mapping[str, BookTimer]:
    key = str(event.body.get("key", ""))
    timer = state.timers.get(key)
    if timer is None:
        return state.timers  # paused or resumed by another writer, never set here
    if paused and timer.paused:
        return state.timers  # paused again (another writer's): when it was paused stands
    # By the event's own time, as `ended_refusal` tells an end by the command's.
    ended = paused and timer.ends is not None and timer.ends <= event.created_at
    update = {"paused": paused, "ended_when_paused": ended}
    return {**state.timers, key: timer.model_copy(update=update)}


def _known(
    state: BookState, cmd: Command, name: str, d: Decision, retention: int
) -> tuple[str, BookTimer]:
    """The key a pause, resume or trigger names and the book's timer under it; refused
    when its body is no `TimerKey` or the book has no timer under that key (never set,
    cancelled, or running past its end and retention at the command's time: no event
    has dropped it yet, the next one would)."""
    try:
        key = TimerKey.model_validate(cmd.body, strict=True, context=NEW_INPUT).key
    except ValidationError as exc:
        d.reject(f"invalid {name}: {_first_error(exc)}")
    timer = state.timers.get(key)
    if timer is None or gone(timer, d.now, retention):
        d.reject(
            f"{cmd.aggregate} has no timer {key!r} (never set, cancelled, or ended over its "
            "retention ago)"
        )
    return key, timer


RULE_ENDED: Final = Refusal.RULE_ENDED
"""The code of a trigger a book refuses because the timer's rule ended
(`ended_refusal`): its REJECTED answer carries it as `CommandResult.refusal`, what the
web edge answers 409 (a key it has no timer under is a 404), never read from the text."""


def ended_refusal(action: str, timer: BookTimer, now: int) -> str | None:
    """Why a book refuses `action` (a command's type) on a timer it keeps, at `now`, because
    its rule ended (`BookTimer.ends` at or before `now`: its last slot is due, firing or
    fired), or None. Only a trigger, which would send the last slot's command again. A
    pause goes to the table, which holds a PENDING, FIRING or PARKED row and leaves a FIRED
    one, which the book cannot tell apart. A timer paused before its end never fired (its
    row stays PAUSED): it is triggered as before; one paused after it may have
    (`ended_when_paused`). The refusal (code `RULE_ENDED`) says `<owner>'s timer <key>: `
    and this text."""
    if action != TRIGGER_TIMER or timer.ends is None:
        return None
    if timer.paused and not timer.ended_when_paused:
        return None
    if timer.ends > now:
        return None
    at = datetime.fromtimestamp(timer.ends / 1000, UTC).isoformat(timespec="milliseconds")
    how = "set it again to start it anew"
    if timer.paused:
        how = f"paused after it: resume it, for an operator's retry if it is parked, or {how}"
    return (
        f"its rule ended at {at.replace('+00:00', 'Z')} (its last slot is due or fired): nothing "
        f"to trigger ({how})"
    )


def _refuse_if_ended(cmd: Command, action: str, key: str, timer: BookTimer, d: Decision) -> None:
    if (why := ended_refusal(action, timer, d.now)) is not None:
        d.reject(f"{cmd.aggregate}'s timer {key!r}: {why}", refusal=RULE_ENDED)


def _first_error(exc: ValidationError) -> str:
    return error_reason(exc.errors()[0])
