"""The services the integration tests run in worker processes.

The context's name comes from `TW_TEST_CONTEXT`, so that each test has topics of its own.
"""

from __future__ import annotations

import os

from pydantic import BaseModel

from app.clients.timer_book import timer_book
from app.model.aggregate import (
    AggregateType,
    Command,
    Decision,
    Event,
)
from app.service import Service
from tables import AggregateRef, CommandSpec, parse_rule

CONTEXT = os.environ.get("TW_TEST_CONTEXT", "itest")


class Counter(BaseModel):
    applied: int = 0
    fired: int = 0


counter = AggregateType(CONTEXT, "counter", Counter)


@counter.command("Apply")
def _apply(state: Counter, cmd: Command, d: Decision) -> None:
    d.emit("Applied", {"n": state.applied + 1})


@counter.command("Fire")
def _fire(state: Counter, cmd: Command, d: Decision) -> None:
    # A timer's command: the event records which slot it was (its request id).
    d.emit("Fired", {"n": state.fired + 1, "not_before": cmd.not_before})


@counter.command("Reject")
def _reject(state: Counter, cmd: Command, d: Decision) -> None:
    d.reject("rejected on purpose")


@counter.command("Noop")
def _noop(state: Counter, cmd: Command, d: Decision) -> None:
    pass


@counter.command("Schedule")
def _schedule(state: Counter, cmd: Command, d: Decision) -> None:
    target = cmd.body.get("target")
    d.schedule(
        str(cmd.body["key"]),
        parse_rule(cmd.body["rule"]),
        CommandSpec(type=str(cmd.body.get("type", "Fire")), body={}),
        AggregateRef.model_validate(target) if target else None,
    )


@counter.command("ScheduleMany")
def _schedule_many(state: Counter, cmd: Command, d: Decision) -> None:
    for item in cmd.body["timers"]:
        target = item.get("target")
        d.schedule(
            str(item["key"]),
            parse_rule(item["rule"]),
            CommandSpec(type="Fire"),
            AggregateRef.model_validate(target) if target else None,
        )


@counter.command("Unschedule")
def _unschedule(state: Counter, cmd: Command, d: Decision) -> None:
    for key in cmd.body["keys"]:
        d.cancel_schedule(str(key))


@counter.command("Delete")
def _delete(state: Counter, cmd: Command, d: Decision) -> None:
    d.delete()


@counter.applies("Applied")
def _applied(state: Counter, e: Event) -> Counter:
    return state.model_copy(update={"applied": e.body["n"]})


@counter.applies("Fired")
def _fired(state: Counter, e: Event) -> Counter:
    return state.model_copy(update={"fired": e.body["n"]})


service = Service(aggregates=(counter,))

book = timer_book(CONTEXT, "book")
"""A timer book whose timers fire into `counter` (timers set over HTTP and the CLI)."""
reminders = timer_book(CONTEXT, "reminders")
"""The book docs/operations.md's command lines name (`shop.reminders`, in this context)."""
book_service = Service(aggregates=(counter, book, reminders))
