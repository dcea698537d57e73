"""`tickwheel jobs …`: enable (resume), disable (pause), reschedule, trigger and backfill
the instances of a service's jobs (trigger and backfill: `app.cli.job_runs`).

Each command names a job declared in the service (`--service module:attr`, `--context`,
`--job`) and one or more of its instances: the one of a SYSTEM job, one per `--tenant` of
a TENANT job, one per log partition of a SHARDED job (or the `--partition` given). It
writes a `wow.schedule.*` command per instance to `<context>.schedule.commands`, in the
instance id's partition, and waits for the results the workers decide. `--request-id`
names the change, as the HTTP routes' `request_id` does (several instances:
`<request id>@<tenant>/<instance id>` each): sent again with it, each command is answered
DUPLICATE; without it, a fresh one each time.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

import orjson
import typer

from app.cli.common import (
    Bootstrap,
    Json,
    Partitions,
    ServiceSpec,
    checked,
    fail,
    json_line,
    load_service,
    run,
    settings_for,
    time_iso,
)
from app.cli.job_actions import (
    FAILED_CODES,
    InstanceState,
    find_job,
    instance_commands,
    parse_rule_option,
    read_instances,
    send_and_wait,
)
from app.cli.job_options import (
    Context,
    JobName,
    Partition,
    RequestId,
    Tenants,
    Wait,
    refused_input,
    report,
    send_all,
)
from app.cli.job_runs import backfill, trigger
from app.cli.text import printable
from app.errors import JobsCliError
from app.jobs import (
    Job,
    JobScope,
    instance_ids,
)
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
    help="Enable (resume), disable (pause), reschedule, trigger, backfill and list the "
    "instances of a service's jobs.",
)
logger = logging.getLogger(__name__)


# --- the commands --------------------------------------------------------------------------


def _act(
    action: str,
    service: str,
    context: str,
    job_name: str,
    tenants: list[str] | None,
    partition: int | None,
    rule: str | None,
    request_id: str | None,
    bootstrap: str | None,
    partitions: int | None,
    wait: float,
    as_json: bool,
) -> None:
    settings = settings_for(bootstrap, partitions)
    found = load_service(service)
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
            request_id=request_id,
        )
    except JobsCliError as exc:
        raise refused_input(exc) from exc
    report(action, commands, send_all(settings, commands, wait), wait, as_json, runs=False)


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
    request_id: RequestId = None,
    bootstrap: Bootstrap = None,
    partitions: Partitions = None,
    wait: Wait = 15.0,
    as_json: Json = False,
) -> None:
    """Enables a job's instances (again): they tick by its rule under their override."""
    _act(
        "enable",
        service,
        context,
        job,
        tenant,
        partition,
        rule,
        request_id,
        bootstrap,
        partitions,
        wait,
        as_json,
    )


@jobs_cli.command()
def disable(
    service: ServiceSpec,
    context: Context,
    job: JobName,
    tenant: Tenants = None,
    partition: Partition = None,
    request_id: RequestId = None,
    bootstrap: Bootstrap = None,
    partitions: Partitions = None,
    wait: Wait = 15.0,
    as_json: Json = False,
) -> None:
    """Disables a job's instances: their schedule is cancelled (their override is kept)."""
    _act(
        "disable",
        service,
        context,
        job,
        tenant,
        partition,
        None,
        request_id,
        bootstrap,
        partitions,
        wait,
        as_json,
    )


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
    request_id: RequestId = None,
    bootstrap: Bootstrap = None,
    partitions: Partitions = None,
    wait: Wait = 15.0,
    as_json: Json = False,
) -> None:
    """Sets the override of enabled instances (null: they follow the job's default again)."""
    _act(
        "reschedule",
        service,
        context,
        job,
        tenant,
        partition,
        rule,
        request_id,
        bootstrap,
        partitions,
        wait,
        as_json,
    )


jobs_cli.command()(trigger)
jobs_cli.command()(backfill)


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
    --state, each instance as its schedule log has it, by the log's own partition count
    (read only: creates no topic)."""
    settings = settings_for(bootstrap, partitions)
    found = load_service(service)
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
    counts: dict[str, int] = {}
    for ctx in contexts:
        n = settings.partitions
        states: dict[tuple[str, str], InstanceState] = {}
        if state:
            # Read only: with the log's own count, whatever TICKWHEEL_PARTITIONS says; a
            # SHARDED job's instances (their ids name the count) are listed by it too.
            n, read = run(
                checked(
                    settings.kafka,
                    read_instances(settings.kafka, ctx, found.jobs[ctx], settings.limits),
                )
            )
            states = {(s.tenant, s.id): s for s in read}
        counts[ctx] = n
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
            # The service's: a job's name may end in a newline (its check's `$` lets one
            # through), a cron expression hold a next-line or U+2028 (JSON leaves them).
            named = (ctx, job.name, job.scope.value, _rule_json(job))
            typer.echo("\t".join(printable(v) for v in named))
            where = "in each tenant that enables it" if job.scope is JobScope.TENANT else ""
            for i in ids:
                typer.echo(f"\t{printable(i)}\tpartition {partition_of(i, n)}\t{where}".rstrip())
            for s in seen:
                typer.echo(f"\t\t{_state_line(s)}")
    if not as_json:
        typer.echo(
            f"{len(contexts)} context(s) with jobs, {_counts(counts, settings.partitions)}",
            err=True,
        )


def _counts(counts: dict[str, int], default: int) -> str:
    """The partition count the instances were listed with: one for all, or each log's."""
    if len(set(counts.values())) > 1:
        return "partitions: " + ", ".join(f"{printable(c)} {n}" for c, n in counts.items())
    return f"{next(iter(counts.values()), default)} partition(s)"


def _state_json(s: InstanceState) -> dict[str, Any]:
    return s.as_json()


def _state_line(s: InstanceState) -> str:
    st = s.state
    status = "enabled" if st.enabled else "disabled"
    override = orjson.dumps(st.override).decode() if st.override else "none"
    last = "-"
    if st.last_slot is not None:
        due = "?" if st.last_due_at is None else time_iso(st.last_due_at)
        last = f"slot {st.last_slot} due {due}"
    rule = orjson.dumps(st.rule).decode() if st.rule else "-"
    # The log's, another writer's: its control characters (a newline, an escape sequence;
    # JSON leaves DEL, C1 controls and U+2028 as they are) would forge a line or act on
    # the terminal.
    line = (
        f"{printable(s.tenant)}/{printable(s.id)}: {status}, override {printable(override)}, "
        f"rule {printable(rule)}, last run {last}"
    )
    # One line: an error's text may span several (a validation error's does).
    return line if s.error is None else f"{line}; {printable(' '.join(s.error.split()))}"
