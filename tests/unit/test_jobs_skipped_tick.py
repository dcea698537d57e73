"""An instance whose parked tick timer an operator skipped is set going again by a Disable,
then an Enable; an Enable alone answers UNCHANGED saying so.

`timers skip --type <context>.schedule --target-id <instance>` skips the instance's parked
timers, its `tick` timer among them when its ticks failed: its schedule ends, while its
state still says enabled. An Enable then changed nothing (UNCHANGED, no word why): nothing
ticked again and nothing said why. The Enable still sets no timer (it cannot tell a
skipped timer from a live one, which a new timer would replace, nor run the slot the skip
dropped), but its answer says what to do, and doing it ticks the job again."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from fakes import MIN, T0, FakeClock, RunningNode, running, wait_until
from test_jobs import CONTEXT as OPS
from test_jobs import Instance, Recorder, make_jobs
from test_jobs_backfill_memory import CONTEXT, PARTITIONS, REPORTS, SCHEDULE, _send, _types
from test_jobs_backfill_memory import JOB as HOURLY
from test_jobs_backfill_memory import SERVICE as HOURLY_SERVICE
from test_jobs_sent_size import _timers

from app.errors import BadRecord
from app.jobs import TICKED, disable_command, enable_command, ref_of, schedule_aggregate
from app.jobs.slot_runs import SlotRuns
from app.kafka.memory import MemoryLog
from app.protocol.topics import ContextTopics
from app.protocol.wire import SCHEDULE_SET, CommandResult, ResultCode, TimerAction, decode
from app.timers.operator import new_op, op_records
from app.timers.runner.options import RetryPolicy, TimerOptions
from tables import TimerStatus

SKIPPED_HOW = "disable it, then enable it"


def test_an_enable_of_an_enabled_instance_is_unchanged_and_says_how_to_tick_it_again() -> None:
    nightly, _, report = make_jobs(Recorder())
    instance = Instance(schedule_aggregate(OPS, [nightly, report], 8))
    assert instance.run(enable_command(OPS, nightly)).code is ResultCode.COMMITTED
    d = instance.run(enable_command(OPS, nightly))
    assert (d.code, d.events) == (ResultCode.UNCHANGED, [])
    assert SKIPPED_HOW in d.message
    assert "timers skip --type ops.schedule --target-id nightly)" in d.message
    # A TENANT job's instance is named with its tenant.
    assert instance.run(enable_command(OPS, report, tenant="acme")).code is ResultCode.COMMITTED
    d = instance.run(enable_command(OPS, report, tenant="acme"))
    assert "--target-id report --tenant acme)" in d.message
    # A tenant a shell would split is quoted: the line pastes as it is (the `Instance` is
    # one state: enabled already, as the one of `acme`).
    d = instance.run(enable_command(OPS, report, tenant="acme corp"))
    assert "--target-id report --tenant 'acme corp')" in d.message
    # A Disable, then an Enable, sets its tick timer again.
    assert instance.run(disable_command(OPS, report, tenant="acme")).code is ResultCode.COMMITTED
    d = instance.run(enable_command(OPS, report, tenant="acme"))
    assert SCHEDULE_SET in [e.type for e in d.events]


def _result(log: MemoryLog, request_id: str) -> CommandResult | None:
    topic = ContextTopics(CONTEXT).results
    for p in range(PARTITIONS):
        for r in log.records(topic, p):
            with contextlib.suppress(BadRecord):  # the timer-op answers share the topic
                if (result := decode(CommandResult, r.value)).request_id == request_id:
                    return result
    return None


async def test_a_skipped_tick_timer_ticks_again_after_a_disable_and_an_enable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing = True
    run_slot = SlotRuns._run_slot

    def tick_fails(self: SlotRuns, *args: object, **kwargs: object) -> bool:
        # A tick that fails whole (answered ERROR), as a fault of the node's would.
        if failing:
            raise RuntimeError("the tick fails")
        return run_slot(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(SlotRuns, "_run_slot", tick_fails)
    retry = RetryPolicy(initial_backoff_ms=100, max_backoff_ms=100, max_attempts=2)
    options = TimerOptions(retry=retry)
    log, clock = MemoryLog(), FakeClock(T0 - 30_000)
    node = RunningNode(
        log, tmp_path, "n", HOURLY_SERVICE, PARTITIONS, clock=clock, timers=options, options=options
    )
    async with running(node, within=10):

        async def answered(command_id: str) -> CommandResult:
            await wait_until(lambda: _result(log, command_id) is not None)
            found = _result(log, command_id)
            assert found is not None
            return found

        await _send(log, [enable_command(CONTEXT, HOURLY, now=clock.now(), request_id="on")])
        await wait_until(lambda: bool(_types(log, SCHEDULE.events, SCHEDULE_SET)))
        clock.set(T0)  # slot 0 is due: its tick fails, is retried, and parks

        def parked() -> bool:
            clock.advance(200)
            return any(t.key == "tick" and t.status is TimerStatus.PARKED for t in _timers(log))

        await wait_until(parked, what=lambda: f"timers: {_timers(log)}")
        skip = new_op(TimerAction.SKIP, ref_of(CONTEXT, HOURLY), now=clock.now())
        await log.publisher().send_many(op_records(SCHEDULE.timer_ops, skip, PARTITIONS))
        await wait_until(
            lambda: [t.status for t in _timers(log) if t.key == "tick"] == [TimerStatus.CANCELLED]
        )
        failing = False
        # Enabled already, as its state says: UNCHANGED, saying what to do.
        await _send(log, [enable_command(CONTEXT, HOURLY, now=clock.now(), request_id="again")])
        result = await answered("again")
        assert result.code is ResultCode.UNCHANGED
        assert SKIPPED_HOW in result.reason
        # Done: its next slot ticks, the skipped one is not run.
        await _send(log, [disable_command(CONTEXT, HOURLY, now=clock.now(), request_id="off")])
        assert (await answered("off")).code is ResultCode.COMMITTED
        await _send(log, [enable_command(CONTEXT, HOURLY, now=clock.now(), request_id="on-2")])
        assert (await answered("on-2")).code is ResultCode.COMMITTED
        clock.set(T0 + MIN)
        await wait_until(lambda: bool(_types(log, SCHEDULE.events, TICKED)))
        await wait_until(lambda: bool(_types(log, REPORTS.events, "Ran")))
        assert [e.body["slot"] for e in _types(log, REPORTS.events, "Ran")] == [1]
