"""A job's declaration: its name, scope, default rule and handler, the refs of its
instances, and the names of the schedule aggregate's commands and events (see
`app.jobs` for what a job is)."""

from __future__ import annotations

import logging
import re
import reprlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from app.model.aggregate import Decision
from app.model.user_code import plain_function
from tables import DEFAULT_TENANT, AggregateRef, CronRule, IntervalRule, OnceRule
from tables.bounds import MAX_INSTANT
from tables.exceptions import InvalidRule
from tables.partitioner import partition_of
from tables.rules import parse_rule

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
TRIGGER: Final = "wow.schedule.Trigger"
"""Runs the handler once now, outside the rule: an operator's `jobs trigger`."""
TRIGGERED: Final = "wow.schedule.Triggered"
BACKFILL: Final = "wow.schedule.Backfill"
"""Runs one past slot of a tick timer, under that slot's own request id `<timer id>#<slot>`."""
BACKFILLED: Final = "wow.schedule.Backfilled"
TRIGGERED_SLOT: Final = -1
"""The `JobRun.slot` of a triggered run: it is no slot of the rule."""
TICK_KEY: Final = "tick"
RUN_KEY_PREFIX: Final = "run:"

Rule = OnceRule | IntervalRule | CronRule

MIN_JOB_EVERY_MS: Final = 1_000
"""The shortest `every` of a job's interval rule, a second: a cron rule's finest step (six
fields, seconds first). Each slot is a tick, a transaction of its own and a handler's run,
for each instance: a job of a millisecond's interval would flood its node. A timer's
interval rule has no such floor."""

MAX_JOB_EVERY_MS: Final = MAX_INSTANT
"""The longest `every` of a job's interval rule: any longer, its second slot is past
9999-12-31T23:59:59.999Z whatever its start, and the job runs once at most."""

# No `~`: it separates a SHARDED instance's parts, so no job's ids can be another's.
_JOB_NAME = re.compile(r"[A-Za-z0-9_-]{1,100}")


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
    triggered: bool = False
    """True for a run an operator triggered (`wow.schedule.Trigger`): its `slot` is
    `TRIGGERED_SLOT`, its `due_at` the trigger's time, its `request_id` the trigger's."""
    backfilled: bool = False
    """True for a past slot run by a backfill (`wow.schedule.Backfill`)."""

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
        if not _JOB_NAME.fullmatch(self.name):
            raise ValueError(f"job name {self.name!r}: use 1-100 letters, digits, '-' or '_'")
        object.__setattr__(self, "scope", JobScope(self.scope))
        # Refused here, where the service is declared: taken, each Enable of it would
        # answer ERROR and each tick of an instance enabled before would fail and park.
        if not isinstance(self.rule, OnceRule | IntervalRule | CronRule):
            raise TypeError(
                f"job {self.name!r}: its rule must be a OnceRule, IntervalRule or CronRule, "
                f"not {type(self.rule).__name__} {reprlib.repr(self.rule)}"
            )
        if (why := job_rule_error(self.rule)) is not None:
            raise ValueError(f"job {self.name!r}: {why}")
        if not callable(self.handler):
            raise TypeError(
                f"job {self.name!r}: its handler must be callable (a function taking a "
                f"JobRun), not {type(self.handler).__name__} {reprlib.repr(self.handler)}"
            )
        plain_function(self.handler, f"the handler of job {self.name}")


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


MAX_SHARD_MAPS: Final = 1_024
"""The most (job, partition count) pairs whose shard ids `_shard_id` keeps, each at most
one id per partition: a service's SHARDED jobs at one partition count, with room to spare.
Past it the oldest pair's ids are forgotten (found again if asked for)."""

# (job, partitions) -> partition -> its id. Kept, not an LRU cache of single ids: finding
# one partition's id takes about `partitions` hash calls, so all of a job's take about
# partitions**2 (1,024 partitions: ~1M); a 4,096-entry cache scanned by 5 such jobs kept
# none of them and found every id afresh on each listing and each tick's check. The ids are
# persisted (the aggregate ids of instances), so each is still the first `<job>~<p>~<n>` in
# its partition, found once per process. A listing may run in a thread: a lookup or a
# store is atomic under the GIL (two finding the same id store the same one); the lock
# guards only adding and forgetting a pair.
_shard_maps: dict[tuple[str, int], dict[int, str]] = {}
_shard_maps_lock = threading.Lock()


def _shard_id(job: str, partition: int, partitions: int) -> str:
    ids = _shard_maps.get((job, partitions))
    if ids is None:
        with _shard_maps_lock:
            if len(_shard_maps) >= MAX_SHARD_MAPS and (job, partitions) not in _shard_maps:
                del _shard_maps[next(iter(_shard_maps))]
            ids = _shard_maps.setdefault((job, partitions), {})
    found = ids.get(partition)
    if found is None:
        found = ids[partition] = _first_shard_id(job, partition, partitions)
    return found


def _first_shard_id(job: str, partition: int, partitions: int) -> str:
    n = 0
    # About `partitions` tries: each candidate lands in a partition uniformly.
    while partition_of(f"{job}~{partition}~{n}", partitions) != partition:
        n += 1
    return f"{job}~{partition}~{n}"


def instance_ids(context: str, job: Job, partitions: int) -> set[str]:
    """The ids of `job`'s instances: its name (in each tenant), or one per log partition.
    A SHARDED job's are found once per process (about `partitions` squared hash calls, a
    few seconds for 1,024 partitions) and kept: a caller on an event loop runs the first
    listing in a thread."""
    if job.scope is JobScope.SHARDED:
        return {shard_ref(context, job, p, partitions).id for p in range(partitions)}
    return {job.name}


def is_instance_id(job: Job, instance: str, partitions: int) -> bool:
    """Whether `instance` is in `instance_ids` of `job`, without listing them: a SHARDED
    instance's id `<job>~<partition>~<n>` names its partition, whose one id is found alone
    (listing them all tries about `partitions` ids for each partition), once per process:
    a tick's check is a lookup after its partition's first."""
    if job.scope is not JobScope.SHARDED:
        return instance == job.name
    parts = instance.split("~")
    if len(parts) != 3 or parts[0] != job.name:
        return False
    partition = parts[1]
    # isascii: isdigit() is true of "²", which int() refuses.
    if not (partition.isascii() and partition.isdigit()) or int(partition) >= partitions:
        return False
    return instance == _shard_id(job.name, int(partition), partitions)


def not_its_instance(job: Job, ref: AggregateRef, partitions: int) -> str | None:
    """Why `ref` is not an instance of `job` as the job is declared now (its scope, its
    shards: an instance enabled under another scope is not), or None."""
    name = job.name
    if job.scope is not JobScope.TENANT and ref.tenant != DEFAULT_TENANT:
        return (
            f"job {name!r} is {job.scope}: its instances are in the default tenant "
            f"{DEFAULT_TENANT!r}, not in {ref.tenant!r}"
        )
    if not is_instance_id(job, ref.id, partitions):
        expected = (
            f"shard_ref(context, {name!r}, partition, {partitions}) gives them"
            if job.scope is JobScope.SHARDED
            else f"its id is {name!r}"
        )
        return f"{ref.id!r} is not an instance of job {name!r}: {expected}"
    return None


def job_rule_error(rule: Rule) -> str | None:
    """Why `rule` can be no job's (an interval rule's `every` shorter than
    `MIN_JOB_EVERY_MS` or longer than `MAX_JOB_EVERY_MS`), or None."""
    if not isinstance(rule, IntervalRule):
        return None
    if rule.every < MIN_JOB_EVERY_MS:
        return (
            f"every {rule.every} ms is shorter than a job's shortest interval, "
            f"{MIN_JOB_EVERY_MS} ms (1 s, a cron rule's finest step)"
        )
    if rule.every > MAX_JOB_EVERY_MS:
        return (
            f"every {rule.every} ms is longer than a job's longest interval, "
            f"{MAX_JOB_EVERY_MS} ms: its second slot would be past the year 9999 "
            "(a once rule runs a job once)"
        )
    return None


def effective_rule(
    default: Rule, override: Mapping[str, Any] | None, *, strict: bool = False
) -> Rule:
    """`default` under `override` (parts of a rule, see the module); `InvalidRule` if bad.
    `strict` for an override given now (`parse_rule`), which must also be a job's rule
    (`job_rule_error`); lax for one an instance kept, as an earlier version took it."""
    if not override:
        return default
    base = default.model_dump(mode="json")
    if override.get("kind", base["kind"]) != base["kind"]:
        rule = parse_rule(dict(override), strict=strict)
    else:
        rule = parse_rule({**base, **override}, strict=strict)
    if strict and (why := job_rule_error(rule)) is not None:
        raise InvalidRule(why)
    return rule


def _name(job: str | Job) -> str:
    return job if isinstance(job, str) else job.name
