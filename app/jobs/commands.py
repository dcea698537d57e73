"""The commands an operator (or a service) sends to a job's instances: enable, reschedule,
disable, trigger and backfill."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from app.jobs.backfill import BackfillSlot
from app.jobs.declaration import (
    BACKFILL,
    DISABLE,
    ENABLE,
    RESCHEDULE,
    TRIGGER,
    Job,
    JobScope,
    ref_of,
    shard_ref,
)
from app.model.aggregate import sent_suffix_length
from app.protocol.wire import MAX_REQUEST_ID, CommandEnvelope
from tables import DEFAULT_TENANT, AggregateRef

TRIGGER_SENDS: Final = 1000
"""A triggered run of several instances under one request id may send this many commands
(`JobRun.send`, each `<request id>>n@<digest>`, hashed when longer than a request id): the
per-instance ids keep the room `<request id>>n` took (`send_fits`)."""


class RequestIdTooLong(ValueError):
    """`shared_request_id` made an id longer than `limit`: `longest` is the instance's
    command that would have it, `room` how long the shared request id may be."""

    def __init__(self, longest: CommandEnvelope, limit: int, room: int) -> None:
        super().__init__(f"{longest.aggregate}'s request id would be {len(longest.request_id)}")
        self.longest = longest
        self.limit = limit
        self.room = room


def shared_request_id(
    request_id: str, commands: Sequence[CommandEnvelope], *, trigger: bool
) -> list[CommandEnvelope]:
    """Several instances' `commands` under one `request_id`, each as
    `<request id>@<tenant>/<instance id>` (results are matched by request id).

    Refused (`RequestIdTooLong`) rather than shortened when one is longer than a request id
    may be (a `trigger`'s less room for its run's sends): the id a caller reads in the
    answer is the one sent, and sent again it is the same (a DUPLICATE)."""
    made = [
        c.model_copy(update={"request_id": f"{request_id}@{c.aggregate.tenant}/{c.aggregate.id}"})
        for c in commands
    ]
    limit = request_id_limit(trigger=trigger)
    longest = max(made, key=lambda c: len(c.request_id))
    if len(longest.request_id) > limit:
        room = limit - (len(longest.request_id) - len(request_id))
        raise RequestIdTooLong(longest, limit, max(room, 0))
    return made


def request_id_limit(*, trigger: bool) -> int:
    """How long an instance's request id may be: a trigger's keeps room for its run's
    sends (`TRIGGER_SENDS`, `sent_suffix_length`)."""
    return MAX_REQUEST_ID - (sent_suffix_length(TRIGGER_SENDS - 1) if trigger else 0)


def action_request_id(action: str, request_id: str) -> str:
    """The request id of a job `action` (enable, disable, reschedule, trigger) asked under
    the caller's `request_id` (`--request-id`, `Idempotency-Key`): `<action>:<request id>`,
    as a fresh one of `_command` begins. Used as is, a change id an operator reuses for the
    next action (a disable, then an enable of the same change) was that action's DUPLICATE:
    answered as done, nothing done. The ids of two actions differ; the same action asked
    again is the same id (a DUPLICATE). An id that begins with `<action>:` already (one an
    answer named, sent again as it said) is that action's id: kept as it is."""
    prefix = f"{action}:"
    return request_id if request_id.startswith(prefix) else prefix + request_id


def _instance_ref(
    context: str, job: Job, tenant: str, partition: int | None, partitions: int | None
) -> AggregateRef:
    if job.scope is not JobScope.SHARDED:
        return ref_of(context, job, tenant)
    if partition is None or partitions is None:
        raise ValueError(f"job {job.name!r} is SHARDED: give partition and partitions")
    return shard_ref(context, job, partition, partitions)


def _command(
    ref: AggregateRef, type_: str, body: dict[str, Any], now: int | None, request_id: str | None
) -> CommandEnvelope:
    # A fresh request id by default: a deterministic one would make an Enable after a
    # Disable a DUPLICATE of the first, and the aggregate makes a repeat harmless anyway
    # (UNCHANGED). A caller that retries one request passes its own id. Begun with its
    # verb, as `action_request_id` makes a caller's: sent again as it is, it is the same.
    verb = type_.rsplit(".", 1)[-1].lower()
    fresh = uuid.uuid4().hex
    # The prefix only helps a reader; the uuid makes it unique: cut to fit a request id.
    named = f"{verb}:{ref.tenant}:{ref.id}"[: MAX_REQUEST_ID - len(fresh) - 1]
    return CommandEnvelope(
        request_id=request_id or f"{named}:{fresh}",
        type=type_,
        aggregate=ref,
        body=body,
        issued_at=int(time.time() * 1000) if now is None else now,
    )


def enable_command(
    context: str,
    job: Job,
    *,
    tenant: str = DEFAULT_TENANT,
    partition: int | None = None,
    partitions: int | None = None,
    rule: Mapping[str, Any] | None = None,
    now: int | None = None,
    request_id: str | None = None,
) -> CommandEnvelope:
    """`wow.schedule.Enable` of one instance of `job` (a SHARDED one: of `partition`)."""
    body: dict[str, Any] = {"job": job.name}
    if rule is not None:
        body["rule"] = dict(rule)
    ref = _instance_ref(context, job, tenant, partition, partitions)
    return _command(ref, ENABLE, body, now, request_id)


def enable_commands(
    context: str,
    job: Job,
    *,
    partitions: int,
    tenants: Iterable[str] = (DEFAULT_TENANT,),
    now: int | None = None,
) -> list[CommandEnvelope]:
    """Enables of every instance of `job`: per partition, per tenant (TENANT), or the one."""
    if job.scope is JobScope.SHARDED:
        return [
            enable_command(context, job, partition=p, partitions=partitions, now=now)
            for p in range(partitions)
        ]
    if job.scope is JobScope.SYSTEM:
        return [enable_command(context, job, now=now)]
    return [enable_command(context, job, tenant=t, now=now) for t in tenants]


def reschedule_command(
    context: str,
    job: Job,
    rule: Mapping[str, Any] | None,
    *,
    tenant: str = DEFAULT_TENANT,
    partition: int | None = None,
    partitions: int | None = None,
    now: int | None = None,
    request_id: str | None = None,
) -> CommandEnvelope:
    """`wow.schedule.Reschedule`: `rule` is the instance's override; None follows the default."""
    ref = _instance_ref(context, job, tenant, partition, partitions)
    body = {"rule": None if rule is None else dict(rule)}
    return _command(ref, RESCHEDULE, body, now, request_id)


def disable_command(
    context: str,
    job: Job,
    *,
    tenant: str = DEFAULT_TENANT,
    partition: int | None = None,
    partitions: int | None = None,
    now: int | None = None,
    request_id: str | None = None,
) -> CommandEnvelope:
    """`wow.schedule.Disable` of one instance of `job`."""
    ref = _instance_ref(context, job, tenant, partition, partitions)
    return _command(ref, DISABLE, {}, now, request_id)


def trigger_command(
    context: str,
    job: Job,
    *,
    tenant: str = DEFAULT_TENANT,
    partition: int | None = None,
    partitions: int | None = None,
    now: int | None = None,
    request_id: str | None = None,
) -> CommandEnvelope:
    """`wow.schedule.Trigger`: one run of the instance now. Sent again with the same
    `request_id` (the envelope itself, or the caller's id) it runs once."""
    ref = _instance_ref(context, job, tenant, partition, partitions)
    return _command(ref, TRIGGER, {}, now, request_id)


def backfill_command(
    ref: AggregateRef, slot: BackfillSlot, *, now: int | None = None
) -> CommandEnvelope:
    """`wow.schedule.Backfill` of one past slot of the instance `ref`, under the request id
    of that slot's live tick (`BackfillSlot.request_id`)."""
    body = {"slot": slot.slot, "due_at": slot.due_at, "timer_id": slot.timer_id}
    return _command(ref, BACKFILL, body, now, slot.request_id)
