"""`tickwheel jobs …`: enable, disable and reschedule the instances of a service's jobs.

Each command names a job declared in the service (`--service module:attr`, `--context`,
`--job`) and one or more of its instances: the one of a SYSTEM job, one per `--tenant` of
a TENANT job, one per log partition of a SHARDED job (or the `--partition` given). It
writes a `wow.schedule.*` command per instance to `<context>.schedule.commands`, in the
instance id's partition, and waits for the results the workers decide.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import orjson
import typer

from app.cli.common import (
    Bootstrap,
    Json,
    Partitions,
    ServiceSpec,
    fail,
    json_line,
    load_service,
    run,
    settings_for,
    time_iso,
)
from app.errors import BadRecord, JobsCliError
from app.jobs import (
    SCHEDULE,
    Job,
    JobScope,
    ScheduleState,
    disable_command,
    effective_rule,
    enable_command,
    instance_ids,
    reschedule_command,
    schedule_aggregate,
)
from app.kafka import Producer, Reader, ensure_topics, read_partitions, require_topic
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
from tables import DEFAULT_TENANT
from tables.exceptions import InvalidRule
from tables.partitioner import partition_of

__all__ = [
    "FAILED_CODES",
    "JobsCliError",
    "find_job",
    "instance_commands",
    "jobs_cli",
    "parse_rule_option",
    "read_instances",
    "send_and_wait",
]

jobs_cli = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Enable, disable, reschedule and list the instances of a service's jobs.",
)
logger = logging.getLogger(__name__)


FAILED_CODES = frozenset(
    {ResultCode.REJECTED, ResultCode.SCHEDULE_JOB_INVALID, ResultCode.ERROR, ResultCode.BUSY}
)
"""Results that mean the command did not do what was asked."""


Context = Annotated[str, typer.Option(help="the context the job is declared in")]
JobName = Annotated[str, typer.Option("--job", help="the job's name")]
Tenants = Annotated[
    list[str] | None,
    typer.Option("--tenant", help="a TENANT job's tenant (repeatable); default: the default one"),
]
Partition = Annotated[
    int | None,
    typer.Option(min=0, help="a SHARDED job's log partition; default: every partition"),
]
Wait = Annotated[
    float,
    typer.Option(min=0.0, help="seconds to wait for the workers' results; 0: do not wait"),
]


def _service(spec: str) -> Service:
    try:
        return load_service(spec)
    except typer.BadParameter as exc:
        raise fail(exc.message) from exc


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
) -> list[CommandEnvelope]:
    """One `wow.schedule.<action>` per instance named: `action` is enable, disable or
    reschedule (whose `rule` None makes the instance follow its job's default again)."""
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
    raise ValueError(f"unknown action {action!r}")


# --- Kafka ---------------------------------------------------------------------------------


async def send_and_wait(
    bootstrap: str, partitions: int, commands: Sequence[CommandEnvelope], wait_s: float
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
    bootstrap: str, context: str, jobs: Iterable[Job], partitions: int
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


# --- the commands --------------------------------------------------------------------------


def _act(
    action: str,
    service: str,
    context: str,
    job_name: str,
    tenants: list[str] | None,
    partition: int | None,
    rule: str | None,
    bootstrap: str | None,
    partitions: int | None,
    wait: float,
) -> None:
    settings = settings_for(bootstrap, partitions)
    found = _service(service)
    try:
        job = find_job(found, context, job_name)
        override = parse_rule_option(rule, job)
        commands = instance_commands(
            action,
            context,
            job,
            partitions=settings.partitions,
            tenants=tenants or (),
            partition=partition,
            rule=override,
        )
    except JobsCliError as exc:
        raise fail(str(exc)) from exc
    results = run(send_and_wait(settings.bootstrap_servers, settings.partitions, commands, wait))
    failed = False
    for c in commands:
        result = results.get(c.request_id)
        if result is None:
            outcome = "sent" if wait == 0 else f"sent; no result within {wait:g} s"
        else:
            outcome = result.code.value + (f": {result.message}" if result.message else "")
            failed = failed or result.code in FAILED_CODES
        typer.echo(f"{action} {c.aggregate}: {outcome}")
    if failed:
        raise fail(f"{action} was refused for some instances (see above)")
    if wait > 0 and len(results) < len(commands):
        raise fail(
            f"no result within {wait:g} s for {len(commands) - len(results)} instance(s): "
            "is a worker of the service running? The commands stay queued for it."
        )


@jobs_cli.command()
def enable(
    service: ServiceSpec,
    context: Context,
    job: JobName,
    tenant: Tenants = None,
    partition: Partition = None,
    rule: Annotated[
        str | None,
        typer.Option(help="the instances' own rule parts as JSON, e.g. '{\"every\": 60000}'"),
    ] = None,
    bootstrap: Bootstrap = None,
    partitions: Partitions = None,
    wait: Wait = 15.0,
) -> None:
    """Enables a job's instances (again): they tick by its rule under their override."""
    _act("enable", service, context, job, tenant, partition, rule, bootstrap, partitions, wait)


@jobs_cli.command()
def disable(
    service: ServiceSpec,
    context: Context,
    job: JobName,
    tenant: Tenants = None,
    partition: Partition = None,
    bootstrap: Bootstrap = None,
    partitions: Partitions = None,
    wait: Wait = 15.0,
) -> None:
    """Disables a job's instances: their schedule is cancelled (their override is kept)."""
    _act("disable", service, context, job, tenant, partition, None, bootstrap, partitions, wait)


@jobs_cli.command()
def reschedule(
    service: ServiceSpec,
    context: Context,
    job: JobName,
    rule: Annotated[
        str,
        typer.Option(help="the instances' own rule parts as JSON; null: follow the default"),
    ],
    tenant: Tenants = None,
    partition: Partition = None,
    bootstrap: Bootstrap = None,
    partitions: Partitions = None,
    wait: Wait = 15.0,
) -> None:
    """Sets the override of enabled instances (null: they follow the job's default again)."""
    _act("reschedule", service, context, job, tenant, partition, rule, bootstrap, partitions, wait)


def _rule_json(job: Job) -> str:
    return orjson.dumps(job.rule.model_dump(mode="json")).decode()


@jobs_cli.command("list")
def list_(
    service: ServiceSpec,
    context: Annotated[str | None, typer.Option(help="only this context's jobs")] = None,
    job_name: Annotated[str | None, typer.Option("--job", help="only this job")] = None,
    state: Annotated[
        bool, typer.Option("--state", help="also read each instance's state from the log")
    ] = False,
    bootstrap: Bootstrap = None,
    partitions: Partitions = None,
    as_json: Json = False,
) -> None:
    """Prints the service's jobs (scope, default rule) and their instances' ids; with
    --state, each instance as its schedule log has it (read only: creates no topic)."""
    settings = settings_for(bootstrap, partitions)
    found = _service(service)
    contexts = sorted(c for c, jobs in found.jobs.items() if jobs)
    if context is not None:
        if context not in contexts:
            known = ", ".join(contexts) or "none"
            raise fail(f"context {context!r} declares no jobs (contexts with jobs: {known})")
        contexts = [context]
    listed = {c: list(found.jobs[c]) for c in contexts}
    if job_name is not None:
        listed = {c: [j for j in jobs if j.name == job_name] for c, jobs in listed.items()}
        listed = {c: jobs for c, jobs in listed.items() if jobs}
        if not listed:
            where = f"in {context}" if context is not None else "in any context"
            known = ", ".join(sorted({j.name for c in contexts for j in found.jobs[c]}))
            raise fail(f"unknown job {job_name!r} {where} (jobs: {known})")
        contexts = sorted(listed)
    n = settings.partitions
    for ctx in contexts:
        states: dict[tuple[str, str], InstanceState] = {}
        if state:
            read = run(read_instances(settings.bootstrap_servers, ctx, found.jobs[ctx], n))
            states = {(s.tenant, s.id): s for s in read}
        for job in listed[ctx]:
            ids = sorted(instance_ids(ctx, job, n), key=lambda i: partition_of(i, n))
            seen = [s for (_, i), s in sorted(states.items()) if i in ids]
            if as_json:
                json_line(
                    {
                        "context": ctx,
                        "job": job.name,
                        "scope": job.scope.value,
                        "rule": job.rule.model_dump(mode="json"),
                        "instances": [{"id": i, "partition": partition_of(i, n)} for i in ids],
                        **({"state": [_state_json(s) for s in seen]} if state else {}),
                    }
                )
                continue
            typer.echo(f"{ctx}\t{job.name}\t{job.scope.value}\t{_rule_json(job)}")
            where = "in each tenant that enables it" if job.scope is JobScope.TENANT else ""
            for i in ids:
                typer.echo(f"\t{i}\tpartition {partition_of(i, n)}\t{where}".rstrip())
            for s in seen:
                typer.echo(f"\t\t{_state_line(s)}")
    if not as_json:
        typer.echo(f"{len(contexts)} context(s) with jobs, {n} partition(s)", err=True)


def _state_json(s: InstanceState) -> dict[str, Any]:
    return {"tenant": s.tenant, "id": s.id, "version": s.version, **s.state.model_dump()}


def _state_line(s: InstanceState) -> str:
    st = s.state
    status = "enabled" if st.enabled else "disabled"
    override = orjson.dumps(st.override).decode() if st.override else "none"
    last = "-"
    if st.last_slot is not None:
        due = "?" if st.last_due_at is None else time_iso(st.last_due_at)
        last = f"slot {st.last_slot} due {due}"
    rule = orjson.dumps(st.rule).decode() if st.rule else "-"
    return f"{s.tenant}/{s.id}: {status}, override {override}, rule {rule}, last run {last}"
