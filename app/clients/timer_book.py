"""A timer book: an aggregate type whose commands set and cancel timers for clients that
keep no Tickwheel aggregate of their own (a faust app, a service in another language).

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
"""

from __future__ import annotations

import logging
from typing import Final

from pydantic import BaseModel, ConfigDict, ValidationError

from app.model.aggregate import AggregateType, Command, Decision
from app.protocol.wire import ScheduleCancelled, ScheduleSet
from tables.slots import first_slot

__all__ = ["CANCEL_TIMER", "SET_TIMER", "BookState", "book_reason", "timer_book"]

logger = logging.getLogger(__name__)

SET_TIMER: Final = "wow.SetTimer"
"""Body: a `ScheduleSet` (key, rule, target, command); decided into `wow.ScheduleSet`."""
CANCEL_TIMER: Final = "wow.CancelTimer"
"""Body: a `ScheduleCancelled` (key); decided into `wow.ScheduleCancelled`."""


class BookState(BaseModel):
    """A book keeps no state of its own: its timers live in the timer table, and its
    version (the store's) is all that the next event needs."""

    model_config = ConfigDict(frozen=True, extra="forbid")


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

    return book


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "body"
    return f"{where}: {err['msg']}"
