"""A tick's handler commands count against the records its decision may make.

The handler decides into a scratch decision, checked alone: 10,000 sends made a tick of
10,001 records, past what a transaction may hold; 9,999 filled it, and a tick taking a
new default then failed on its `Rescheduled` (`DecisionTooLarge`), answered ERROR every
tick, the instance stuck on its old rule. Now a slot whose commands do not fit beside the
tick's own records fails as a handler does: its `run:` timer runs it again, in a decision
of its own, and the tick's other records commit."""

from __future__ import annotations

from test_jobs import CONTEXT, TARGET, Instance, types
from test_jobs_failures import run_command

from app.jobs import (
    RAN,
    RESCHEDULED,
    RUN_FAILED,
    TICKED,
    Job,
    JobRun,
    JobScope,
    enable_command,
    schedule_aggregate,
)
from app.model.aggregate import MAX_DECISION_RECORDS
from app.protocol.wire import SCHEDULE_SET, ResultCode
from tables import CronRule

HOURLY = CronRule(expr="0 * * * *")


def _busy(sends: int, rule: CronRule = HOURLY) -> Job:
    def handler(run: JobRun) -> None:
        for n in range(sends):
            run.send(TARGET, "shop.Ping", {"n": n})

    return Job("busy", JobScope.SYSTEM, rule, handler)


def _enabled(job: Job) -> Instance:
    instance = Instance(schedule_aggregate(CONTEXT, [job], 8))
    assert instance.run(enable_command(CONTEXT, job)).code is ResultCode.COMMITTED
    return instance


def test_a_tick_taking_a_new_default_beside_a_full_handler_commits_the_new_rule() -> None:
    instance = _enabled(_busy(MAX_DECISION_RECORDS - 1))
    at_half_past = _busy(MAX_DECISION_RECORDS - 1, CronRule(expr="30 * * * *"))
    instance.agg = schedule_aggregate(CONTEXT, [at_half_past], 8)
    d = instance.tick(0)
    assert d.code is ResultCode.COMMITTED, d.message
    assert types(d) == [TICKED, RUN_FAILED, SCHEDULE_SET, RESCHEDULED, SCHEDULE_SET]
    assert d.commands == []
    assert "sent 9999 commands on slot 0" in d.events[1].body["error"]
    assert instance.state.rule is not None and instance.state.rule["expr"] == "30 * * * *"
    # Its run timer runs the slot alone: every command fits there.
    d = instance.run(run_command(d.events[2], instance.now + 1))
    assert d.code is ResultCode.COMMITTED, d.message
    assert types(d) == [RAN]
    assert len(d.commands) == MAX_DECISION_RECORDS - 1


def test_a_tick_whose_handler_sends_past_the_bound_commits_no_more_than_it() -> None:
    instance = _enabled(_busy(MAX_DECISION_RECORDS))
    d = instance.tick(0)
    assert d.code is ResultCode.COMMITTED, d.message
    assert types(d) == [TICKED, RUN_FAILED, SCHEDULE_SET]
    assert len(d.events) + len(d.commands) <= MAX_DECISION_RECORDS


def test_a_tick_whose_handler_fills_its_decision_commits_every_command() -> None:
    instance = _enabled(_busy(MAX_DECISION_RECORDS - 1))
    d = instance.tick(0)
    assert types(d) == [TICKED]
    assert len(d.commands) == MAX_DECISION_RECORDS - 1
