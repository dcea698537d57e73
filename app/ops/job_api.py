"""What `tickwheel jobs …` and the web edge's `/jobs` routes (`app.ops.job_routes`) both do
with a service's jobs: find a declared job, check an instance's rule override, make the
`wow.schedule.*` commands of the instances named, plan a backfill of a past range; and,
from `app.ops.job_log`, send commands and wait for their results, and read the instances'
states (or one instance's events) from their schedule log.

The I/O runs on the log's ports (`LogReader`, `Publisher`): the CLI opens its own clients
on the bootstrap servers, the web edge uses its node's.

Errors are `JobInputError`s naming the wrong input (`field`); their messages spell it as
the caller does (`Spelling`: the CLI's `--partition`, the JSON body's `partition`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from app.clients.book_commands import seconds_reason
from app.errors import JobsCliError
from app.jobs import (
    MAX_BACKFILL_TOTAL_SLOTS,
    SCHEDULE,
    BackfillError,
    BackfillSlot,
    Job,
    JobScope,
    RequestIdTooLong,
    TooManySlots,
    action_request_id,
    backfill_slots,
    disable_command,
    effective_rule,
    enable_command,
    first_unheld,
    request_id_limit,
    reschedule_command,
    shared_request_id,
    tick_timers,
    trigger_command,
)
from app.ops.job_log import (
    InstanceEvents,
    InstanceState,
    fold_instances,
    read_events_of,
    read_instance_events,
    read_instances,
    send_and_wait,
)
from app.protocol.wire import CommandEnvelope, EventEnvelope, ResultCode
from app.service import Service
from tables import DEFAULT_TENANT, AggregateRef
from tables.exceptions import InvalidRule
from tables.refs import NEW_INPUT, unusable_request_id

__all__ = [
    "DECIDED_WITHIN_MS",
    "FAILED_CODES",
    "InstanceEvents",
    "InstanceState",
    "JobInputError",
    "Spelling",
    "check_range",
    "cli_option",
    "find_job",
    "fold_instances",
    "instance_commands",
    "instance_refs",
    "json_field",
    "plan_backfill",
    "read_events_of",
    "read_instance_events",
    "read_instances",
    "rule_override",
    "send_and_wait",
]

FAILED_CODES = frozenset(
    {ResultCode.REJECTED, ResultCode.SCHEDULE_JOB_INVALID, ResultCode.ERROR, ResultCode.BUSY}
)
"""Results that mean the command did not do what was asked."""

DECIDED_WITHIN_MS = 3_600_000
"""How long after it is sent a backfill's command is taken to be decided at the latest: a
slot must be due that long after the start of the de-duplication window to be sent (the
node refuses, when it decides it, a slot due before the window itself)."""

Spelling = Callable[[str], str]
"""How a caller names an input field in its messages."""


def cli_option(field: str) -> str:
    """The CLI's spelling: `--request-id`, `--tenant` (repeatable) for `tenants`."""
    return "--" + {"tenants": "tenant"}.get(field, field).replace("_", "-")


def json_field(field: str) -> str:
    """The JSON body's spelling: the field itself."""
    return field


class JobInputError(JobsCliError):
    """An input the jobs' commands cannot take; `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


# --- what the commands are, without the log ----------------------------------------------


def find_job(service: Service, context: str, name: str) -> Job:
    """The job `name` declared in `context` of `service`; `JobInputError` naming what exists."""
    if context not in service.jobs or not service.jobs[context]:
        known = ", ".join(sorted(c for c, jobs in service.jobs.items() if jobs)) or "none"
        raise JobInputError(
            "context", f"context {context!r} declares no jobs (contexts with jobs: {known})"
        )
    for job in service.jobs[context]:
        if job.name == name:
            return job
    known = ", ".join(sorted(j.name for j in service.jobs[context]))
    raise JobInputError("job", f"unknown job {name!r} in {context} (its jobs: {known})")


def rule_override(parts: object, job: Job, spell: Spelling = json_field) -> dict[str, Any] | None:
    """An instance's override (an object of rule fields; None: none), checked against the
    job's default as the aggregate will check it."""
    if parts is None:
        return None
    if not isinstance(parts, dict):
        raise JobInputError(
            "rule",
            f"{spell('rule')} must be a JSON object of rule fields (or null), "
            f"not {type(parts).__name__}",
        )
    try:
        rule = effective_rule(job.rule, parts, strict=True)
    except InvalidRule as exc:
        raise JobInputError("rule", f"invalid rule for job {job.name!r}: {exc}") from exc
    if (why := seconds_reason(rule)) is not None:
        # As `timers set` refuses it: taken for ms, the instant is in 1970, its slot long
        # expired, and the node would refuse the Enable for that alone, the unit unsaid.
        raise JobInputError("rule", f"invalid rule for job {job.name!r}: {why}")
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
    spell: Spelling = cli_option,
    now: int | None = None,
) -> list[CommandEnvelope]:
    """One `wow.schedule.<action>` per instance named: `action` is enable, disable,
    reschedule (whose `rule` None makes the instance follow its job's default again) or
    trigger. Under `request_id` as the action's own (`action_request_id`:
    `<action>:<request id>`, so that one id reused for another action is not its
    DUPLICATE), suffixed `@<tenant>/<instance id>` when several instances share it, as
    results are matched by request id (sent again, each is a DUPLICATE), and refused
    (`request_id`) when one would be longer than a request id may be; None: a fresh one
    each. A tenant no instance can have is refused (`tenants`). Issued at `now` (a node's
    clock; None: the wall clock's)."""
    if job.scope is not JobScope.SHARDED and partition is not None:
        raise JobInputError(
            "partition",
            f"job {job.name!r} is {job.scope}: {spell('partition')} is for SHARDED jobs",
        )
    if job.scope is not JobScope.TENANT and any(t != DEFAULT_TENANT for t in tenants):
        raise JobInputError(
            "tenants",
            f"job {job.name!r} is {job.scope}: its instances are in the default tenant "
            f"{DEFAULT_TENANT!r}; {spell('tenants')} is for TENANT jobs",
        )
    if partition is not None and not 0 <= partition < partitions:
        raise JobInputError(
            "partition",
            f"{spell('partition')} {partition} is not one of {partitions} partitions",
        )
    # A caller's id is held to 200 characters. One an answer named (`<action>:` and the
    # rest, `@<tenant>/<instance id>` too when several instances shared it) is an
    # instance's whole id, as long as one may be: sent again as the answer said (with the
    # option naming its instance), it is taken back.
    if request_id is not None:
        prefix = f"{action}:"
        named = request_id.startswith(prefix)
        longest = request_id_limit(trigger=action == "trigger") - len(prefix) if named else 200
        if (
            unusable_request_id(request_id)
            or not 0 < len(request_id.removeprefix(prefix)) <= longest
        ):
            bound = f"; one an answer named, {longest} after {prefix!r}" if named else ""
            raise JobInputError(
                "request_id",
                f"{spell('request_id')} {request_id[:80]!r}: give 1-200 characters{bound}, "
                "no surrounding spaces or control characters",
            )
    for tenant in tenants:
        try:
            fields = {"context": context, "aggregate": SCHEDULE, "tenant": tenant, "id": job.name}
            AggregateRef.model_validate(fields, context=NEW_INPUT)
        except ValidationError as exc:
            raise JobInputError(
                "tenants", f"{spell('tenants')} {tenant[:40]!r}: {exc.errors()[0]['msg']}"
            ) from exc
    where: list[dict[str, Any]]
    if job.scope is JobScope.SHARDED:
        shards = range(partitions) if partition is None else [partition]
        where = [{"partition": p, "partitions": partitions} for p in shards]
    else:
        where = [{"tenant": t} for t in dict.fromkeys(tenants or [DEFAULT_TENANT])]
    rid = None if request_id is None else action_request_id(action, request_id)
    sent: dict[str, Any] = {"request_id": rid, "now": now}
    if action == "enable":
        commands = [enable_command(context, job, rule=rule, **w, **sent) for w in where]
    elif action == "disable":
        commands = [disable_command(context, job, **w, **sent) for w in where]
    elif action == "reschedule":
        commands = [reschedule_command(context, job, rule, **w, **sent) for w in where]
    elif action == "trigger":
        commands = [trigger_command(context, job, **w, **sent) for w in where]
    else:
        raise ValueError(f"unknown action {action!r}")
    if request_id is None or rid is None or len(commands) == 1:
        return commands
    try:
        return shared_request_id(rid, commands, trigger=action == "trigger")
    except RequestIdTooLong as exc:
        # The room of the caller's id: the action's prefix (if added) is ours.
        room = max(exc.room - (len(rid) - len(request_id)), 0)
        raise JobInputError(
            "request_id",
            f"{spell('request_id')} is too long for {len(commands)} instances: "
            f"{exc.longest.aggregate}'s would be {len(exc.longest.request_id)} characters "
            f"(<action>:<request id>@<tenant>/<instance>, at most {exc.limit}); give at most "
            f"{room}",
        ) from exc


def instance_refs(
    context: str,
    job: Job,
    *,
    partitions: int,
    tenants: Sequence[str] = (),
    partition: int | None = None,
    spell: Spelling = cli_option,
) -> list[AggregateRef]:
    """The instances named, as `instance_commands` names them (nothing is sent)."""
    made = instance_commands(
        "disable",
        context,
        job,
        partitions=partitions,
        tenants=tenants,
        partition=partition,
        spell=spell,
    )
    return [c.aggregate for c in made]


# --- backfill ------------------------------------------------------------------------------


def check_range(
    start: int,
    end: int,
    now: int,
    spell: Spelling = json_field,
    given: tuple[str, str] | None = None,
) -> None:
    """A backfill's range `[start, end]` (epoch ms) must be in order and past by `now`;
    `given`: the range as the caller gave it, to say it back so."""
    first, last = given or (str(start), str(end))
    if end < start:
        raise JobInputError("until", f"{spell('until')} {last} is before {spell('from')} {first}")
    if end > now:
        raise JobInputError(
            "until", f"{spell('until')} {last} is after now ({_iso(now)}): backfill a past range"
        )


async def plan_backfill(
    events_of: Callable[[AggregateRef], Awaitable[list[EventEnvelope]]],
    refs: Iterable[AggregateRef],
    start: int,
    end: int,
    *,
    now: int,
    window_ms: int,
    limit: int,
    total: int = MAX_BACKFILL_TOTAL_SLOTS,
    spell: Spelling = json_field,
) -> list[tuple[AggregateRef, list[BackfillSlot]]]:
    """Each instance's slots due in the range, from its events (`events_of`, asked once
    for each, in the order of `refs`: `InstanceEvents` reads each partition once for all
    its instances), under their live ticks' request ids; `JobInputError` when one has
    more than `limit`, all of them more than `total` (refused as soon as the instances
    planned so far pass it, before the rest are read or planned), or one was due so long
    ago (before the de-duplication window of `window_ms` less `DECIDED_WITHIN_MS`) that the
    node may have forgotten whether it ran live."""
    planned: list[tuple[AggregateRef, list[BackfillSlot]]] = []
    count = 0
    for ref in refs:
        timers = tick_timers(await events_of(ref))
        room = total - count
        try:
            # In a thread: a per-second rule over a long range steps ~200,000 slots an
            # instance (seconds of CPU), which on the loop would hold up the node's work.
            slots = await asyncio.to_thread(
                backfill_slots, timers, start, end, limit=min(limit, room)
            )
        except TooManySlots as exc:
            if room < limit:
                raise JobInputError(
                    "until",
                    f"the backfill has more than {total} slots over its instances, the most "
                    f"one backfill sends ({count} in the {len(planned)} before {ref}): "
                    f"backfill a shorter range ({spell('from')}, "
                    f"{spell('until')}) or fewer instances ({spell('tenants')}, "
                    f"{spell('partition')})",
                ) from exc
            raise JobInputError("until", f"{ref}: {exc}") from exc
        except BackfillError as exc:
            raise JobInputError("until", f"{ref}: {exc}") from exc
        count += len(slots)
        planned.append((ref, slots))
    # A live run's request id is applied at its slot's due time at the earliest, and kept
    # for the window after: later than this, the node could not tell that it ran.
    held_after = now - window_ms + DECIDED_WITHIN_MS
    for ref, slots in planned:
        if (old := first_unheld(slots, held_after)) is not None:
            raise JobInputError(
                "from",
                f"{ref}: slot {old.slot} was due at {_iso(old.due_at)}, before "
                f"{_iso(held_after + 1)} (TICKWHEEL_REQUEST_ID_WINDOW_MS less an hour "
                "ago): the workers may have forgotten whether it ran, so it could run twice; "
                "backfill a later range",
            )
    return planned


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
