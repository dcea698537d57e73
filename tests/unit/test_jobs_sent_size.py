"""A job's command over the node's record bound fails its slot alone.

The slot run checked a handler's commands only for how many; their size was the
processor's to check (`check_sizes`), which refused the whole tick: no `wow.Ticked`, no
`RunFailed`, no `run:` timer. The tick timer was retried, then parked, and no later slot
was ever sent, while the node said it was healthy. Now the node gives the schedule its
processor's check (`app.commands.sent_sizes`): a slot sending such a command fails as its
handler would have (`RunFailed`, a `run:` timer that runs it again, then parks), and the
instance ticks on."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from fakes import MIN, T0, FakeClock, RunningNode, running, wait_until
from test_jobs import TARGET, Instance, types
from test_jobs_backfill_memory import CONTEXT, PARTITIONS, REPORTS, SCHEDULE, _send, _types, report
from test_jobs_backfill_memory import TARGET as REPORT

from app.commands.sent_sizes import sent_too_large
from app.jobs import (
    RESCHEDULED,
    RUN_FAILED,
    TICKED,
    Job,
    JobRun,
    JobScope,
    enable_command,
    reschedule_command,
    schedule_aggregate,
)
from app.kafka.memory import MemoryLog
from app.protocol.limits import DEFAULT_MAX_RECORD_BYTES, InputLimits
from app.protocol.wire import SCHEDULE_SET, ResultCode
from app.service import Service
from app.timers.runner.options import RetryPolicy, TimerOptions
from tables import IntervalRule, TimerStatus
from tables.timer import Timer

BIG = "x" * (DEFAULT_MAX_RECORD_BYTES + 1)
CHECK = partial(sent_too_large, limits=InputLimits())


def _big_on_slot_0(run: JobRun) -> None:
    # Data-dependent: slot 0's report is too large to write, the others are small.
    run.send(REPORT, "Run", {"slot": run.slot, "text": BIG if run.slot == 0 else "ok"})


def _timers(log: MemoryLog) -> list[Timer]:
    latest: dict[bytes | None, bytes | None] = {}
    for p in range(PARTITIONS):
        for r in log.records(SCHEDULE.timers_changelog, p):
            latest[r.key] = r.value
    return [Timer.model_validate_json(v) for v in latest.values() if v is not None]


async def test_a_slot_sending_a_command_over_the_bound_fails_alone_and_the_job_ticks_on(
    tmp_path: Path,
) -> None:
    job = Job("hourly", JobScope.SYSTEM, IntervalRule(start=T0, every=MIN), _big_on_slot_0)
    service = Service(aggregates=(report,), jobs={CONTEXT: (job,)})
    retry = RetryPolicy(initial_backoff_ms=100, max_backoff_ms=100, max_attempts=2)
    options = TimerOptions(retry=retry)
    log, clock = MemoryLog(), FakeClock(T0 - 30_000)
    node = RunningNode(
        log, tmp_path, "n", service, PARTITIONS, clock=clock, timers=options, options=options
    )
    async with running(node, within=10):
        await _send(log, [enable_command(CONTEXT, job, now=clock.now())])
        await wait_until(lambda: bool(_types(log, SCHEDULE.events, SCHEDULE_SET)))
        clock.set(T0)  # slot 0 is due: its command is too large to write

        def tick_parked() -> bool:
            return any(t.key == "tick" and t.status is TimerStatus.PARKED for t in _timers(log))

        def run_failed() -> bool:
            # Before the fix the tick itself failed, was retried and parked: said at once.
            assert not tick_parked(), f"the tick timer parked: {_timers(log)}"
            clock.advance(200)  # past each retry's backoff
            return bool(_types(log, SCHEDULE.events, RUN_FAILED))

        await wait_until(run_failed, what=lambda: f"timers: {_timers(log)}")
        (failed,) = _types(log, SCHEDULE.events, RUN_FAILED)
        assert failed.body["slot"] == 0
        assert "TICKWHEEL_MAX_RECORD_BYTES" in failed.body["error"]
        assert [e.body["slot"] for e in _types(log, SCHEDULE.events, TICKED)] == [0]

        def run_timer_parked() -> bool:
            clock.advance(200)
            return any(
                t.key.startswith("run:") and t.status is TimerStatus.PARKED for t in _timers(log)
            )

        # The slot's run: timer fails again (the processor refuses its Run's command)...
        await wait_until(run_timer_parked, what=lambda: f"timers: {_timers(log)}")
        # ...while the tick timer goes on: slot 1 ticks and its report is written.
        clock.set(T0 + MIN)
        await wait_until(lambda: len(_types(log, SCHEDULE.events, TICKED)) == 2)
        await wait_until(lambda: bool(_types(log, REPORTS.events, "Ran")))
        assert [e.body["slot"] for e in _types(log, REPORTS.events, "Ran")] == [1]
        assert not tick_parked()


# --- the aggregate alone -----------------------------------------------------------------


def _big(run: JobRun) -> None:
    run.send(TARGET, "shop.Report", {"rows": BIG})


def test_a_tick_whose_command_is_over_the_bound_commits_its_ticked_and_a_run_timer() -> None:
    job = Job("report", JobScope.SYSTEM, IntervalRule(start=0, every=60_000), _big)
    instance = Instance(schedule_aggregate("ops", [job], 8, sent_check=CHECK))
    assert instance.run(enable_command("ops", job)).code is ResultCode.COMMITTED
    d = instance.tick(17)
    assert d.code is ResultCode.COMMITTED, d.message
    assert types(d) == [TICKED, RUN_FAILED, SCHEDULE_SET]
    assert d.commands == []
    assert "TICKWHEEL_MAX_RECORD_BYTES" in d.events[1].body["error"]
    assert instance.state.last_slot == 17


def test_a_slot_owed_on_a_new_rule_whose_command_is_over_the_bound_fails_alone() -> None:
    """A slot the old timer owes is run by the change itself: its command too large
    failed the whole Reschedule (or a tick taking a new default, every tick)."""
    job = Job("report", JobScope.SYSTEM, IntervalRule(start=0, every=60_000), _big)
    instance = Instance(schedule_aggregate("ops", [job], 8, sent_check=CHECK))
    assert instance.run(enable_command("ops", job)).code is ResultCode.COMMITTED
    assert instance.tick(17).code is ResultCode.COMMITTED
    # Slot 18 is due and its tick not decided yet when the reschedule lands.
    change = reschedule_command("ops", job, {"every": 120_000})
    d = instance.run(change, now=instance.due_at(18) + 5)
    assert d.code is ResultCode.COMMITTED, d.message
    assert types(d) == [TICKED, RUN_FAILED, SCHEDULE_SET, RESCHEDULED, SCHEDULE_SET]
    assert d.events[0].body["slot"] == 18
    assert d.commands == []


def test_commands_within_the_bound_are_sent_with_the_slot() -> None:
    def small(run: JobRun) -> None:
        run.send(TARGET, "shop.Report", {"rows": "x" * 1_000})

    job = Job("report", JobScope.SYSTEM, IntervalRule(start=0, every=60_000), small)
    instance = Instance(schedule_aggregate("ops", [job], 8, sent_check=CHECK))
    assert instance.run(enable_command("ops", job)).code is ResultCode.COMMITTED
    d = instance.tick(17)
    assert types(d) == [TICKED]
    assert len(d.commands) == 1
