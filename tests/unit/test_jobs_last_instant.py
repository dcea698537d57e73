"""A job's rule whose next slot is past the last instant a timer holds (`MAX_INSTANT`,
9999-12-31T23:59:59.999Z): year 9999 of a cron rule west of UTC ends after it. Taken,
its tick timer's `wow.ScheduleSet` was dead-lettered by the subscription: the instance
said enabled and never ticked. It is refused as a rule that has ended is."""

from __future__ import annotations

from datetime import UTC, datetime

from test_jobs import CONTEXT, Instance, Recorder

from app.jobs import Job, JobScope, enable_command, reschedule_command, schedule_aggregate
from app.protocol.wire import ResultCode
from tables import CronRule
from tables.bounds import MAX_INSTANT

NEW_YEARS_EVE = int(datetime(9999, 12, 31, tzinfo=UTC).timestamp() * 1000)
LOS_ANGELES_23H = {"expr": "0 23 31 12 *", "zone": "America/Los_Angeles"}


def test_a_rule_whose_first_slot_is_past_the_last_instant_is_refused() -> None:
    recorder = Recorder()
    job = Job("yearly", JobScope.SYSTEM, CronRule(expr="0 3 * * *"), recorder)
    instance = Instance(schedule_aggregate(CONTEXT, [job], 8))
    d = instance.run(enable_command(CONTEXT, job, rule={**LOS_ANGELES_23H, "start": NEW_YEARS_EVE}))
    assert d.code is ResultCode.SCHEDULE_JOB_INVALID
    assert str(MAX_INSTANT) in d.message and "no slot left" in d.message
    assert instance.run(enable_command(CONTEXT, job)).code is ResultCode.COMMITTED
    timer = instance.state.timer_id
    d = instance.run(reschedule_command(CONTEXT, job, {**LOS_ANGELES_23H, "start": NEW_YEARS_EVE}))
    assert d.code is ResultCode.SCHEDULE_JOB_INVALID
    assert instance.state.timer_id == timer
