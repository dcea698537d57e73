"""One job instance's state (`<context>.schedule/<instance>`) and how its events fold it:
the job it runs, its override and rule, its current `tick` timer, the last slot it ran,
the slots of that timer a backfill ran ahead of its ticks and the `run:` timers of its
failed slots not run yet. The decisions that emit those
events are `app.jobs.schedule`'s (and `app.jobs.extra_runs`').
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any, Final, TypeGuard

from pydantic import BaseModel, Field

from app.jobs.declaration import (
    BACKFILLED,
    DISABLED,
    ENABLED,
    RAN,
    RESCHEDULED,
    RUN_FAILED,
    RUN_KEY_PREFIX,
    TICK_KEY,
    TICKED,
    TRIGGERED,
)
from app.model.aggregate import Event
from app.protocol.wire import SCHEDULE_CANCELLED, SCHEDULE_SET

__all__ = [
    "MAX_BACKFILLED_RUNS",
    "BackfilledRun",
    "ScheduleState",
    "apply_made",
    "apply_schedule_event",
    "is_one_off",
    "ran_through",
    "run_key",
    "timer_floor",
    "with_backfilled",
]


def run_key(timer_id: str, slot: int) -> str:
    """The key of the one-off timer that runs `slot` of the tick timer `timer_id` again:
    `run:<digest of the timer id>#<slot>`, one per failed slot of an instance. (Here, not
    in `app.jobs.runs`, because the fold needs it to tell which failed slot a `Ran` ran.)"""
    digest = hashlib.blake2b(timer_id.encode(), digest_size=6).hexdigest()
    return f"{RUN_KEY_PREFIX}{digest}#{slot}"


def _empty(value: object) -> bool:
    return not value


def _none(value: object) -> bool:
    return value is None


MAX_BACKFILLED_RUNS: Final = 100
"""The runs of backfilled slots ahead of its ticks an instance keeps (`ScheduleState.
backfilled`): a backfill sends its range's slots in order, so each makes one, and the
instance's ticks drop them as they pass. A Backfill that would need one more is refused
(`app.jobs.runs.backfill_refusal`); its slot's live tick still runs it."""


class BackfilledRun(BaseModel):
    """Consecutive slots of the current tick timer that Backfills ran ahead of its ticks."""

    first: int
    last: int
    last_due_at: int
    """When slot `last` was due: the slot after it is found from it (`next_slot`)."""


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
    timer_set_at: int | None = None
    """When the current `tick` timer was set: its first slot is due no earlier."""
    last_slot: int | None = None
    """The last slot of `timer_id` that ran."""
    last_due_at: int | None = None
    """When the last slot that ran was due."""
    timer_after: int | None = Field(default=None, exclude_if=_none)
    """When the last slot that ran before the current `tick` timer was set was due (its
    `last_due_at` then): a slot of that timer due no later ran under an older one, its rule
    changed at that slot's due time or the clock stepped back since, and is not run again
    (`app.jobs.runs.ran_before`). Left out of the JSON while None, as `failed_runs`."""
    backfilled: list[BackfilledRun] = Field(default_factory=list, exclude_if=_empty)
    """The slots of the current `tick` timer newer than `last_slot` that a Backfill ran, as
    runs of consecutive slots, in order: their live ticks, under the same request ids, are
    DUPLICATEs, and a new rule replacing the timer does not run them again as slots it owes
    (`app.jobs.runs.owed_slots`). Dropped as the ticks pass them, all with the timer;
    `MAX_BACKFILLED_RUNS` at most. Left out of the JSON while empty, as `failed_runs`."""
    failed_runs: list[str] = Field(default_factory=list, exclude_if=_empty)
    """The keys of the `run:` timers of the failed slots not run yet, oldest first: at most
    `app.jobs.runs.MAX_FAILED_RUNS` once a tick dropped the older ones (that is what keeps
    a job failing for weeks from leaving a parked timer per slot for ever). Left out of the
    JSON while empty, so a state without failures is stored and listed as before it
    existed. A slot an operator skipped stays named until it is dropped (a skip is the
    timer table's, no event of the instance): its cancel then changes nothing."""


def apply_schedule_event(state: ScheduleState, e: Event) -> ScheduleState:
    """`state` after `e`: the applier of every event of `<context>.schedule`."""
    body = e.body
    key = body.get("key")
    if e.type in (SCHEDULE_SET, SCHEDULE_CANCELLED) and key != TICK_KEY:
        if e.type == SCHEDULE_CANCELLED and key in state.failed_runs:
            # A failed slot's run timer dropped (`app.jobs.runs.runs_to_drop`).
            return _without(state, key)
        return state  # another timer of this aggregate: not the tick's, nor a failed run's
    if e.type == RUN_FAILED:
        failed = key if isinstance(key, str) else _run_key_of(body)
        if failed is None or failed in state.failed_runs:
            return state
        return ScheduleState.model_validate(
            {**state.model_dump(), "failed_runs": [*state.failed_runs, failed]}
        )
    if e.type == RAN:
        ran = _run_key_of(body)
        return state if ran is None else _without(state, ran)
    if e.type == BACKFILLED:
        return _backfilled(state, body)
    updates: dict[str, dict[str, Any]] = {
        ENABLED: {"job": body.get("job"), "enabled": True, "override": body.get("override")},
        RESCHEDULED: {"override": body.get("override")},
        DISABLED: {"enabled": False},
        TICKED: {
            "last_slot": body.get("slot"),
            "last_due_at": body.get("due_at"),
            "backfilled": _ahead(state.backfilled, body.get("slot")),
        },
        # A run outside the live schedule: its state stays as it was.
        TRIGGERED: {},
        # The event's id is the new timer's id: its slots count afresh, after the last
        # slot run (`last_due_at` is kept: the older timer's, until the new one runs one).
        SCHEDULE_SET: {
            "timer_id": e.id,
            "timer_set_at": e.created_at,
            "timer_after": timer_floor(body.get("rule"), state.rule, ran_through(state)),
            "rule": body.get("rule"),
            "last_slot": None,
            "backfilled": [],
        },
        # The slots a backfill ran ahead of the ticks go with the timer, not that they
        # ran: the last slot run is the latest of them (a one-off's, set again, ran).
        SCHEDULE_CANCELLED: {
            "timer_id": None,
            "timer_set_at": None,
            "timer_after": None,
            "last_slot": None,
            "last_due_at": ran_through(state),
            "backfilled": [],
        },
    }
    update = updates[e.type]
    if not update:
        return state
    # Validated, not `model_copy`'d: another writer's event (`follow`) may carry anything,
    # and a state holding `{"job": 5}` would fail every later command of the instance.
    # Raised here, the event is dead-lettered by `follow` and passed over by a restore.
    return ScheduleState.model_validate({**state.model_dump(), **update})


def apply_made(
    state: ScheduleState, made: Iterable[tuple[str, dict[str, Any]]], now: int
) -> ScheduleState:
    """`state` after the events a decision made so far (`Decision.events`), made at `now`."""
    for type_, body in made:
        state = apply_schedule_event(state, Event(type_, body, 0, now))
    return state


def with_backfilled(runs: list[BackfilledRun], slot: int, due_at: int) -> list[BackfilledRun]:
    """`runs` (`ScheduleState.backfilled`) with `slot`, due at `due_at`: joined to the run
    it extends, or one of its own, in order of slot; as they were if it is in one."""
    out: list[BackfilledRun] = []
    new = BackfilledRun(first=slot, last=slot, last_due_at=due_at)
    for run in sorted([*runs, new], key=lambda r: (r.first, r.last)):
        if out and run.first <= out[-1].last + 1:
            if run.last > out[-1].last:
                out[-1] = out[-1].model_copy(
                    update={"last": run.last, "last_due_at": run.last_due_at}
                )
        else:
            out.append(run)
    return out


def _backfilled(state: ScheduleState, body: Mapping[str, Any]) -> ScheduleState:
    """A Backfill of a slot of the current tick timer newer than the last one run is kept
    (`ScheduleState.backfilled`); any other is a run outside the live schedule."""
    slot, due_at, timer_id = body.get("slot"), body.get("due_at"), body.get("timer_id")
    if timer_id is None or timer_id != state.timer_id or not _is_int(slot):
        return state
    if not _is_int(due_at) or (state.last_slot is not None and slot <= state.last_slot):
        return state
    return state.model_copy(update={"backfilled": with_backfilled(state.backfilled, slot, due_at)})


def _ahead(runs: list[BackfilledRun], slot: object) -> list[BackfilledRun]:
    """The runs with a slot after `slot`, which ticked: those before it are passed."""
    return [r for r in runs if not _is_int(slot) or r.last > slot]


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _run_key_of(body: Mapping[str, Any]) -> str | None:
    """The run key of the slot a `RunFailed` or `Ran` names (its timer and slot)."""
    timer_id, slot = body.get("timer_id"), body.get("slot")
    if not isinstance(timer_id, str) or not isinstance(slot, int) or isinstance(slot, bool):
        return None
    return run_key(timer_id, slot)


def _without(state: ScheduleState, key: str) -> ScheduleState:
    if key not in state.failed_runs:
        return state
    return state.model_copy(update={"failed_runs": [k for k in state.failed_runs if k != key]})


def ran_through(state: ScheduleState) -> int | None:
    """When the latest slot the instance ran was due: the last one ticked, or one a
    backfill ran ahead of the ticks (`ScheduleState.backfilled`)."""
    dues = [r.last_due_at for r in state.backfilled]
    if state.last_due_at is not None:
        dues.append(state.last_due_at)
    return max(dues, default=None)


def timer_floor(rule: Any, previous: Any, last_due_at: int | None) -> int | None:
    """The `timer_after` of a tick timer set with `rule` (as its `ScheduleSet` body holds
    it) after one set with `previous`, the last slot run having been due at `last_due_at`.

    A one-off rule is the operator's explicit run at its instant, however near the last
    slot run: none, so it is never taken for a slot that ran already. Unless it is the
    same one-off set again (an Enable after a Disable, reusing the kept override, or a
    one-off default) whose instant ran (the last slot run was due at it): that is no new
    instruction, and its slot ran."""
    if not is_one_off(rule):
        return last_due_at
    ran = last_due_at is not None and last_due_at == rule.get("at")
    return last_due_at if ran and rule == previous else None


def is_one_off(rule: Any) -> bool:
    """Whether a `ScheduleSet`'s rule, as its body holds it, is a one-off (`OnceRule`)."""
    return isinstance(rule, dict) and rule.get("kind") == "once"
