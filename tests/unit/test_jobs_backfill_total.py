"""A backfill's slots over all its instances are bounded (`MAX_BACKFILL_TOTAL_SLOTS`): a
range of one instance's limit times 1,000 tenants or 1,024 shards held ~15 GB of commands
in the worker, on a dry run too. The plan is refused once its instances pass the bound,
before the rest are read."""

from __future__ import annotations

import asyncio

import pytest

from app.jobs import (
    MAX_BACKFILL_SLOTS,
    MAX_BACKFILL_TOTAL_SLOTS,
    Job,
    JobRun,
    JobScope,
    enable_command,
    schedule_aggregate,
)
from app.model.decide import decide
from app.ops.job_api import JobInputError, cli_option, plan_backfill
from app.protocol.wire import EventEnvelope, ResultCode
from tables import AggregateRef, IntervalRule

CONTEXT = "ops"
SEC = 1_000
T0 = 1_800_000_000_000
DAY = 86_400_000


def handler(run: JobRun) -> None:
    pass


JOB = Job("report", JobScope.TENANT, IntervalRule(start=0, every=SEC), handler)


def enabled_log(tenant: str) -> tuple[AggregateRef, list[EventEnvelope]]:
    agg = schedule_aggregate(CONTEXT, [JOB], 1)
    d = decide(agg, None, enable_command(CONTEXT, JOB, tenant=tenant, now=T0), now=T0, seen=False)
    assert d.code is ResultCode.COMMITTED
    return d.events[0].aggregate, list(d.events)


def test_a_backfill_of_too_many_slots_over_its_instances_is_refused_before_reading_the_rest() -> (
    None
):
    per = 9_000  # under one instance's limit; 3 instances pass the total
    assert per < MAX_BACKFILL_SLOTS and 2 * per <= MAX_BACKFILL_TOTAL_SLOTS < 3 * per
    logs = dict(enabled_log(f"t{i}") for i in range(4))
    asked: list[AggregateRef] = []

    async def events_of(ref: AggregateRef) -> list[EventEnvelope]:
        asked.append(ref)
        return logs[ref]

    plan = plan_backfill(
        events_of,
        list(logs),
        T0 + SEC,
        T0 + per * SEC,
        now=T0 + DAY,
        window_ms=7 * DAY,
        limit=MAX_BACKFILL_SLOTS,
        spell=cli_option,
    )
    with pytest.raises(JobInputError) as refused:
        asyncio.run(plan)
    assert refused.value.field == "until"
    message = str(refused.value)
    assert f"more than {MAX_BACKFILL_TOTAL_SLOTS} slots over its instances" in message
    assert "(--from, --until)" in message and "(--tenant, --partition)" in message
    assert asked == list(logs)[:3], "the fourth instance's log is not read"


def test_a_backfill_within_the_total_plans_every_instances_slots() -> None:
    logs = dict(enabled_log(f"t{i}") for i in range(3))

    async def events_of(ref: AggregateRef) -> list[EventEnvelope]:
        return logs[ref]

    planned = asyncio.run(
        plan_backfill(
            events_of,
            list(logs),
            T0 + SEC,
            T0 + 10 * SEC,
            now=T0 + DAY,
            window_ms=7 * DAY,
            limit=MAX_BACKFILL_SLOTS,
            total=30,
        )
    )
    assert [len(slots) for _, slots in planned] == [10, 10, 10]
