"""A tick that takes a job's new default runs first what the old timer owes.

The tick replaces the instance's tick timer, which would send none of the slots it owes
(due, not run: a node that was down, its timer catching up) once replaced. Before the fix
they were dropped without a word; now the tick runs them as a Reschedule does, a
coalescing rule's latest due alone."""

from __future__ import annotations

from test_jobs import CONTEXT, Instance, Recorder, tick_command, types

from app.jobs import (
    RESCHEDULED,
    RUN_FAILED,
    TICKED,
    Job,
    JobRun,
    JobScope,
    enable_command,
    schedule_aggregate,
)
from app.model.user_code import UserCodeTimeout
from app.protocol.wire import SCHEDULE_SET, ResultCode
from tables import IntervalRule

MIN = 60_000


def _behind(coalesce: bool) -> tuple[Recorder, Instance, str]:
    """An instance of a job every 5 minutes, enabled at minute 10, whose node was down
    until minute 70; the release it comes back with runs the job every 10 minutes."""
    recorder = Recorder()
    every_5 = IntervalRule(start=0, every=5 * MIN, coalesce=coalesce)
    job = Job("sweep", JobScope.SYSTEM, every_5, recorder)
    instance = Instance(schedule_aggregate(CONTEXT, [job], 8))
    instance.run(enable_command(CONTEXT, job), now=10 * MIN)
    timer = instance.state.timer_id
    assert timer is not None
    every_10 = every_5.model_copy(update={"every": 10 * MIN})
    instance.agg = schedule_aggregate(
        CONTEXT, [Job("sweep", JobScope.SYSTEM, every_10, recorder)], 8
    )
    return recorder, instance, timer


def test_a_tick_taking_a_new_default_runs_every_slot_a_rule_that_does_not_coalesce_owes() -> None:
    recorder, instance, old = _behind(coalesce=False)
    ref = instance.log[-1].aggregate
    # The old timer's first slot (2, due at minute 10), sent at minute 70.
    d = instance.run(tick_command(ref, old, 2, 10 * MIN), now=70 * MIN)
    assert d.code is ResultCode.COMMITTED, d.message
    assert types(d) == [TICKED] * 13 + [RESCHEDULED, SCHEDULE_SET]
    assert [(r.slot, r.due_at // MIN) for r in recorder.runs] == [(n, 5 * n) for n in range(2, 15)]
    # The old timer's sends of them, in flight, find the new timer; the new timer's first
    # slot, due at minute 70, ran under the old one.
    assert instance.run(tick_command(ref, old, 3, 15 * MIN)).code is ResultCode.UNCHANGED
    assert instance.tick(7).code is ResultCode.UNCHANGED
    assert instance.tick(8).code is ResultCode.COMMITTED
    assert [r.due_at // MIN for r in recorder.runs][-2:] == [70, 80]


def test_a_tick_taking_a_new_default_runs_the_latest_slot_a_coalescing_rule_owes() -> None:
    recorder, instance, old = _behind(coalesce=True)
    ref = instance.log[-1].aggregate
    d = instance.run(tick_command(ref, old, 2, 10 * MIN), now=72 * MIN)
    assert types(d) == [TICKED, TICKED, RESCHEDULED, SCHEDULE_SET]
    assert [(r.slot, r.due_at // MIN) for r in recorder.runs] == [(2, 10), (14, 70)]


def test_a_tick_whose_handler_the_timeout_interrupted_takes_the_new_default_next_time() -> None:
    """The owed slots' handlers would be interrupted too: the old timer ticks on, sending
    them, and its next tick takes the new default."""
    recorder, instance, old = _behind(coalesce=False)
    ran: list[int] = []

    def slow(run: JobRun) -> None:
        ran.append(run.slot)
        if run.slot == 2:
            raise UserCodeTimeout("the handler of job sweep", 5.1, 5.0)

    every_10 = IntervalRule(start=0, every=10 * MIN, coalesce=False)
    instance.agg = schedule_aggregate(CONTEXT, [Job("sweep", JobScope.SYSTEM, every_10, slow)], 8)
    ref = instance.log[-1].aggregate
    d = instance.run(tick_command(ref, old, 2, 10 * MIN), now=70 * MIN)
    assert types(d) == [TICKED, RUN_FAILED, SCHEDULE_SET]
    assert instance.state.timer_id == old
    d = instance.run(tick_command(ref, old, 3, 15 * MIN), now=70 * MIN + 1)
    assert types(d) == [TICKED] * 12 + [RESCHEDULED, SCHEDULE_SET]
    assert ran == list(range(2, 15))
    assert recorder.runs == []
