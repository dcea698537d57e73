"""The node's handler timeout interrupting a reschedule's owed slots outside a handler.

A Reschedule of a rule that does not coalesce runs the slots its old tick timer owes in
its one decision, timed as one invocation by the node's watchdog. Its interruption
(`UserCodeTimeout`, raised by a signal wherever the main thread is) that lands in a
handler is that slot's failure; one that lands between handlers (making a slot's records,
folding them) answered the whole Reschedule ERROR, nothing of it kept: the slots already
run were run again by the next attempt, which the same timeout could end again. The slots
settled are kept, the one being settled is dropped whole (its commands too), and it and
those after it are left to a backfill, said, as after an interrupted handler. Each slot's
run commits once. The interruption is made here where the signal could land (in the
schedule's own code), on the in-memory log, at the instants the test gives."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from fakes import sent_base
from test_jobs import CONTEXT, Instance, Recorder, types
from test_jobs_reschedule_due import EVERY_NIGHT

import app.jobs.slot_runs
from app.jobs import (
    RESCHEDULED,
    TICKED,
    Job,
    JobRun,
    JobScope,
    backfill_command,
    backfill_slots,
    enable_command,
    reschedule_command,
    schedule_aggregate,
    tick_timers,
)
from app.jobs.schedule_state import ScheduleState, apply_schedule_event
from app.model.aggregate import Event
from app.model.user_code import UserCodeTimeout
from app.protocol.wire import SCHEDULE_SET, ResultCode

INTERRUPTED_SLOT = 2


def _timeout() -> UserCodeTimeout:
    return UserCodeTimeout("the handler of wow.schedule.Reschedule", 5.1, 5.0)


def _before_its_handler(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interruption lands as the slot's run is made, before its handler is called."""

    def run(**fields: Any) -> JobRun:
        if fields["slot"] == INTERRUPTED_SLOT:
            raise _timeout()
        return JobRun(**fields)

    monkeypatch.setattr(app.jobs.slot_runs, "JobRun", run)


def _as_it_is_folded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interruption lands after the slot's handler returned, as its `Ticked` is folded
    before the next slot."""

    def fold(state: ScheduleState, event: Event) -> ScheduleState:
        if event.type == TICKED and event.body["slot"] == INTERRUPTED_SLOT:
            raise _timeout()
        return apply_schedule_event(state, event)

    monkeypatch.setattr(app.jobs.slot_runs, "apply_schedule_event", fold)


@pytest.mark.parametrize(
    ("interrupt", "handled"),
    [(_before_its_handler, [0, 1]), (_as_it_is_folded, [0, 1, 2])],
    ids=["before-its-handler", "as-it-is-folded"],
)
def test_an_interruption_between_handlers_keeps_the_slots_run(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    interrupt: Any,
    handled: list[int],
) -> None:
    recorder = Recorder(send=True)
    job = Job("nightly", JobScope.SYSTEM, EVERY_NIGHT, recorder)
    instance = Instance(schedule_aggregate(CONTEXT, [job], 8))
    assert instance.run(enable_command(CONTEXT, job)).code is ResultCode.COMMITTED
    old = instance.state.timer_id
    assert old is not None
    assert instance.tick(0).code is ResultCode.COMMITTED
    first, now = instance.due_at(1), instance.due_at(5) + 5
    interrupt(monkeypatch)
    with caplog.at_level(logging.ERROR, "app.jobs.slot_runs"):
        d = instance.run(reschedule_command(CONTEXT, job, {"expr": "0 5 * * *"}), now=now)
    assert d.code is ResultCode.COMMITTED, d.message
    # Slot 1 settled and kept; slot 2, interrupted, left whole (its commands too).
    assert types(d) == [TICKED, RESCHEDULED, SCHEDULE_SET]
    assert d.events[0].body["slot"] == 1
    assert [sent_base(c.request_id) for c in d.commands] == [f"{old}#1>0"]
    assert [r.slot for r in recorder.runs] == handled
    (line,) = [r.getMessage() for r in caplog.records if r.name == "app.jobs.slot_runs"]
    assert f"4 slot(s) of {old}" in line and f"from slot {INTERRUPTED_SLOT} on" in line, line
    # The backfill the line asks for runs the rest, each once: slot 1 is not among them.
    monkeypatch.undo()
    left = backfill_slots(tick_timers(instance.log), first, now)
    assert [s.slot for s in left] == [2, 3, 4, 5]
    ref = instance.log[-1].aggregate
    sent = [c for s in left for c in instance.run(backfill_command(ref, s), now=now).commands]
    assert [sent_base(c.request_id) for c in sent] == [f"{old}#{n}>0" for n in (2, 3, 4, 5)]
    again = [instance.run(backfill_command(ref, s), now=now).code for s in left]
    assert again == [ResultCode.DUPLICATE] * 4
