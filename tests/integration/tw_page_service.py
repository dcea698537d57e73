"""The service of the operator page's browser test: a gate that fails its timers' command
until it is opened, as a target does until an operator has fixed what it depends on.

`Pass` fails (a ValueError: ERROR, so the timer is retried and then parked) while the
gate is closed; `Open` opens it, and `Pass` then commits `Passed`. The context's name
comes from `TW_TEST_CONTEXT`, as for `tw_services`.

The page's timer buttons act on a timer book (`<context>.reminders`), and its job buttons
on the job `nightly`, whose run sends `Tick` to the gate `job-ran`.
"""

from __future__ import annotations

import os

from pydantic import BaseModel

from app.clients.timer_book import timer_book
from app.jobs import Job, JobRun, JobScope
from app.model.aggregate import (
    AggregateType,
    Command,
    Decision,
    Event,
)
from app.service import Service
from tables import AggregateRef, CommandSpec, parse_rule

CONTEXT = os.environ.get("TW_TEST_CONTEXT", "itest")


class Gate(BaseModel):
    open: bool = False
    passed: int = 0


gate = AggregateType(CONTEXT, "gate", Gate)


@gate.command("Schedule")
def _schedule(state: Gate, cmd: Command, d: Decision) -> None:
    d.schedule(
        str(cmd.body["key"]),
        parse_rule(cmd.body["rule"]),
        CommandSpec(type=str(cmd.body["type"]), body={}),
        AggregateRef.model_validate(cmd.body["target"]),
    )


@gate.command("Open")
def _open(state: Gate, cmd: Command, d: Decision) -> None:
    d.emit("Opened", {})


@gate.command("Pass")
def _pass(state: Gate, cmd: Command, d: Decision) -> None:
    if not state.open:
        raise ValueError("the gate is closed")
    d.emit("Passed", {"n": state.passed + 1})


@gate.command("Tick")
def _tick(state: Gate, cmd: Command, d: Decision) -> None:
    d.emit("Ticked", {})


@gate.applies("Opened")
def _opened(state: Gate, e: Event) -> Gate:
    return state.model_copy(update={"open": True})


@gate.applies("Passed")
def _passed(state: Gate, e: Event) -> Gate:
    return state.model_copy(update={"passed": e.body["n"]})


@gate.applies("Ticked")
def _ticked(state: Gate, e: Event) -> Gate:
    return state


JOB_TARGET = AggregateRef(context=CONTEXT, aggregate="gate", id="job-ran")


def _nightly(run: JobRun) -> None:
    run.send(JOB_TARGET, "Tick", {})


nightly = Job(
    "nightly", JobScope.SYSTEM, parse_rule({"kind": "cron", "expr": "0 3 * * *"}), _nightly
)

service = Service(aggregates=(gate, timer_book(CONTEXT, "reminders")), jobs={CONTEXT: (nightly,)})
