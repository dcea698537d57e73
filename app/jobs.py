"""Jobs: handlers a service runs by a schedule, kept by the built-in `<context>.schedule`.

A job is declared once per context (name, scope, default rule, handler). Each of its
instances is one `schedule` aggregate: `wow.schedule.Enable` makes it schedule its own
`wow.schedule.Tick` under the key `tick`, and each tick of a slot newer than the last one
run commits `wow.Ticked` and runs the handler, whose commands (`JobRun.send`) commit in the
same transaction as that event. A repeated tick is a DUPLICATE, or changes nothing, and
runs nothing: a job's effects are applied once per slot.

A handler that raises does not stop the schedule: the tick commits `wow.Ticked` all the
same (the instance ticks on, its later slots on time) with `wow.schedule.RunFailed`, none
of the handler's commands, and a one-off timer of the instance under the key
`run:<timer digest>#<slot>` (`run_key`), due at once, whose `wow.schedule.Run` runs the
handler for that slot again. That timer is retried, parked and put in the failure ledger
(its target: the instance) like any other, by `TimerOptions.retry`; `tickwheel timers
retry|skip --type <context>.schedule --target-id <instance>` retries or skips the parked
slots of an instance. A Run that succeeds commits `wow.schedule.Ran` with the handler's
commands; one that fails again commits nothing (ERROR). A disabled instance runs nothing.

An instance may override parts of its job's default rule. A part is one field of the rule
(`kind`, `expr`, `zone`, `start`, `every`, `at`, `coalesce`), and an override is a partial
rule: the fields it names replace the default's, the others follow the default, also when
the default changes (from the instance's next tick). `{"expr": "*/5 * * * *"}` keeps the
default's zone and coalesce. An override whose `kind` is not the default's is a rule of its
own: fields of two kinds do not mix, so it follows nothing of the default.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import lru_cache
from typing import Any, Final, NoReturn, TypeGuard

from pydantic import BaseModel

from app.aggregate import AggregateType, Command, Decision, Event
from app.wire import SCHEDULE_CANCELLED, SCHEDULE_SET, CommandEnvelope, ResultCode
from tables import DEFAULT_TENANT, AggregateRef, CommandSpec, CronRule, IntervalRule, OnceRule
from tables.exceptions import InvalidRule
from tables.partitioner import partition_of
from tables.rules import parse_rule

__all__ = [
    "DISABLE",
    "DISABLED",
    "ENABLE",
    "ENABLED",
    "RAN",
    "RESCHEDULE",
    "RESCHEDULED",
    "RUN",
    "RUN_FAILED",
    "RUN_KEY_PREFIX",
    "SCHEDULE",
    "TICK",
    "TICKED",
    "TICK_KEY",
    "Job",
    "JobRun",
    "JobScope",
    "ScheduleState",
    "disable_command",
    "effective_rule",
    "enable_command",
    "enable_commands",
    "instance_ids",
    "ref_of",
    "reschedule_command",
    "run_key",
    "schedule_aggregate",
    "shard_ref",
]

logger = logging.getLogger(__name__)

SCHEDULE: Final = "schedule"
ENABLE: Final = "wow.schedule.Enable"
RESCHEDULE: Final = "wow.schedule.Reschedule"
DISABLE: Final = "wow.schedule.Disable"
TICK: Final = "wow.schedule.Tick"
RUN: Final = "wow.schedule.Run"
"""Runs a slot whose handler failed again: sent by that slot's `run:` timer."""
ENABLED: Final = "wow.schedule.Enabled"
RESCHEDULED: Final = "wow.schedule.Rescheduled"
DISABLED: Final = "wow.schedule.Disabled"
TICKED: Final = "wow.Ticked"
RUN_FAILED: Final = "wow.schedule.RunFailed"
"""A slot's handler failed on its tick: the slot's `run:` timer runs it again."""
RAN: Final = "wow.schedule.Ran"
"""A slot whose handler had failed ran: its commands commit with this event."""
TICK_KEY: Final = "tick"
RUN_KEY_PREFIX: Final = "run:"

Rule = OnceRule | IntervalRule | CronRule

# No `~`: it separates a SHARDED instance's parts, so no job's ids can be another's.
_JOB_NAME = re.compile(r"^[A-Za-z0-9_-]{1,100}$")


class JobScope(StrEnum):
    SYSTEM = "SYSTEM"
    """One instance, in the default tenant."""
    TENANT = "TENANT"
    """One instance per tenant that enables it."""
    SHARDED = "SHARDED"
    """One instance per log partition, in the default tenant (`shard_ref`)."""


@dataclass(frozen=True, slots=True)
class JobRun:
    """What a job's handler gets for one slot; `send` commits with the slot's `wow.Ticked`."""

    context: str
    job: str
    instance: str
    tenant: str
    partition: int | None
    """The log partition of a SHARDED job's instance; None for other scopes."""
    slot: int
    due_at: int
    request_id: str
    """The slot's tick's request id (`<timer id>#<slot>`), on a retry too."""
    now: int
    _decision: Decision = field(repr=False, compare=False)
    retried: bool = False
    """True when a slot whose handler failed runs again (`wow.schedule.Run`)."""

    def send(self, target: AggregateRef, type_: str, body: Mapping[str, Any] | None = None) -> None:
        """Sends a command in the tick's transaction: it commits once, with the slot."""
        self._decision.send(target, type_, body)


@dataclass(frozen=True, slots=True)
class Job:
    """A job of a context: its instances tick by `rule` (under their overrides)."""

    name: str
    scope: JobScope
    rule: Rule
    handler: Callable[[JobRun], None]

    def __post_init__(self) -> None:
        if not _JOB_NAME.match(self.name):
            raise ValueError(f"job name {self.name!r}: use 1-100 letters, digits, '-' or '_'")
        object.__setattr__(self, "scope", JobScope(self.scope))


def ref_of(context: str, job: str | Job, tenant: str = DEFAULT_TENANT) -> AggregateRef:
    """The instance of `job` in `tenant` of `context`: its id is the job's name."""
    return AggregateRef(context=context, aggregate=SCHEDULE, tenant=tenant, id=_name(job))


def shard_ref(context: str, job: str | Job, partition: int, partitions: int) -> AggregateRef:
    """The SHARDED job's instance for log `partition` of `partitions`, in the default tenant:
    the first id `<job>~<partition>~<n>` that lies in that partition, so that its ticks run
    on the partition's owner."""
    if not 0 <= partition < partitions:
        raise ValueError(f"partition {partition} is not one of {partitions} partitions")
    return AggregateRef(
        context=context, aggregate=SCHEDULE, id=_shard_id(_name(job), partition, partitions)
    )


@lru_cache(maxsize=4096)
def _shard_id(job: str, partition: int, partitions: int) -> str:
    n = 0
    # About `partitions` tries: each candidate lands in a partition uniformly.
    while partition_of(f"{job}~{partition}~{n}", partitions) != partition:
        n += 1
    return f"{job}~{partition}~{n}"


def instance_ids(context: str, job: Job, partitions: int) -> set[str]:
    """The ids of `job`'s instances: its name (in each tenant), or one per log partition."""
    if job.scope is JobScope.SHARDED:
        return {shard_ref(context, job, p, partitions).id for p in range(partitions)}
    return {job.name}


def effective_rule(default: Rule, override: Mapping[str, Any] | None) -> Rule:
    """`default` under `override` (parts of a rule, see the module); `InvalidRule` if bad."""
    if not override:
        return default
    base = default.model_dump(mode="json")
    if override.get("kind", base["kind"]) != base["kind"]:
        return parse_rule(dict(override))
    return parse_rule({**base, **override})


class ScheduleState(BaseModel):
    """One job instance: its override, the rule it ticks by, and the last slot it ran."""

    job: str = ""
    enabled: bool = False
    override: dict[str, Any] | None = None
    """The instance's own parts of the rule; kept while disabled."""
    rule: dict[str, Any] | None = None
    """The rule of the current `tick` timer, as scheduled."""
    timer_id: str | None = None
    """The current `tick` timer: ticks of any other are of an older one."""
    last_slot: int | None = None
    """The last slot of `timer_id` that ran."""
    last_due_at: int | None = None
    """When the last slot that ran was due."""


def schedule_aggregate(
    context: str, jobs: Iterable[Job], partitions: int
) -> AggregateType[ScheduleState]:
    """The model of `<context>.schedule`, deciding for `jobs` on a log of `partitions`."""
    if partitions < 1:
        raise ValueError(f"partitions must be at least 1, got {partitions}")
    by_name: dict[str, Job] = {}
    for job in jobs:
        if job.name in by_name:
            raise ValueError(f"job {job.name!r} declared twice in {context}")
        by_name[job.name] = job
    model = _ScheduleModel(context, by_name, partitions)
    agg = AggregateType(context, SCHEDULE, ScheduleState)
    agg.command(ENABLE)(model.enable)
    agg.command(RESCHEDULE)(model.reschedule)
    agg.command(DISABLE)(model.disable)
    agg.command(TICK)(model.tick)
    agg.command(RUN)(model.run)
    for event in (
        ENABLED,
        RESCHEDULED,
        DISABLED,
        TICKED,
        RUN_FAILED,
        RAN,
        SCHEDULE_SET,
        SCHEDULE_CANCELLED,
    ):
        agg.applies(event)(_apply)
    return agg


class _ScheduleModel:
    def __init__(self, context: str, jobs: Mapping[str, Job], partitions: int) -> None:
        self.context = context
        self.jobs = jobs
        self.partitions = partitions

    def enable(self, state: ScheduleState, cmd: Command, d: Decision) -> None:
        job = self._job_to_enable(cmd, d)
        override = cmd.body.get("rule")
        if override is None:
            override = state.override
        _set_rule(state, job, override, ENABLED, d)

    def reschedule(self, state: ScheduleState, cmd: Command, d: Decision) -> None:
        if not state.enabled:
            _invalid(d, f"{cmd.aggregate} is not enabled: Enable it before rescheduling it")
        job = self.jobs.get(state.job)
        if job is None:
            _invalid(d, f"job {state.job!r} is not declared in {self.context} any more")
        _set_rule(state, job, cmd.body.get("rule"), RESCHEDULED, d)

    def disable(self, state: ScheduleState, cmd: Command, d: Decision) -> None:
        if state.enabled:
            d.emit(DISABLED, {"reason": "disabled by command"})
            d.cancel_schedule(TICK_KEY)

    def tick(self, state: ScheduleState, cmd: Command, d: Decision) -> None:
        if not state.enabled:
            return
        job = self.jobs.get(state.job)
        if job is None:
            logger.warning("%s: job %r is no longer declared: disabling", cmd.aggregate, state.job)
            d.emit(DISABLED, {"reason": f"job {state.job!r} is no longer declared"})
            d.cancel_schedule(TICK_KEY)
            return
        timer_id, sep, slot_text = cmd.request_id.rpartition("#")
        if not sep or not slot_text.isdigit():
            d.reject(f"a {TICK} comes from a timer: {cmd.request_id!r} is not '<timer id>#<slot>'")
        slot = int(slot_text)
        if timer_id != state.timer_id or (state.last_slot is not None and slot <= state.last_slot):
            logger.debug(
                "%s: %s is not a newer slot: nothing to run", cmd.aggregate, cmd.request_id
            )
            return
        # A timer's send always carries its slot's due time; a hand-made tick is due now.
        due_at = cmd.not_before if cmd.not_before is not None else d.now
        d.emit(TICKED, {"slot": slot, "due_at": due_at, "timer_id": timer_id})
        # The handler decides into a scratch decision: a failure keeps none of its commands.
        scratch = Decision(aggregate=d.aggregate, now=d.now, request_id=d.request_id)
        error = _run_handler(job, self._run(job, cmd, slot, due_at, cmd.request_id, scratch))
        if error is None:
            d.commands.extend(scratch.commands)
        else:
            # The schedule ticks on; the slot is run again by a timer of its own, which the
            # runner retries, parks and puts in the ledger as it does any timer.
            key = run_key(timer_id, slot)
            slot_ref = {
                "slot": slot,
                "due_at": due_at,
                "timer_id": timer_id,
                "request_id": cmd.request_id,
            }
            d.emit(RUN_FAILED, {**slot_ref, "key": key, "error": error})
            d.schedule(key, OnceRule(at=d.now), CommandSpec(type=RUN, body=slot_ref))
        try:
            rule = effective_rule(job.rule, state.override)
        except InvalidRule as exc:
            # The new default does not take the kept override: tick on as before until
            # an operator reschedules the instance.
            logger.error("%s: the default under the override is invalid: %s", cmd.aggregate, exc)
            return
        if (dumped := _dump(rule)) != state.rule:
            d.emit(RESCHEDULED, {"override": state.override, "rule": dumped, "reason": "default"})
            _schedule_tick(d, rule)

    def run(self, state: ScheduleState, cmd: Command, d: Decision) -> None:
        """A slot whose handler failed, run again by its `run:` timer."""
        body = cmd.body
        slot, due_at = body.get("slot"), body.get("due_at")
        timer_id, tick_id = body.get("timer_id"), body.get("request_id")
        if not (
            _is_count(slot)
            and _is_count(due_at)
            and isinstance(timer_id, str)
            and isinstance(tick_id, str)
        ):
            d.reject(f"a {RUN} names the slot it runs: slot, due_at, timer_id and request_id")
        if not state.enabled:
            logger.info("%s is disabled: slot %d of %s is not run", cmd.aggregate, slot, timer_id)
            return
        job = self.jobs.get(state.job)
        if job is None:
            logger.warning(
                "%s: job %r is no longer declared: nothing run", cmd.aggregate, state.job
            )
            return
        d.emit(
            RAN,
            {"slot": slot, "due_at": due_at, "timer_id": timer_id, "request_id": tick_id},
        )
        error = _run_handler(job, self._run(job, cmd, slot, due_at, tick_id, d, retried=True))
        if error is not None:
            # ERROR: nothing commits; the run timer retries the slot, then parks it.
            d.reject(f"job {job.name!r} failed again on slot {slot}: {error}", ResultCode.ERROR)

    def _run(
        self,
        job: Job,
        cmd: Command,
        slot: int,
        due_at: int,
        request_id: str,
        d: Decision,
        *,
        retried: bool = False,
    ) -> JobRun:
        return JobRun(
            context=self.context,
            job=job.name,
            instance=cmd.aggregate.id,
            tenant=cmd.aggregate.tenant,
            partition=_shard_partition(job, cmd.aggregate.id),
            slot=slot,
            due_at=due_at,
            request_id=request_id,
            now=d.now,
            _decision=d,
            retried=retried,
        )

    def _job_to_enable(self, cmd: Command, d: Decision) -> Job:
        name = cmd.body.get("job")
        if not isinstance(name, str) or not name:
            _invalid(d, f"{ENABLE} names no job: give the job's name as body.job")
        job = self.jobs.get(name)
        if job is None:
            known = ", ".join(sorted(self.jobs)) or "none"
            _invalid(d, f"unknown job {name!r} in {self.context} (its jobs: {known})")
        ref = cmd.aggregate
        if job.scope is not JobScope.TENANT and ref.tenant != DEFAULT_TENANT:
            _invalid(
                d,
                f"job {name!r} is {job.scope}: its instances are in the default tenant "
                f"{DEFAULT_TENANT!r}, not in {ref.tenant!r}",
            )
        if ref.id not in instance_ids(self.context, job, self.partitions):
            expected = (
                f"shard_ref(context, {name!r}, partition, {self.partitions}) gives them"
                if job.scope is JobScope.SHARDED
                else f"its id is {name!r}"
            )
            _invalid(d, f"{ref.id!r} is not an instance of job {name!r}: {expected}")
        return job


def _set_rule(state: ScheduleState, job: Job, parts: object, event: str, d: Decision) -> None:
    if parts is not None and not isinstance(parts, dict):
        _invalid(d, f"invalid rule for job {job.name!r}: expected an object of rule fields")
    override = parts or None  # no parts: the default itself
    try:
        rule = effective_rule(job.rule, override)
    except InvalidRule as exc:
        _invalid(d, f"invalid rule for job {job.name!r}: {exc}")
    dumped = _dump(rule)
    if state.enabled and state.override == override and state.rule == dumped:
        return
    d.emit(event, {"job": job.name, "override": override, "rule": dumped})
    # Only a new rule needs a new timer: the current one keeps its slots otherwise.
    if not state.enabled or state.rule != dumped:
        _schedule_tick(d, rule)


def run_key(timer_id: str, slot: int) -> str:
    """The key of the one-off timer that runs `slot` of the tick timer `timer_id` again:
    `run:<digest of the timer id>#<slot>`, one per failed slot of an instance."""
    digest = hashlib.blake2b(timer_id.encode(), digest_size=6).hexdigest()
    return f"{RUN_KEY_PREFIX}{digest}#{slot}"


def _run_handler(job: Job, run: JobRun) -> str | None:
    """Runs the handler; None when it returned, else what it raised."""
    try:
        job.handler(run)
    except Exception as exc:
        what = "failed again" if run.retried else "failed (its run: timer runs it again)"
        logger.exception("job %s on slot %d of %s %s", job.name, run.slot, run.instance, what)
        return repr(exc)
    return None


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _schedule_tick(d: Decision, rule: Rule) -> None:
    # Same key, later aggregate version: the new timer replaces the old one, whose ticks
    # then no longer match `timer_id`.
    d.schedule(TICK_KEY, rule, CommandSpec(type=TICK))


def _invalid(d: Decision, reason: str) -> NoReturn:
    logger.info("refused: %s", reason)
    d.reject(reason, ResultCode.SCHEDULE_JOB_INVALID)


def _dump(rule: Rule) -> dict[str, Any]:
    return rule.model_dump(mode="json")


def _name(job: str | Job) -> str:
    return job if isinstance(job, str) else job.name


def _shard_partition(job: Job, instance: str) -> int | None:
    if job.scope is not JobScope.SHARDED:
        return None
    return int(instance.split("~")[1])


def _apply(state: ScheduleState, e: Event) -> ScheduleState:
    body = e.body
    if e.type in (SCHEDULE_SET, SCHEDULE_CANCELLED) and body.get("key") != TICK_KEY:
        return state  # another timer of this aggregate: not the tick's
    updates: dict[str, dict[str, Any]] = {
        ENABLED: {"job": body.get("job"), "enabled": True, "override": body.get("override")},
        RESCHEDULED: {"override": body.get("override")},
        DISABLED: {"enabled": False},
        TICKED: {"last_slot": body.get("slot"), "last_due_at": body.get("due_at")},
        # A failed slot runs on its own timer: the instance's state does not wait for it.
        RUN_FAILED: {},
        RAN: {},
        # The event's id is the new timer's id: its slots count afresh.
        SCHEDULE_SET: {"timer_id": e.id, "rule": body.get("rule"), "last_slot": None},
        SCHEDULE_CANCELLED: {"timer_id": None, "last_slot": None},
    }
    return state.model_copy(update=updates[e.type])


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
    # (UNCHANGED). A caller that retries one request passes its own id.
    verb = type_.rsplit(".", 1)[-1].lower()
    return CommandEnvelope(
        request_id=request_id or f"{verb}:{ref.tenant}:{ref.id}:{uuid.uuid4().hex}",
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
