"""What a timer book keeps: its state (`BookState`), the timer last set under each key
(`BookTimer`), when that timer's rule can have no slot any more (`timer_end`), and which
timers it still keeps at an event's time (`live_timers`; `app.clients.timer_book` says why
it forgets the others)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from pydantic import BaseModel, ConfigDict, Field

from tables import AggregateRef
from tables.bounds import MAX_INSTANT
from tables.rules import CronRule, IntervalRule, OnceRule, ScheduleRule
from tables.slots import first_slot, next_slot
from tables.timer import StoredCommand

__all__ = ["CRON_END_STEPS", "BookState", "BookTimer", "gone", "live_timers", "timer_end"]

CRON_END_STEPS: Final = 24
"""The largest `count` whose last slot a cron rule's end is stepped to, slot by slot, when
its timer is set (each step 0.1 ms or so in a zone with clock changes: a few ms at most);
a larger one without `until` counts as endless."""


class BookTimer(BaseModel):
    """What a book's events say of one key's timer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    target: AggregateRef
    command: StoredCommand
    paused: bool = False
    ended_when_paused: bool = Field(
        default=False,
        exclude_if=lambda v: v is False,
        description="paused at or after its rule's end, when its last slot may have fired: "
        "its trigger is refused as a running one's; absent: false",
    )
    ends: int | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="epoch ms: by when its rule can have no slot any more (`timer_end`); "
        "absent: never (kept until cancelled; also a timer stored before this field existed)",
    )


class BookState(BaseModel):
    """The book's timers by key, as its events set, pause, resume and cancel them (the
    rows themselves, their slots and outcomes, live in the timer table). A state stored
    as `{}` (by a version before this one) reads as a book of no timers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    timers: dict[str, BookTimer] = Field(default_factory=dict)


def timer_end(rule: ScheduleRule, set_at: int) -> int | None:
    """When `rule`, set at `set_at` (its event's time), can have no slot any more, its
    jitter included; None when it may have one at any time (or its end costs too much).

    A once rule ends at its `at`; a recurring one at its `until` or its last slot by
    `count`, whichever comes first. An interval rule counts its slots from its start; a
    cron rule from its first slot at or after `set_at` (`first_slot`), stepped up to
    `CRON_END_STEPS` slots.
    """
    if isinstance(rule, OnceRule):
        end: int | None = rule.at
    else:
        last = None if rule.count is None else _last_counted(rule, rule.count, set_at)
        end = min((e for e in (rule.until, last) if e is not None), default=None)
    return None if end is None else end + (rule.jitter or 0)


def _last_counted(rule: IntervalRule | CronRule, count: int, set_at: int) -> int | None:
    """The due time of the rule's `count`-th slot (or of its last, if it ends before),
    None when not cheaply known."""
    if isinstance(rule, IntervalRule):
        last = rule.start + (count - 1) * rule.every
        return last if last <= MAX_INSTANT else None  # no slot past it: never, in practice
    if count > CRON_END_STEPS:
        return None
    slot = first_slot(rule, set_at)
    while slot is not None and slot.index < count - 1:
        after = next_slot(rule, slot)
        if after is None:
            break
        slot = after
    return None if slot is None else slot.due_at


def live_timers(timers: Mapping[str, BookTimer], now: int, retention: int) -> dict[str, BookTimer]:
    """The `timers` a book keeps at `now` (an event's time): all but the running ones that
    ended more than `retention` ms before it."""
    return {k: t for k, t in timers.items() if not gone(t, now, retention)}


def gone(timer: BookTimer, now: int, retention: int) -> bool:
    """Whether a book no longer keeps `timer` at `now`: running, and ended more than
    `retention` ms before it."""
    # A paused timer's row stays PAUSED in the table: its key must stay resumable.
    return not timer.paused and timer.ends is not None and timer.ends < now - retention
