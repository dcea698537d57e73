"""One job instance's state (`<context>.schedule/<instance>`) and how its events fold it:
the job it runs, its override and rule, its current `tick` timer and the last slot it ran.
The decisions that emit those events are `app.jobs.schedule`'s.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from app.jobs.declaration import (
    BACKFILLED,
    DISABLED,
    ENABLED,
    RAN,
    RESCHEDULED,
    RUN_FAILED,
    TICK_KEY,
    TICKED,
    TRIGGERED,
)
from app.model.aggregate import Event
from app.protocol.wire import SCHEDULE_CANCELLED, SCHEDULE_SET

__all__ = ["ScheduleState", "apply_schedule_event"]


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


def apply_schedule_event(state: ScheduleState, e: Event) -> ScheduleState:
    """`state` after `e`: the applier of every event of `<context>.schedule`."""
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
        # Runs outside the live schedule: its state stays as it was.
        TRIGGERED: {},
        BACKFILLED: {},
        # The event's id is the new timer's id: its slots count afresh.
        SCHEDULE_SET: {
            "timer_id": e.id,
            "timer_set_at": e.created_at,
            "rule": body.get("rule"),
            "last_slot": None,
        },
        SCHEDULE_CANCELLED: {"timer_id": None, "timer_set_at": None, "last_slot": None},
    }
    update = updates[e.type]
    if not update:
        return state
    # Validated, not `model_copy`'d: another writer's event (`follow`) may carry anything,
    # and a state holding `{"job": 5}` would fail every later command of the instance.
    # Raised here, the event is dead-lettered by `follow` and passed over by a restore.
    return ScheduleState.model_validate({**state.model_dump(), **update})
