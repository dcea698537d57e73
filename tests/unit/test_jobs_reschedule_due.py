"""A reschedule that lands while a slot of the old rule is due: that slot runs once.

The reschedule replaces the instance's tick timer, whose due slot, handed to its cycle and
not fired yet, is dropped with the old row (`TimerRunner.still_due`); a tick of it in
flight finds a newer timer and runs nothing. Before the fix the slot was lost without a
word, and only a backfill ran it. The seed's Tick runs a slot newer than the last one run
"of the same timer or a later one": the old timer's due slot is such a slot, so the
Reschedule runs it, under its live tick's request id, before it replaces the timer."""

from __future__ import annotations

import logging

import pytest
from fakes import sent_base
from test_jobs import CONTEXT, NIGHTLY_RULE, TARGET, Instance, Recorder, types

from app.jobs import (
    RESCHEDULED,
    RUN_FAILED,
    TICKED,
    BackfillSlot,
    Job,
    JobRun,
    JobScope,
    backfill_slots,
    disable_command,
    enable_command,
    reschedule_command,
    schedule_aggregate,
    tick_timers,
)
from app.jobs.runs import MAX_OWED_SLOTS, OwedSlots, owed_slots
from app.jobs.schedule_state import ScheduleState, run_key
from app.model.aggregate import MAX_DECISION_RECORDS
from app.model.user_code import UserCodeTimeout
from app.protocol.wire import SCHEDULE_CANCELLED, SCHEDULE_SET, ResultCode
from tables import CronRule, IntervalRule
from tables.slots import Slot

DAY = 86_400_000


def _nightly(recorder: Recorder, rule: object = NIGHTLY_RULE) -> tuple[Job, Instance]:
    job = Job("nightly", JobScope.SYSTEM, rule, recorder)  # type: ignore[arg-type]
    instance = Instance(schedule_aggregate(CONTEXT, [job], 8))
    assert instance.run(enable_command(CONTEXT, job)).code is ResultCode.COMMITTED
    return job, instance


def test_a_slot_due_when_a_reschedule_lands_runs_once() -> None:
    recorder = Recorder(send=True)
    job, instance = _nightly(recorder)
    old = instance.state.timer_id
    assert instance.tick(0).code is ResultCode.COMMITTED
    due = instance.due_at(1)
    # Slot 1 is due (03:00 passed) and its tick not decided yet when the reschedule lands.
    d = instance.run(reschedule_command(CONTEXT, job, {"expr": "0 5 * * *"}), now=due + 5)
    assert d.code is ResultCode.COMMITTED, d.message
    assert types(d) == [TICKED, RESCHEDULED, SCHEDULE_SET]
    assert d.events[0].body == {"slot": 1, "due_at": due, "timer_id": old}
    # Its commands are those its live tick would have sent: a target takes them once.
    assert [sent_base(c.request_id) for c in d.commands] == [f"{old}#1>0"]
    assert [(r.slot, r.due_at, r.request_id) for r in recorder.runs[1:]] == [(1, due, f"{old}#1")]
    # The old timer's tick of it, in flight, runs nothing more; the new timer counts afresh.
    assert instance.tick(1, timer_id=old, due_at=due).code is ResultCode.UNCHANGED
    assert [r.slot for r in recorder.runs] == [0, 1]
    assert instance.state.timer_id not in (None, old)
    assert instance.state.last_slot is None
    assert instance.tick(0).code is ResultCode.COMMITTED
    assert [r.slot for r in recorder.runs] == [0, 1, 0]


def test_a_reschedule_before_the_slot_is_due_runs_nothing() -> None:
    recorder = Recorder()
    job, instance = _nightly(recorder)
    instance.tick(0)
    d = instance.run(
        reschedule_command(CONTEXT, job, {"expr": "0 5 * * *"}), now=instance.due_at(1) - 1
    )
    assert types(d) == [RESCHEDULED, SCHEDULE_SET]
    assert [r.slot for r in recorder.runs] == [0]


def test_a_coalescing_rule_runs_the_latest_slot_due_as_its_timer_would() -> None:
    """Several slots behind (a node that was down), the timer would send the latest alone."""
    recorder = Recorder()
    job, instance = _nightly(recorder)
    old = instance.state.timer_id
    instance.tick(0)
    due = instance.due_at(3)
    d = instance.run(reschedule_command(CONTEXT, job, {"expr": "0 5 * * *"}), now=due + 1)
    assert d.events[0].body == {"slot": 3, "due_at": due, "timer_id": old}
    assert [r.slot for r in recorder.runs] == [0, 3]


def test_a_due_first_slot_runs_when_none_ran_yet() -> None:
    recorder = Recorder()
    job, instance = _nightly(recorder, IntervalRule(start=2_000_000, every=60_000))
    old = instance.state.timer_id
    first = instance.due_at(0)
    d = instance.run(reschedule_command(CONTEXT, job, {"every": 120_000}), now=first)
    assert types(d) == [TICKED, RESCHEDULED, SCHEDULE_SET]
    assert d.events[0].body == {"slot": 0, "due_at": first, "timer_id": old}


def test_an_enable_with_a_new_rule_runs_the_due_slot_too() -> None:
    recorder = Recorder()
    job, instance = _nightly(recorder)
    instance.tick(0)
    due = instance.due_at(1)
    d = instance.run(enable_command(CONTEXT, job, rule={"expr": "0 5 * * *"}), now=due)
    assert types(d)[0] == TICKED
    assert [r.slot for r in recorder.runs] == [0, 1]


def test_the_due_slot_whose_handler_fails_waits_on_its_run_timer() -> None:
    failures: list[Exception] = []
    recorder = Recorder()

    def flaky(run: JobRun) -> None:
        run.send(TARGET, "shop.RemindToPay", {"slot": run.slot})
        if failures:
            raise failures.pop()
        recorder(run)

    job, instance = _nightly(recorder)
    instance.agg = schedule_aggregate(
        CONTEXT, [Job("nightly", JobScope.SYSTEM, NIGHTLY_RULE, flaky)], 8
    )
    instance.tick(0)
    failures.append(RuntimeError("disk full"))
    d = instance.run(
        reschedule_command(CONTEXT, job, {"expr": "0 5 * * *"}), now=instance.due_at(1)
    )
    assert d.code is ResultCode.COMMITTED
    assert types(d) == [TICKED, RUN_FAILED, SCHEDULE_SET, RESCHEDULED, SCHEDULE_SET]
    assert d.commands == [], "a failed run's commands are not kept"
    assert instance.state.failed_runs == [d.events[1].body["key"]]


def test_a_backfill_plan_passes_over_the_slot_a_reschedule_ran() -> None:
    """It ran (under another command than its tick, which a backfill's request id would
    not find applied): sent, the backfill would run it again."""
    recorder = Recorder()
    job, instance = _nightly(recorder)
    old = instance.state.timer_id
    assert old is not None
    instance.tick(0)
    due = instance.due_at(2)
    instance.run(reschedule_command(CONTEXT, job, {"expr": "0 5 * * *"}), now=due + 5)
    assert [r.slot for r in recorder.runs] == [0, 2]  # slot 1 coalesced away, as live
    slots = backfill_slots(tick_timers(instance.log), 0, due + 5)
    # Slot 0 ran live: sent, and answered DUPLICATE by its tick's request id, as before.
    assert [(s.timer_id, s.slot, s.due_at) for s in slots] == [
        (old, 0, due - 2 * DAY),
        (old, 1, due - DAY),
    ]


def test_a_disabled_instance_owes_nothing() -> None:
    """An enable of a paused instance starts a new timer from its next slot: the slots of
    the paused window are not caught up (a backfill runs them)."""
    recorder = Recorder()
    job, instance = _nightly(recorder)
    instance.tick(0)
    instance.run(disable_command(CONTEXT, job))
    d = instance.run(enable_command(CONTEXT, job, rule={"expr": "0 5 * * *"}), now=5 * DAY)
    assert TICKED not in types(d)
    assert [r.slot for r in recorder.runs] == [0]


# --- a rule that does not coalesce, several slots behind ---------------------------------

EVERY_NIGHT = CronRule(expr="0 3 * * *", zone="UTC", coalesce=False)


def test_a_rule_that_does_not_coalesce_runs_every_slot_it_owes_in_order() -> None:
    """It promises every slot: the timer would have sent each in turn. Before the fix the
    reschedule ran the first alone and logged the rest as left to a backfill."""
    recorder = Recorder(send=True)
    job, instance = _nightly(recorder, EVERY_NIGHT)
    old = instance.state.timer_id
    assert old is not None
    assert instance.tick(0).code is ResultCode.COMMITTED
    dues = [instance.due_at(n) for n in (1, 2, 3)]
    d = instance.run(reschedule_command(CONTEXT, job, {"expr": "0 5 * * *"}), now=dues[-1] + 5)
    assert d.code is ResultCode.COMMITTED, d.message
    assert types(d) == [TICKED, TICKED, TICKED, RESCHEDULED, SCHEDULE_SET]
    assert [e.body for e in d.events[:3]] == [
        {"slot": n, "due_at": due, "timer_id": old} for n, due in zip((1, 2, 3), dues, strict=True)
    ]
    # Each under its live tick's request id: a target takes each slot's command once.
    assert [(r.slot, r.due_at, r.request_id) for r in recorder.runs[1:]] == [
        (n, due, f"{old}#{n}") for n, due in zip((1, 2, 3), dues, strict=True)
    ]
    assert [sent_base(c.request_id) for c in d.commands] == [f"{old}#{n}>0" for n in (1, 2, 3)]
    # None is left to a backfill, none run twice by one.
    assert backfill_slots(tick_timers(instance.log), 0, dues[-1] + 5) == [
        BackfillSlot(old, 0, dues[0] - DAY)
    ]


def test_the_owed_slots_past_the_bound_are_left_to_a_backfill_and_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    recorder = Recorder()
    job, instance = _nightly(recorder, EVERY_NIGHT)
    old = instance.state.timer_id
    instance.tick(0)
    behind = MAX_OWED_SLOTS + 7
    first, now = instance.due_at(1), instance.due_at(behind) + 5
    with caplog.at_level(logging.ERROR, "app.jobs.slot_runs"):
        d = instance.run(reschedule_command(CONTEXT, job, {"expr": "0 5 * * *"}), now=now)
    assert d.code is ResultCode.COMMITTED, d.message
    assert [r.slot for r in recorder.runs] == list(range(MAX_OWED_SLOTS + 1))  # 0 live
    (line,) = [r.getMessage() for r in caplog.records]
    assert f"7 slot(s) of {old}" in line and f"slot {MAX_OWED_SLOTS + 1}" in line, line
    # The ones left are the backfill's: not run by the reschedule, they keep their tick ids.
    left = backfill_slots(tick_timers(instance.log), first, now)
    assert [s.slot for s in left] == list(range(MAX_OWED_SLOTS + 1, behind + 1))


def test_several_owed_slots_that_fail_each_wait_on_their_run_timer() -> None:
    """Each failure folded before the next: the instance's failed slots count them all."""

    def failing(run: JobRun) -> None:
        raise RuntimeError(f"slot {run.slot}")

    job, instance = _nightly(Recorder(), EVERY_NIGHT)
    instance.agg = schedule_aggregate(
        CONTEXT, [Job("nightly", JobScope.SYSTEM, EVERY_NIGHT, failing)], 8, max_failed_runs=2
    )
    old = instance.state.timer_id
    assert old is not None
    instance.tick(0)
    d = instance.run(
        reschedule_command(CONTEXT, job, {"expr": "0 5 * * *"}), now=instance.due_at(3) + 5
    )
    assert d.code is ResultCode.COMMITTED, d.message
    # Slot 0 failed live; with 2 kept, slot 2's failure drops slot 0's, slot 3's slot 1's.
    assert [k.rsplit("#", 1)[1] for k in instance.state.failed_runs] == ["2", "3"]
    cancelled = [e.body["key"] for e in d.events if e.type == SCHEDULE_CANCELLED]
    assert cancelled == [run_key(old, 0), run_key(old, 1)]


def test_a_handler_interrupted_by_the_timeout_stops_the_owed_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The reschedule's time is spent: each next handler would be interrupted in turn, and
    the node ends a command that runs on past its interruption. The rest are left to a
    backfill, said."""
    ran: list[int] = []

    def slow(run: JobRun) -> None:
        ran.append(run.slot)
        if run.slot == 2:
            raise UserCodeTimeout("the handler of job nightly", 5.1, 5.0)

    job, instance = _nightly(Recorder(), EVERY_NIGHT)
    instance.agg = schedule_aggregate(
        CONTEXT, [Job("nightly", JobScope.SYSTEM, EVERY_NIGHT, slow)], 8
    )
    old = instance.state.timer_id
    instance.tick(0)
    with caplog.at_level(logging.ERROR, "app.jobs.slot_runs"):
        d = instance.run(
            reschedule_command(CONTEXT, job, {"expr": "0 5 * * *"}), now=instance.due_at(5) + 5
        )
    assert d.code is ResultCode.COMMITTED, d.message
    assert ran == [0, 1, 2]
    assert types(d) == [TICKED, TICKED, RUN_FAILED, SCHEDULE_SET, RESCHEDULED, SCHEDULE_SET]
    (line,) = [r.getMessage() for r in caplog.records if r.name == "app.jobs.slot_runs"]
    assert f"3 slot(s) of {old}" in line and "slot 3" in line, line


def test_owed_slots_that_would_pass_a_decisions_records_stop_before_them() -> None:
    """A handler's commands join the reschedule's one decision: past `MAX_DECISION_RECORDS`
    the whole reschedule was refused (ERROR), for good. The slot that would pass it is not
    run (its commands dropped), nor any after it."""
    sends = 4_000

    def busy(run: JobRun) -> None:
        for n in range(sends):
            run.send(TARGET, "shop.RemindToPay", {"n": n})

    job, instance = _nightly(Recorder(), EVERY_NIGHT)
    instance.agg = schedule_aggregate(
        CONTEXT, [Job("nightly", JobScope.SYSTEM, EVERY_NIGHT, busy)], 8
    )
    instance.tick(0)
    d = instance.run(
        reschedule_command(CONTEXT, job, {"expr": "0 5 * * *"}), now=instance.due_at(4) + 5
    )
    assert d.code is ResultCode.COMMITTED, d.message
    assert types(d) == [TICKED, TICKED, RESCHEDULED, SCHEDULE_SET]
    assert len(d.commands) == 2 * sends
    assert len(d.events) + len(d.commands) <= MAX_DECISION_RECORDS


def test_owed_slots_of_each_kind_of_rule() -> None:
    state = ScheduleState(
        job="j", enabled=True, timer_id="t", timer_set_at=0, last_slot=0, last_due_at=0
    )
    every = IntervalRule(start=0, every=1_000, coalesce=False).model_dump(mode="json")
    behind = state.model_copy(update={"rule": every})
    assert owed_slots(behind, 3_500) == OwedSlots(
        [Slot(1, 1_000), Slot(2, 2_000), Slot(3, 3_000)], 0
    )
    assert owed_slots(behind, 3_500, limit=2) == OwedSlots([Slot(1, 1_000), Slot(2, 2_000)], 1)
    assert owed_slots(behind, 999) is None
    coalescing = state.model_copy(update={"rule": {**every, "coalesce": True}})
    assert owed_slots(coalescing, 3_500) == OwedSlots([Slot(3, 3_000)], 0)
    counted = state.model_copy(update={"rule": {**every, "count": 3}})
    assert owed_slots(counted, 9_500) == OwedSlots([Slot(1, 1_000), Slot(2, 2_000)], 0)
