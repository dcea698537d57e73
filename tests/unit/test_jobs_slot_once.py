"""Each slot of a job instance runs once across its rule changes.

A new tick timer counts its slots from when it is set. Set at a slot's due time (a
reschedule that ran the old timer's slot due then, or a tick that took a new default
when it ran it), its first slot can be due at that same instant; set after the clock
stepped back, its first slots are instants that ran already. Those ran under the older
timer: the new timer's ticks of them, and a backfill of them, run nothing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_jobs import CONTEXT, Instance, Recorder, tick_command, types

from app.jobs import (
    RESCHEDULED,
    TICKED,
    BackfillSlot,
    Job,
    JobScope,
    backfill_command,
    backfill_slots,
    disable_command,
    enable_command,
    reschedule_command,
    schedule_aggregate,
    tick_timers,
)
from app.jobs.runs import OwedSlots, owed_slots
from app.jobs.schedule_state import ScheduleState, timer_floor
from app.model.decide import Decided
from app.protocol.wire import SCHEDULE_SET, ResultCode
from tables import AggregateRef, CronRule, IntervalRule, OnceRule
from tables.slots import Slot, first_slot

MIN = 60_000


def _enabled(recorder: Recorder, rule: IntervalRule | CronRule) -> tuple[Job, Instance]:
    job = Job("nightly", JobScope.SYSTEM, rule, recorder)
    instance = Instance(schedule_aggregate(CONTEXT, [job], 8))
    assert instance.run(enable_command(CONTEXT, job)).code is ResultCode.COMMITTED
    return job, instance


def _dues(recorder: Recorder) -> list[int]:
    return [r.due_at for r in recorder.runs]


def test_a_reschedule_at_a_slots_due_time_runs_that_slot_once() -> None:
    recorder = Recorder()
    job, instance = _enabled(recorder, IntervalRule(start=2_000_000, every=MIN))
    due = instance.due_at(0)
    d = instance.run(reschedule_command(CONTEXT, job, {"every": 2 * MIN}), now=due)
    assert types(d) == [TICKED, RESCHEDULED, SCHEDULE_SET]
    # The new timer's first slot is due at that same instant: it ran, under the old timer.
    assert instance.due_at(0) == due
    assert instance.tick(0).code is ResultCode.UNCHANGED
    assert _dues(recorder) == [due]
    assert instance.tick(1).code is ResultCode.COMMITTED
    assert _dues(recorder) == [due, due + 2 * MIN]


def test_a_new_default_taken_by_a_tick_at_its_due_time_runs_that_slot_once() -> None:
    recorder = Recorder()
    hourly = CronRule(expr="0 * * * *", zone="Europe/Berlin")
    _, instance = _enabled(recorder, hourly)
    due = instance.due_at(0)
    # The next release changes only whether the default coalesces.
    changed = Job(
        "nightly", JobScope.SYSTEM, hourly.model_copy(update={"coalesce": False}), recorder
    )
    instance.agg = schedule_aggregate(CONTEXT, [changed], 8)
    d = instance.tick(0)  # decided at its due time, to the millisecond
    assert types(d) == [TICKED, RESCHEDULED, SCHEDULE_SET]
    assert instance.due_at(0) == due
    assert instance.tick(0).code is ResultCode.UNCHANGED
    assert instance.tick(1).code is ResultCode.COMMITTED
    assert _dues(recorder) == [due, due + 60 * MIN]


def _stepped_back(recorder: Recorder) -> tuple[Job, Instance, AggregateRef, str, Decided]:
    """A minutely instance that ran minutes 100-105, then rescheduled (no coalescing) on a
    node whose clock is 3 minutes behind: the job, the instance, its ref, its first timer's
    id and the reschedule's decision."""
    job = Job("nightly", JobScope.SYSTEM, IntervalRule(start=0, every=MIN), recorder)
    instance = Instance(schedule_aggregate(CONTEXT, [job], 8))
    instance.run(enable_command(CONTEXT, job), now=100 * MIN)
    ref, old = instance.log[-1].aggregate, instance.state.timer_id
    assert old is not None
    for minute in range(100, 106):
        instance.run(tick_command(ref, old, minute, minute * MIN), now=minute * MIN)
    instance.now = 103 * MIN - 1  # the partition moves to a node 3 minutes behind
    d = instance.run(reschedule_command(CONTEXT, job, {"coalesce": False}), now=103 * MIN)
    return job, instance, ref, old, d


def test_a_reschedule_after_the_clock_stepped_back_runs_no_slot_again() -> None:
    recorder = Recorder()
    _, instance, ref, old, d = _stepped_back(recorder)
    assert types(d) == [RESCHEDULED, SCHEDULE_SET]
    new = instance.state.timer_id
    assert new is not None and new != old
    rule = IntervalRule(start=0, every=MIN, coalesce=False)
    first = first_slot(rule, 103 * MIN)
    assert first == Slot(103, 103 * MIN)
    codes = [
        instance.run(tick_command(ref, new, minute, minute * MIN), now=minute * MIN).code
        for minute in range(103, 108)
    ]
    assert codes == [ResultCode.UNCHANGED] * 3 + [ResultCode.COMMITTED] * 2
    assert _dues(recorder) == [m * MIN for m in range(100, 108)]


def test_a_backfill_of_a_slot_an_older_timer_ran_runs_nothing() -> None:
    recorder = Recorder()
    job, instance = _enabled(recorder, IntervalRule(start=2_000_000, every=MIN))
    due = instance.due_at(0)
    instance.run(reschedule_command(CONTEXT, job, {"every": 2 * MIN}), now=due)
    timer = instance.state.timer_id
    assert timer is not None
    instance.tick(0)
    instance.tick(1)  # the new timer has run a slot of its own since
    ref = instance.log[-1].aggregate
    d = instance.run(backfill_command(ref, BackfillSlot(timer, 0, due)))
    assert d.code is ResultCode.UNCHANGED, d.message
    assert _dues(recorder) == [due, due + 2 * MIN]


def test_a_timer_owes_no_slot_due_before_the_last_an_older_timer_ran() -> None:
    every = IntervalRule(start=0, every=1_000, coalesce=False).model_dump(mode="json")
    # Set at 2_000 after the clock stepped back: slot 3 (due 3_000) ran under the old timer.
    state = ScheduleState(
        job="j", enabled=True, rule=every, timer_id="t", timer_set_at=2_000, last_due_at=3_000
    ).model_copy(update={"timer_after": 3_000})
    assert owed_slots(state, 3_500) is None
    assert owed_slots(state, 5_500) == OwedSlots([Slot(4, 4_000), Slot(5, 5_000)], 0)
    # A state stored before `timer_after`: the older timer's last slot tells it.
    before = state.model_copy(update={"timer_after": None})
    assert owed_slots(before, 5_500) == OwedSlots([Slot(4, 4_000), Slot(5, 5_000)], 0)


# --- a backfill over a retired timer -----------------------------------------------------


def _backfill(instance: Instance, start: int, until: int) -> list[tuple[BackfillSlot, ResultCode]]:
    """Plans a backfill of `[start, until]` from the instance's log, as `jobs backfill`
    does, and sends each slot: what it planned, and each slot's answer."""
    ref = instance.log[-1].aggregate
    planned = backfill_slots(tick_timers(instance.log), start, until)
    return [(s, instance.run(backfill_command(ref, s)).code) for s in planned]


def test_a_backfill_does_not_run_again_a_slot_a_retired_timer_was_set_at() -> None:
    recorder = Recorder()
    job, instance = _enabled(recorder, IntervalRule(start=2_000_000, every=MIN))
    due = instance.due_at(0)
    instance.run(reschedule_command(CONTEXT, job, {"every": 2 * MIN}), now=due)
    middle = instance.state.timer_id
    assert instance.tick(0).code is ResultCode.UNCHANGED  # due at `due`: it ran
    assert instance.tick(1).code is ResultCode.COMMITTED
    # Another change retires the middle timer: the node no longer knows where it began.
    instance.run(reschedule_command(CONTEXT, job, {"every": 3 * MIN}), now=due + 3 * MIN)
    assert instance.state.timer_id != middle
    sent = _backfill(instance, due - MIN, due + 3 * MIN - 1)
    assert _dues(recorder) == [due, due + 2 * MIN]  # `due` once
    assert (middle, 0) not in [(s.timer_id, s.slot) for s, _ in sent]


def test_a_backfill_does_not_run_again_the_slots_before_a_clock_step_back() -> None:
    recorder = Recorder()
    job, instance, ref, _, _ = _stepped_back(recorder)
    middle = instance.state.timer_id
    assert middle is not None
    for minute in range(103, 108):
        instance.run(tick_command(ref, middle, minute, minute * MIN), now=minute * MIN)
    instance.run(reschedule_command(CONTEXT, job, {"every": 2 * MIN}), now=108 * MIN)
    sent = _backfill(instance, 100 * MIN, 108 * MIN)
    # Each minute once (108 too: the last change ran its old timer's slot due then).
    assert _dues(recorder) == [m * MIN for m in range(100, 109)]
    # Slots 103-105 of the middle timer ran under the first (its ticks of them ran nothing).
    assert [(s.timer_id, s.slot) for s, _ in sent if s.timer_id == middle] == [
        (middle, 106),
        (middle, 107),
    ]
    assert {code for _, code in sent} == {ResultCode.DUPLICATE}


def test_a_backfill_plans_no_slot_of_the_current_timer_that_it_would_not_run() -> None:
    recorder = Recorder()
    job, instance = _enabled(recorder, IntervalRule(start=2_000_000, every=MIN))
    due = instance.due_at(0)
    instance.run(reschedule_command(CONTEXT, job, {"every": 2 * MIN}), now=due)
    timer = instance.state.timer_id
    instance.tick(0)
    instance.now = due + 5 * MIN  # its slots 1 and 2 were missed
    sent = _backfill(instance, due, due + 4 * MIN)
    # A dry run lists what the run runs: not slot 0, which the node answers UNCHANGED.
    assert [(s.timer_id, s.slot, code) for s, code in sent] == [
        (timer, 1, ResultCode.COMMITTED),
        (timer, 2, ResultCode.COMMITTED),
    ]
    assert _dues(recorder) == [due, due + 2 * MIN, due + 4 * MIN]


def _ran_100_to_102(recorder: Recorder) -> tuple[Job, Instance]:
    """An instance ticking every minute that ran slots 100 to 102."""
    job, instance = _enabled(recorder, IntervalRule(start=0, every=MIN))
    for slot in range(100, 103):
        assert instance.tick(slot, due_at=slot * MIN).code is ResultCode.COMMITTED
    return job, instance


def test_a_one_off_rule_dated_before_the_last_run_runs_once() -> None:
    # A reschedule to a one-off at an instant before the last slot run is the operator's
    # explicit run: the guard against a slot running twice across a change is not for it.
    recorder = Recorder()
    job, instance = _ran_100_to_102(recorder)
    at = 102 * MIN - 30_000
    decision = instance.run(
        reschedule_command(CONTEXT, job, {"kind": "once", "at": at}), now=102 * MIN + 20_000
    )
    assert decision.code is ResultCode.COMMITTED
    assert instance.state is not None and instance.state.timer_after is None
    assert instance.tick(0, due_at=at).code is ResultCode.COMMITTED
    assert [run.due_at for run in recorder.runs][-1] == at
    # Nor does a backfill leave it out.
    (timer,) = [t for t in tick_timers(instance.log) if t.id == instance.state.timer_id]
    assert timer.after is None


# --- a one-off rule set again ------------------------------------------------------------


def _once_instance(recorder: Recorder, default: OnceRule | CronRule) -> tuple[Job, Instance]:
    job = Job("nightly", JobScope.SYSTEM, default, recorder)
    return job, Instance(schedule_aggregate(CONTEXT, [job], 8))


def _enabled_once_at(recorder: Recorder, at: int, override: bool) -> tuple[Job, Instance]:
    """An instance enabled to run once at `at`: by its override over a cron default, or
    by its one-off default."""
    default = CronRule(expr="0 3 * * *") if override else OnceRule(at=at)
    job, instance = _once_instance(recorder, default)
    rule = {"kind": "once", "at": at} if override else None
    assert instance.run(enable_command(CONTEXT, job, rule=rule)).code is ResultCode.COMMITTED
    return job, instance


@pytest.mark.parametrize("override", [True, False])
def test_a_one_off_slot_runs_once_across_a_disable_and_enable(override: bool) -> None:
    # The Enable with no rule sets the same one-off again (the kept override, or a one-off
    # default): no new instruction of the operator, and its instant ran.
    at = 2_000_000
    recorder = Recorder()
    job, instance = _enabled_once_at(recorder, at, override)
    assert instance.tick(0).code is ResultCode.COMMITTED
    assert instance.run(disable_command(CONTEXT, job)).code is ResultCode.COMMITTED
    assert instance.run(enable_command(CONTEXT, job)).code is ResultCode.COMMITTED
    assert instance.state.rule == OnceRule(at=at).model_dump(mode="json")
    assert instance.tick(0).code is ResultCode.UNCHANGED
    assert _dues(recorder) == [at]
    # Nor does a backfill run it again: it plans the slot of the timer that ran it alone.
    current = instance.state.timer_id
    sent = _backfill(instance, 0, instance.now)
    assert [(s.timer_id != current, s.due_at, code) for s, code in sent] == [
        (True, at, ResultCode.DUPLICATE)
    ]
    assert _dues(recorder) == [at]


@pytest.mark.parametrize("override", [True, False])
def test_a_one_off_slot_a_backfill_ran_runs_once_across_a_disable_and_enable(
    override: bool,
) -> None:
    # Backfilled before its tick came, the slot ran under its tick's request id: the live
    # tick is its DUPLICATE (no Ticked), so only the backfill tells that the instant ran.
    at = 2_000_000
    recorder = Recorder()
    job, instance = _enabled_once_at(recorder, at, override)
    (slot,) = backfill_slots(tick_timers(instance.log), 0, at)
    ref = instance.log[-1].aggregate
    assert instance.run(backfill_command(ref, slot), now=at + 5).code is ResultCode.COMMITTED
    assert _dues(recorder) == [at]
    assert instance.tick(0).code is ResultCode.DUPLICATE
    assert instance.run(disable_command(CONTEXT, job)).code is ResultCode.COMMITTED
    assert instance.run(enable_command(CONTEXT, job)).code is ResultCode.COMMITTED
    assert instance.tick(0).code is ResultCode.UNCHANGED
    assert _dues(recorder) == [at]
    # Nor does a backfill plan it under the new timer.
    assert [s.timer_id for s, _ in _backfill(instance, 0, instance.now)] == [slot.timer_id]
    assert _dues(recorder) == [at]


def test_an_enabled_one_offs_override_spelled_anew_sets_no_timer_and_is_no_refusal() -> None:
    # Past `expires_after` since its instant ran, the same rule given as an override sets
    # no timer (the rule it ticks by is unchanged): nothing would expire unsent.
    at = 2_000_000
    recorder = Recorder()
    job, instance = _once_instance(recorder, OnceRule(at=at))
    assert instance.run(enable_command(CONTEXT, job)).code is ResultCode.COMMITTED
    timer = instance.state.timer_id
    assert instance.tick(0).code is ResultCode.COMMITTED
    later = at + 2 * 24 * 3_600_000
    once = {"kind": "once", "at": at}
    d = instance.run(enable_command(CONTEXT, job, rule=once), now=later)
    assert d.code is ResultCode.COMMITTED
    assert instance.state.timer_id == timer and instance.state.override == once
    assert _dues(recorder) == [at]


def test_a_one_off_disabled_before_its_instant_ran_runs_when_enabled_again() -> None:
    # An explicit run at an instant before the last slot run, paused before it ran: the
    # same one-off set again is still the operator's run, not yet made.
    recorder = Recorder()
    job, instance = _ran_100_to_102(recorder)
    at = 102 * MIN - 30_000
    once = {"kind": "once", "at": at}
    instance.run(reschedule_command(CONTEXT, job, once), now=102 * MIN + 20_000)
    assert instance.run(disable_command(CONTEXT, job)).code is ResultCode.COMMITTED
    assert instance.run(enable_command(CONTEXT, job)).code is ResultCode.COMMITTED
    assert instance.tick(0, due_at=at).code is ResultCode.COMMITTED
    assert _dues(recorder) == [100 * MIN, 101 * MIN, 102 * MIN, at]


@given(
    at=st.integers(0, 10**6),
    last=st.none() | st.integers(0, 10**6),
    same=st.booleans(),
)
def test_a_timers_floor_is_none_only_for_a_new_or_unrun_one_off(
    at: int, last: int | None, same: bool
) -> None:
    once = OnceRule(at=at).model_dump(mode="json")
    previous = once if same else OnceRule(at=at + 1).model_dump(mode="json")
    every = IntervalRule(start=0, every=MIN).model_dump(mode="json")
    assert timer_floor(every, previous, last) == last
    floor = timer_floor(once, previous, last)
    assert floor == (at if same and last == at else None)
