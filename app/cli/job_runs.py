"""`tickwheel jobs trigger|backfill`: run a job's instances outside their rule.

`trigger` runs each instance named once now (`wow.schedule.Trigger`), under a request id
of its own (`--request-id`, or a fresh one): the same trigger sent again runs once, and the
live schedule (its timer, its last slot) is left as it is.

`backfill` runs each slot of the instance's rule due in `[--from, --until]` (a past range)
under the request id that slot's live tick has (`app.jobs.backfill`), read from the
instance's schedule log, so a slot that ran live, or that a backfill ran before, applies
once (its result is DUPLICATE). `--dry-run` prints the slots and their request ids and
writes nothing. More than `MAX_BACKFILL_SLOTS` slots per instance are refused, more than
`MAX_BACKFILL_TOTAL_SLOTS` over all its instances (`--tenant`, `--partition`) too, and so is
a slot due before the node's de-duplication window (`TICKWHEEL_REQUEST_ID_WINDOW_MS`) less
`DECIDED_WITHIN_MS` from now: whether it ran live may be forgotten by the time the backfill
is decided, so it could run twice (the workers refuse, when they decide it, a slot due
before the window itself). The web edge's `POST /jobs/{context}/{job}/trigger|backfill`
(`app.ops.job_routes`) do the same through `app.ops.job_api`.

Both work on a paused (disabled) instance too; neither enables it.
"""

from __future__ import annotations

import time
from typing import Annotated

import typer

from app.cli.common import (
    CONFIG_ERROR,
    Bootstrap,
    Json,
    Partitions,
    ServiceSpec,
    checked,
    fail,
    json_line,
    load_service,
    request_id_check,
    run,
    settings_for,
    time_iso,
)
from app.cli.job_actions import find_job, instance_commands, read_instance_events
from app.cli.job_options import (
    Context,
    JobName,
    Partition,
    Tenants,
    Wait,
    refused_input,
    report,
    send_all,
)
from app.cli.rule_expr import BadExpression, parse_instant
from app.cli.text import printable
from app.errors import JobsCliError
from app.jobs import MAX_BACKFILL_SLOTS, MAX_BACKFILL_TOTAL_SLOTS, BackfillSlot, backfill_command
from app.ops.job_api import (
    DECIDED_WITHIN_MS,
    check_range,
    cli_option,
    instance_refs,
    plan_backfill,
)
from app.protocol.wire import EventEnvelope
from tables import AggregateRef

__all__ = ["DECIDED_WITHIN_MS", "backfill", "now_ms", "trigger"]


def now_ms() -> int:
    """The wall clock, epoch ms: a backfill's range must have passed by then."""
    return time.time_ns() // 1_000_000


def trigger(
    service: ServiceSpec,
    context: Context,
    job: JobName,
    tenant: Tenants = None,
    partition: Partition = None,
    request_id: Annotated[
        str | None,
        typer.Option(
            callback=request_id_check(200),
            help="the trigger's own id (1-200 characters; one an answer named, begun with "
            "trigger:, up to 296): sent again, it runs once",
        ),
    ] = None,
    bootstrap: Bootstrap = None,
    partitions: Partitions = None,
    wait: Wait = 15.0,
    as_json: Json = False,
) -> None:
    """Runs a job's instances once now, outside their rule (the schedule is unchanged)."""
    settings = settings_for(bootstrap, partitions)
    found = load_service(service)
    try:
        declared = find_job(found, context, job)
        commands = instance_commands(
            "trigger",
            context,
            declared,
            partitions=settings.partitions,
            tenants=tenant or (),
            partition=partition,
            request_id=request_id,
        )
    except JobsCliError as exc:
        raise refused_input(exc) from exc
    report("trigger", commands, send_all(settings, commands, wait), wait, as_json, runs=True)


def backfill(
    service: ServiceSpec,
    context: Context,
    job: JobName,
    from_: Annotated[
        str, typer.Option("--from", help="ISO 8601 with offset, or epoch ms: slots at or after it")
    ],
    until: Annotated[
        str, typer.Option(help="ISO 8601 with offset, or epoch ms: slots at or before it (past)")
    ],
    tenant: Tenants = None,
    partition: Partition = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="print the slots and request ids; write nothing")
    ] = False,
    bootstrap: Bootstrap = None,
    partitions: Partitions = None,
    wait: Wait = 15.0,
    as_json: Json = False,
) -> None:
    """Runs each slot of a past range once, under its live tick's request id."""
    settings = settings_for(bootstrap, partitions)
    found = load_service(service)
    now = now_ms()
    try:
        start = parse_instant(from_, "--from")
        end = parse_instant(until, "--until")
        check_range(start, end, now, cli_option, (from_, until))
        refs = instance_refs(
            context,
            find_job(found, context, job),
            partitions=settings.partitions,
            tenants=tenant or (),
            partition=partition,
        )
    except BadExpression as exc:
        raise fail(str(exc), CONFIG_ERROR) from exc
    except JobsCliError as exc:
        raise refused_input(exc) from exc

    async def events(ref: AggregateRef) -> list[EventEnvelope]:
        return await read_instance_events(settings.kafka, ref, settings.partitions, settings.limits)

    async def plan() -> list[tuple[AggregateRef, list[BackfillSlot]]] | JobsCliError:
        # Returned, not raised: `run` ends a raised one with exit code 1.
        try:
            return await plan_backfill(
                events,
                refs,
                start,
                end,
                now=now,
                window_ms=settings.request_id_window_ms,
                limit=MAX_BACKFILL_SLOTS,
                total=MAX_BACKFILL_TOTAL_SLOTS,
                spell=cli_option,
            )
        except JobsCliError as exc:
            return exc

    planned = run(checked(settings.kafka, plan()))
    if isinstance(planned, JobsCliError):
        raise refused_input(planned)
    commands = [backfill_command(ref, slot) for ref, slots in planned for slot in slots]
    if dry_run:
        for ref, slots in planned:
            for slot in slots:
                _print_slot(ref, slot, as_json)
        if not as_json:
            typer.echo(f"{len(commands)} slot(s) to backfill; dry run: nothing sent", err=True)
        return
    report("backfill", commands, send_all(settings, commands, wait), wait, as_json, runs=True)


def _print_slot(ref: AggregateRef, slot: BackfillSlot, as_json: bool) -> None:
    if as_json:
        json_line(
            {
                "instance": ref.model_dump(mode="json"),
                "slot": slot.slot,
                "due_at": slot.due_at,
                "request_id": slot.request_id,
            }
        )
    else:
        # The request id is the live tick's, read from the log (another writer's).
        instance, request_id = printable(str(ref)), printable(slot.request_id)
        typer.echo(f"{instance}\tslot {slot.slot}\t{time_iso(slot.due_at)}\t{request_id}")
