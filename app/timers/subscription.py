"""The timers subscription: what each event of an aggregate's log does to its TimerStore.

`timer_op` is the pure mapping (an event → put, cancel, pause, resume, cancel-all or
nothing; a set's Timer built by `timer_build`); `apply`
carries one out. Being a view, replaying the log from the start rebuilds the store: every
operation is idempotent and ordered by the owner's version.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from pydantic import ValidationError

from app.errors import BadRecord, node_fault
from app.protocol.limits import DEFAULT_MAX_RECORD_BYTES
from app.protocol.wire import (
    AGGREGATE_DELETED,
    SCHEDULE_CANCELLED,
    SCHEDULE_PAUSED,
    SCHEDULE_RESUMED,
    SCHEDULE_SET,
    EventEnvelope,
    ScheduleCancelled,
    SchedulePaused,
    ScheduleResumed,
    ScheduleSet,
    error_reason,
)
from app.timers.timer_build import build_timer
from app.timers.timer_sizes import DEFAULT_TOPICS, oversized
from tables import AggregateRef, Timer
from tables.refs import NEW_INPUT
from tables.rules import OnceRule, ScheduleRule
from tables.slots import first_slot
from tables.store import TimerWrites
from tables.tombstones import CancelMark

__all__ = [
    "CancelAllTimers",
    "CancelTimer",
    "PauseTimer",
    "PutTimer",
    "ResumeTimer",
    "TimerOp",
    "apply",
    "apply_all",
    "op_key",
    "timer_op",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PutTimer:
    timer: Timer


@dataclass(frozen=True, slots=True)
class CancelTimer:
    owner: AggregateRef
    key: str
    version: int
    mark: CancelMark | None = None
    """Where and when it was read: a key that holds no timer is left a tombstone
    (`tables.tombstones`), so that an older set of it read after is passed over."""
    refused: str | None = None
    """A set whose timer cannot be stored (`timer_sizes.oversized`), why: the timer it
    replaces is cancelled all the same (its owner replaced it; left, it would fire by the
    rule replaced), and the set's record is dead-lettered with this."""
    refused_timer: Timer | None = None
    """With `refused`: the timer the set would have stored (a read-back finds whether the
    table holds it from the set's own command, stored under limits lowered since)."""


@dataclass(frozen=True, slots=True)
class CancelAllTimers:
    owner: AggregateRef
    version: int
    mark: CancelMark | None = None
    """Where and when it was read: the owner's deletion mark, which passes over any older
    set of the owner read after it (`tables.tombstones`)."""


@dataclass(frozen=True, slots=True)
class PauseTimer:
    owner: AggregateRef
    key: str
    version: int


@dataclass(frozen=True, slots=True)
class ResumeTimer:
    owner: AggregateRef
    key: str
    version: int
    at: int
    """The event's own time: the catch-up is decided there, the same on every replay."""


TimerOp = PutTimer | CancelTimer | PauseTimer | ResumeTimer | CancelAllTimers


def timer_op(
    event: EventEnvelope,
    partition: int,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    now: int | None = None,
    *,
    topic_bytes: Mapping[str, int] = DEFAULT_TOPICS,
) -> TimerOp | None:
    """What `event`, read from `partition` of its log, does to the timers; None: nothing.

    `BadRecord` for a system event whose body cannot be a timer (invalid rule, …). A set
    whose timer's records the node could not write or read back (`timer_sizes.oversized`:
    `max_record_bytes` is the node's `TICKWHEEL_MAX_RECORD_BYTES`, `topic_bytes` what its
    own topics take, `InputLimits.topic_record_bytes`) cancels the timer it replaces,
    `refused` saying why its record is dead-lettered.

    A cancel's tombstone, or a deletion's mark (`tables.tombstones`), is finished at the
    later of the event's own time (at most `MARK_AHEAD_MS` ahead) and `now` (the node's;
    None: the event's time): kept `finished_retention` from then, however old the event.
    """
    try:
        if event.type == SCHEDULE_SET:
            schedule: ScheduleSet = _schedule_set(event.body, strict=True, context=NEW_INPUT)
            if _ended(schedule.rule, event.created_at):
                # Set again to a rule whose end has passed: the timer under the key is
                # done (left in place, it would go on firing by the rule it replaces).
                return CancelTimer(
                    event.aggregate, schedule.key, event.version, _mark(event, partition, now)
                )
            timer = build_timer(event, schedule, partition)
            if (why := oversized(timer, max_record_bytes, topic_bytes)) is not None:
                return CancelTimer(
                    event.aggregate,
                    schedule.key,
                    event.version,
                    _mark(event, partition, now),
                    refused=f"{SCHEDULE_SET} {event.id}: {why}",
                    refused_timer=timer,
                )
            return PutTimer(timer)
        if event.type == SCHEDULE_CANCELLED:
            body = ScheduleCancelled.model_validate(event.body, strict=True, context=NEW_INPUT)
            return CancelTimer(
                event.aggregate, body.key, event.version, _mark(event, partition, now)
            )
        if event.type == SCHEDULE_PAUSED:
            paused = SchedulePaused.model_validate(event.body, strict=True, context=NEW_INPUT)
            return PauseTimer(event.aggregate, paused.key, event.version)
        if event.type == SCHEDULE_RESUMED:
            resumed = ScheduleResumed.model_validate(event.body, strict=True, context=NEW_INPUT)
            return ResumeTimer(event.aggregate, resumed.key, event.version, event.created_at)
    except ValidationError as exc:
        raise BadRecord(f"{event.type} {event.id}: {_first_error(exc)}") from exc
    if event.type == AGGREGATE_DELETED:
        return CancelAllTimers(event.aggregate, event.version, _mark(event, partition, now))
    return None


MARK_AHEAD_MS: Final = 60_000
"""How far ahead of `now` a mark's event may date it: at year 9999 its row stayed for ever."""


def _mark(event: EventEnvelope, partition: int, now: int | None) -> CancelMark:
    at = event.created_at if now is None else min(max(event.created_at, now), now + MARK_AHEAD_MS)
    return CancelMark(partition, event.id, at)


def _ended(rule: ScheduleRule, at: int) -> bool:
    """Whether `rule` has no slot left at `at` because its `until` or `count` passed (one
    with no slot at all, as a cron expression that never matches, is bad input)."""
    if isinstance(rule, OnceRule) or (rule.until is None and rule.count is None):
        return False
    if first_slot(rule, at) is not None:
        return False
    return first_slot(rule.model_copy(update={"until": None, "count": None}), at) is not None


# The body's validator called directly, without `model_validate`'s wrapper: the same
# validation, a little less per ingested timer. Bodies are validated as `wire.decode`
# validates the envelope, as new input (the body is JSON read from the log; strict Python
# mode takes a nested model's dict, and these bodies hold no enum).
_schedule_set = ScheduleSet.__pydantic_validator__.validate_python


def op_key(op: TimerOp) -> tuple[AggregateRef, str] | None:
    """The timer an op is about (its owner and key); None for a `CancelAllTimers`."""
    if isinstance(op, PutTimer):
        return op.timer.owner, op.timer.key
    if isinstance(op, CancelAllTimers):
        return None
    return op.owner, op.key


async def apply(store: TimerWrites, op: TimerOp) -> bool:
    """Carries `op` out on `store` (the whole store, or a partition's handle); whether it
    changed anything."""
    match op:
        case PutTimer(timer):
            return await store.put(timer)
        case CancelTimer(owner, key, version, mark):
            return await store.cancel(owner, key, version, mark)
        case PauseTimer(owner, key, version):
            return await store.pause(owner, key, version)
        case ResumeTimer(owner, key, version, at):
            return await store.resume(owner, key, version, at) is not None
        case CancelAllTimers(owner, version, mark):
            # With its mark it writes the owner's deletion mark (unless one as late is held,
            # a replay): counted a change either way, so that its cycle commits what it wrote.
            return await store.cancel_all(owner, version, mark) > 0 or mark is not None


async def apply_all(
    store: TimerWrites,
    ops: list[TimerOp],
    refused: Callable[[int, Exception], None] | None = None,
) -> tuple[int, list[Timer]]:
    """Carries `ops` out in order, each run of puts as one store write: how many changed
    anything, and the timers the puts and resumes wrote (due again: the runner's wheel is
    offered them). An op the store refuses (not a fault of its own, `node_fault`) changes
    nothing and is told to `refused` (its index in `ops`); every other op is carried out
    all the same (a run of puts refused is written again put by put). Without `refused`
    the first op refused raises."""
    changed = 0
    written: list[Timer] = []
    run: list[Timer] = []  # the puts of the run under way
    at: list[int] = []  # their indices in `ops`

    async def carry(i: int, op: TimerOp) -> None:
        nonlocal changed
        try:
            if isinstance(op, PutTimer):
                written.extend(await store.put_many([op.timer]))
            elif isinstance(op, ResumeTimer):
                if (resumed := await store.resume(op.owner, op.key, op.version, op.at)) is not None:
                    written.append(resumed)
            else:
                changed += await apply(store, op)
        except Exception as exc:
            if node_fault(exc) or refused is None:
                raise
            refused(i, exc)

    async def put_run() -> None:
        try:
            written.extend(await store.put_many(run))
        except Exception as exc:
            if node_fault(exc) or refused is None:
                raise
            # Which of them: each alone (a store refusing a write writes none of it).
            for i in at:
                await carry(i, ops[i])
        run.clear()
        at.clear()

    for i, op in enumerate(ops):
        if isinstance(op, PutTimer):
            run.append(op.timer)
            at.append(i)
            continue
        if run:
            await put_run()
        await carry(i, op)
    if run:
        await put_run()
    return changed + len(written), written


def _first_error(exc: ValidationError) -> str:
    return error_reason(exc.errors()[0])
