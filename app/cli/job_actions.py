"""What `tickwheel jobs` does, without the command line: find a declared job, read a rule
option, build the commands for its instances, send them and wait for their results, read
the instances' states (or one instance's events) from their log."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from app.errors import BadRecord, JobsCliError
from app.jobs import (
    SCHEDULE,
    Job,
    JobScope,
    ScheduleState,
    disable_command,
    effective_rule,
    enable_command,
    reschedule_command,
    schedule_aggregate,
    trigger_command,
)
from app.kafka import Producer, Reader, ensure_topics, read_partitions, require_topic
from app.kafka.connection import Connectable
from app.model.decide import StoredAggregate, fold
from app.node import node_topics
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import (
    CommandEnvelope,
    CommandResult,
    EventEnvelope,
    ResultCode,
    decode,
    encode,
)
from app.service import Service
from tables import DEFAULT_TENANT, AggregateRef
from tables.exceptions import InvalidRule
from tables.partitioner import partition_of

__all__ = [
    "FAILED_CODES",
    "InstanceState",
    "find_job",
    "instance_commands",
    "parse_rule_option",
    "read_instance_events",
    "read_instances",
    "send_and_wait",
]

logger = logging.getLogger(__name__)

FAILED_CODES = frozenset(
    {ResultCode.REJECTED, ResultCode.SCHEDULE_JOB_INVALID, ResultCode.ERROR, ResultCode.BUSY}
)
"""Results that mean the command did not do what was asked."""


# --- what the commands do, without Kafka -------------------------------------------------


def find_job(service: Service, context: str, name: str) -> Job:
    """The job `name` declared in `context` of `service`; `JobsCliError` naming what exists."""
    if context not in service.jobs or not service.jobs[context]:
        known = ", ".join(sorted(c for c, jobs in service.jobs.items() if jobs)) or "none"
        raise JobsCliError(f"context {context!r} declares no jobs (contexts with jobs: {known})")
    for job in service.jobs[context]:
        if job.name == name:
            return job
    known = ", ".join(sorted(j.name for j in service.jobs[context]))
    raise JobsCliError(f"unknown job {name!r} in {context} (its jobs: {known})")


def parse_rule_option(text: str | None, job: Job) -> dict[str, Any] | None:
    """`--rule` as an instance's override (an object of rule fields; `null`: none), checked
    against the job's default as the aggregate will check it."""
    if text is None:
        return None
    try:
        parts = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise JobsCliError(f"--rule is not JSON: {exc}") from exc
    if parts is None:
        return None
    if not isinstance(parts, dict):
        raise JobsCliError(
            f"--rule must be a JSON object of rule fields (or null), not {type(parts).__name__}"
        )
    try:
        effective_rule(job.rule, parts)
    except InvalidRule as exc:
        raise JobsCliError(f"invalid rule for job {job.name!r}: {exc}") from exc
    return parts


def instance_commands(
    action: str,
    context: str,
    job: Job,
    *,
    partitions: int,
    tenants: Sequence[str] = (),
    partition: int | None = None,
    rule: dict[str, Any] | None = None,
    request_id: str | None = None,
) -> list[CommandEnvelope]:
    """One `wow.schedule.<action>` per instance named: `action` is enable, disable,
    reschedule (whose `rule` None makes the instance follow its job's default again) or
    trigger (under `request_id`, suffixed `@<tenant>/<instance id>` when several instances
    share it, as results are matched by request id; None: a fresh one each)."""
    if job.scope is not JobScope.SHARDED and partition is not None:
        raise JobsCliError(f"job {job.name!r} is {job.scope}: --partition is for SHARDED jobs")
    if job.scope is not JobScope.TENANT and any(t != DEFAULT_TENANT for t in tenants):
        raise JobsCliError(
            f"job {job.name!r} is {job.scope}: its instances are in the default tenant "
            f"{DEFAULT_TENANT!r}; --tenant is for TENANT jobs"
        )
    if partition is not None and partition >= partitions:
        raise JobsCliError(f"--partition {partition} is not one of {partitions} partitions")
    where: list[dict[str, Any]]
    if job.scope is JobScope.SHARDED:
        shards = range(partitions) if partition is None else [partition]
        where = [{"partition": p, "partitions": partitions} for p in shards]
    else:
        where = [{"tenant": t} for t in dict.fromkeys(tenants or [DEFAULT_TENANT])]
    if action == "enable":
        return [enable_command(context, job, rule=rule, **w) for w in where]
    if action == "disable":
        return [disable_command(context, job, **w) for w in where]
    if action == "reschedule":
        return [reschedule_command(context, job, rule, **w) for w in where]
    if action == "trigger":
        if request_id is not None and not 0 < len(request_id.strip()) == len(request_id) <= 200:
            raise JobsCliError(
                f"--request-id {request_id!r}: give 1-200 characters, no surrounding spaces"
            )
        commands = [trigger_command(context, job, request_id=request_id, **w) for w in where]
        if request_id is None or len(commands) == 1:
            return commands
        return [
            c.model_copy(
                update={"request_id": f"{request_id}@{c.aggregate.tenant}/{c.aggregate.id}"}
            )
            for c in commands
        ]
    raise ValueError(f"unknown action {action!r}")


# --- Kafka ---------------------------------------------------------------------------------


async def send_and_wait(
    bootstrap: Connectable, partitions: int, commands: Sequence[CommandEnvelope], wait_s: float
) -> dict[str, CommandResult]:
    """Sends `commands` (all to one context's schedule) and, for up to `wait_s` seconds,
    waits for their results: those that came, by request id."""
    if not commands:
        return {}
    context = commands[0].aggregate.context
    topics = AggregateTopics(context, SCHEDULE)
    results_topic = ContextTopics(context).results
    await ensure_topics(bootstrap, node_topics([topics], partitions))
    # Where each result will be written (`processor`: the request id picks the partition),
    # and how far those partitions reach now: the results come after.
    wanted = {c.request_id: partition_of(c.request_id, partitions) for c in commands}
    async with Reader(bootstrap) as reader:
        start = {p: (await reader.offsets(results_topic, p))[1] for p in set(wanted.values())}
        producer = Producer(bootstrap)
        await producer.start()
        try:
            await producer.send_many(
                [
                    (
                        topics.commands,
                        partition_of(c.aggregate.id, partitions),
                        c.aggregate.id.encode(),
                        encode(c),
                    )
                    for c in commands
                ]
            )
        finally:
            await producer.stop()
        found: dict[str, CommandResult] = {}
        deadline = time.monotonic() + wait_s
        while wait_s > 0 and len(found) < len(wanted):
            for p in sorted(start):
                async for batch in reader.read(results_topic, p, start[p]):
                    for r in batch:
                        start[p] = r.offset + 1
                        try:
                            result = decode(CommandResult, r.value)
                        except BadRecord:
                            continue
                        if result.request_id in wanted:
                            found[result.request_id] = result
            if len(found) == len(wanted) or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.2)
    return found


@dataclass(frozen=True, slots=True)
class InstanceState:
    """One instance as the schedule log has it."""

    tenant: str
    id: str
    version: int
    state: ScheduleState


async def read_instances(
    bootstrap: Connectable, context: str, jobs: Iterable[Job], partitions: int
) -> list[InstanceState]:
    """The instances of `context`'s jobs folded from its schedule log, as they are now.

    Creates no topic: `MissingTopic` when the log is not there (no instance was enabled).
    """
    topics = AggregateTopics(context, SCHEDULE)
    have = await require_topic(
        bootstrap, topics.events, f"no instance of {context}'s jobs has been enabled there"
    )
    agg = schedule_aggregate(context, jobs, partitions)
    stored: dict[tuple[str, str], StoredAggregate] = {}
    async for batch in read_partitions(bootstrap, topics.events, range(have)):
        for r in batch:
            try:
                event = decode(EventEnvelope, r.value)
            except BadRecord:
                continue
            if event.aggregate.type_name != topics.type_name:
                continue
            key = (event.aggregate.tenant, event.aggregate.id)
            stored[key] = fold(agg, stored.get(key), [event])
    return [
        InstanceState(t, i, s.version, ScheduleState.model_validate(s.state))
        for (t, i), s in sorted(stored.items())
    ]


async def read_instance_events(
    bootstrap: Connectable, ref: AggregateRef, partitions: int
) -> list[EventEnvelope]:
    """The events of the job instance `ref`, in log order, from its partition of its
    context's schedule log. Creates no topic: `MissingTopic` when the log is not there."""
    topics = AggregateTopics(ref.context, SCHEDULE)
    await require_topic(
        bootstrap, topics.events, f"no instance of {ref.context}'s jobs has been enabled there"
    )
    events: list[EventEnvelope] = []
    async for batch in read_partitions(
        bootstrap, topics.events, [partition_of(ref.id, partitions)]
    ):
        for r in batch:
            try:
                event = decode(EventEnvelope, r.value)
            except BadRecord:
                continue
            if event.aggregate == ref:
                events.append(event)
    return events
