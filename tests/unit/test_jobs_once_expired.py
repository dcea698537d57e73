"""A job's once rule whose instant is past the timers' `expires_after` is refused.

Its tick timer would expire its only slot unsent (`app.timers.runner.decisions`): the
instance would look enabled and never run. An Enable or Reschedule to such a rule is
refused `SCHEDULE_JOB_INVALID`, as one to a rule with no slot left is, and a changed
default that is one is not taken; the clients refuse a once `at` in epoch seconds before
sending anything (`app.clients.book_commands.seconds_reason`), as `timers set` does."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_jobs import CONTEXT, Instance, Recorder, types
from typer.testing import CliRunner

from app.cli import cli
from app.cli.job_actions import parse_rule_option
from app.errors import JobsCliError
from app.jobs import (
    DEFAULT_EXPIRES_AFTER_MS,
    TICKED,
    Job,
    JobScope,
    disable_command,
    enable_command,
    reschedule_command,
    schedule_aggregate,
)
from app.jobs.runs import no_slot_left
from app.protocol.wire import ResultCode
from app.service import Service
from app.timers.runner.options import TimerOptions
from tables import CronRule, IntervalRule, OnceRule

HOUR = 3_600_000
DAY = 24 * HOUR
NOW = 1_800_000_000_000
SECONDS = 1_733_400_000  # 2024-12-05 in epoch seconds


def _instance(expires_after_ms: int | None = None) -> tuple[Job, Instance, Recorder]:
    recorder = Recorder()
    job = Job("nightly", JobScope.SYSTEM, CronRule(expr="0 3 * * *"), recorder)
    instance = Instance(
        schedule_aggregate(CONTEXT, [job], 8)
        if expires_after_ms is None
        else schedule_aggregate(CONTEXT, [job], 8, expires_after_ms=expires_after_ms)
    )
    instance.now = NOW
    return job, instance, recorder


def test_the_default_is_the_timers_default() -> None:
    assert TimerOptions().expires_after == DEFAULT_EXPIRES_AFTER_MS


@pytest.mark.parametrize("how", ["enable", "reschedule"])
def test_a_once_rule_past_expires_after_is_refused(how: str) -> None:
    job, instance, _ = _instance()
    once = {"kind": "once", "at": NOW - DAY - 10}
    if how == "reschedule":
        assert instance.run(enable_command(CONTEXT, job)).code is ResultCode.COMMITTED
        d = instance.run(reschedule_command(CONTEXT, job, once))
    else:
        d = instance.run(enable_command(CONTEXT, job, rule=once))
    assert d.code is ResultCode.SCHEDULE_JOB_INVALID, d
    assert "expires_after (86400000 ms)" in d.message and "expire it unsent" in d.message
    assert instance.stored is None or types(d) == []


def test_a_once_rule_past_but_not_expired_is_run() -> None:
    job, instance, recorder = _instance()
    at = NOW - DAY + HOUR
    d = instance.run(enable_command(CONTEXT, job, rule={"kind": "once", "at": at}))
    assert d.code is ResultCode.COMMITTED, d
    assert instance.tick(0).code is ResultCode.COMMITTED
    assert [r.due_at for r in recorder.runs] == [at]


def test_the_models_expires_after_is_its_nodes() -> None:
    job, instance, _ = _instance(expires_after_ms=HOUR)
    late = {"kind": "once", "at": NOW - 2 * HOUR}
    assert instance.run(enable_command(CONTEXT, job, rule=late)).code is (
        ResultCode.SCHEDULE_JOB_INVALID
    )
    (schedule,) = Service(aggregates=(), jobs={CONTEXT: (job,)}).all_aggregates(
        8, expires_after_ms=HOUR
    )
    instance.agg = schedule
    assert instance.run(enable_command(CONTEXT, job, rule=late)).code is (
        ResultCode.SCHEDULE_JOB_INVALID
    )
    with pytest.raises(ValueError, match="expires_after_ms must be at least 1"):
        schedule_aggregate(CONTEXT, [job], 8, expires_after_ms=0)


def test_an_enable_of_a_kept_once_override_long_past_is_refused() -> None:
    job, instance, _ = _instance()
    at = NOW + HOUR
    assert instance.run(enable_command(CONTEXT, job, rule={"kind": "once", "at": at})).code is (
        ResultCode.COMMITTED
    )
    assert instance.run(disable_command(CONTEXT, job)).code is ResultCode.COMMITTED
    d = instance.run(enable_command(CONTEXT, job), now=at + DAY + 1)
    assert d.code is ResultCode.SCHEDULE_JOB_INVALID, d
    assert not instance.state.enabled


def test_a_changed_default_once_long_past_is_not_taken() -> None:
    recorder = Recorder()
    every = IntervalRule(start=0, every=60_000)
    job = Job("nightly", JobScope.SYSTEM, every, recorder)
    instance = Instance(schedule_aggregate(CONTEXT, [job], 8))
    instance.now = NOW
    assert instance.run(enable_command(CONTEXT, job)).code is ResultCode.COMMITTED
    old = instance.state.timer_id
    moved = Job("nightly", JobScope.SYSTEM, OnceRule(at=NOW - 2 * DAY), recorder)
    instance.agg = schedule_aggregate(CONTEXT, [moved], 8)
    d = instance.tick(NOW // 60_000)
    assert types(d) == [TICKED]  # ticks on by its old rule
    assert instance.state.timer_id == old


@given(at=st.integers(0, 4 * DAY), expires=st.integers(1, 2 * DAY))
def test_a_once_rule_has_no_slot_left_when_its_instant_expired(at: int, expires: int) -> None:
    now = 3 * DAY
    why = no_slot_left(OnceRule(at=at), now, expires)
    assert (why is not None) == (at < now - expires)
    # A recurring rule is the timers' to catch up: only its end counts.
    assert no_slot_left(IntervalRule(start=at, every=60_000), now, expires) is None


# --- the clients: a once `at` in epoch seconds ---------------------------------------------


def test_a_once_rule_in_epoch_seconds_is_refused_by_the_cli_option() -> None:
    job, _, _ = _instance()
    with pytest.raises(JobsCliError, match=re.escape(f"give {SECONDS * 1000}")) as caught:
        parse_rule_option(f'{{"kind": "once", "at": {SECONDS}}}', job)
    assert "looks like seconds" in str(caught.value)
    at = SECONDS * 1000
    assert parse_rule_option(f'{{"kind": "once", "at": {at}}}', job) == {"kind": "once", "at": at}


def test_a_once_rule_in_epoch_seconds_exits_2() -> None:
    rule = f'{{"kind": "once", "at": {SECONDS}}}'
    args = ["jobs", "enable", "--service", "app.demo:service", "--context", "shop"]
    args += ["--job", "unpaid-report", "--rule", rule, "--bootstrap", "127.0.0.1:1"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ") and "looks like seconds" in line, line
