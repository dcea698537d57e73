"""Which slots a backfill of a job instance runs, and under which request ids. Pure: the
caller reads the instance's events and passes "now".

A live slot is sent by the instance's `tick` timer as `<timer id>#<slot>` (the timer's id
is its `ScheduleSet` event's id, its slots counted from `first_slot` of its rule at that
event's time, `tables.slots`). A backfill sends each slot of a past range under exactly
that request id, so the node's de-duplication applies each slot once: a slot that ran
live, or that an earlier backfill ran, is a DUPLICATE.

Which timer a past instant belongs to: each `tick` timer from its `ScheduleSet` until the
next one. A pause (Disable, then Enable) does not end it: the slots of the paused window
are the slots the timer before it would have sent had it ticked on, under its ids. Before
the instance's first timer there is nothing to backfill (it did not exist).

A slot that a reschedule ran (one its timer owed when the rule changed) ran under the
reschedule's request id, not its tick's: the log's `Ticked` of it says so, and it is left
out.

A timer's slots due no later than the last slot run before it was set (its rule changed at
a slot's due time, its first slot due at that instant, or the clock stepped back) ran under
an older timer: its live ticks of them ran nothing (`app.jobs.runs.ran_before`), so their
request ids were never applied, and a backfill of them would run them again. They are left
out, of a retired timer too (the node can tell it of the current one alone).

Slot indexes of a cron rule are counted from a slot known from the log (the timer's first
slot, or one a tick, failed run or backfill recorded), so even after a catch-up whose index
the runner estimated (`tables.slots.latest_due`) the ids are those of the live ticks.

The node keeps an applied request id for its de-duplication window only
(`TICKWHEEL_REQUEST_ID_WINDOW_MS`): a slot due longer ago may have run live under an id
since forgotten, and would run a second time. Such a slot is refused (`first_unheld`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from app.jobs.declaration import BACKFILLED, RAN, RUN_FAILED, TICK_KEY, TICKED, Rule
from app.jobs.schedule_state import timer_floor
from app.protocol.wire import SCHEDULE_SET, EventEnvelope
from tables.exceptions import InvalidRule
from tables.rules import IntervalRule, OnceRule, parse_rule
from tables.slots import Slot, first_slot, next_slot

__all__ = [
    "MAX_BACKFILL_SLOTS",
    "MAX_BACKFILL_TOTAL_SLOTS",
    "BackfillError",
    "BackfillSlot",
    "TickTimer",
    "TooManySlots",
    "backfill_slots",
    "first_unheld",
    "tick_timers",
]

MAX_BACKFILL_SLOTS: Final = 10_000
"""The most slots one backfill of one instance sends: a range with more is refused."""
MAX_BACKFILL_TOTAL_SLOTS: Final = 20_000
"""The most slots one backfill sends over all its instances: a request with more is
refused. Each slot is a command held by the process that plans it (~1.5 kB; the answer's
outcome too), and a backfill's instances multiply its range's slots: 1,000 tenants or
1,024 shards at `MAX_BACKFILL_SLOTS` each held ~15 GB in a worker, on a dry run too."""
MAX_COUNT_STEPS: Final = 200_000
"""The most cron slots counted from a known one to reach a range (~1-8 s)."""

_SLOT_EVENTS = frozenset({TICKED, RUN_FAILED, RAN, BACKFILLED})


class BackfillError(ValueError):
    """A range that cannot be backfilled; the message says why."""


class TooManySlots(BackfillError):
    """A range of more slots than the limit `backfill_slots` was given."""


@dataclass
class TickTimer:
    """One `tick` timer of an instance, as its log has it."""

    id: str
    rule: Rule
    set_at: int
    known: list[Slot] = field(default_factory=list)
    """Slots whose index and due time the log records: its first one, and those run."""
    ran_apart: set[int] = field(default_factory=set)
    """Slots run by another command than their tick (a reschedule ran the slots its timer
    owed, `app.jobs.slot_runs`): their request id is not applied, so a backfill would run
    them again. Left out of its slots."""
    after: int | None = None
    """The latest due time of a slot run before the timer was set (what the node keeps as
    `ScheduleState.timer_after`): its slots due no later ran under an older timer. Left out
    of its slots."""


class BackfillSlot(NamedTuple):
    """One slot a backfill runs."""

    timer_id: str
    slot: int
    due_at: int

    @property
    def request_id(self) -> str:
        """The live tick's request id of this slot."""
        return f"{self.timer_id}#{self.slot}"


def tick_timers(events: Iterable[EventEnvelope]) -> list[TickTimer]:
    """The `tick` timers of one instance from its events (in log order), in the order the
    log set them: by the version of their `ScheduleSet`, not its `created_at`, which is the
    clock of the node that decided it (one behind another's put a retired timer after its
    successor, and its slots over the successor's)."""
    timers: dict[str, TickTimer] = {}
    versions: dict[str, int] = {}
    ran_until: int | None = None  # the latest due time of a slot run so far
    # As the node's state has them: the rule of the last tick timer set, and when the
    # last slot that ticked was due (`ScheduleState.rule`, `last_due_at`).
    previous: object = None
    last_ticked: int | None = None
    for e in events:
        body = e.body
        if e.type == SCHEDULE_SET and body.get("key") == TICK_KEY:
            raw, previous = previous, body.get("rule")
            try:
                rule = parse_rule(body.get("rule"))
            except InvalidRule:
                continue  # the node dead-letters such a timer: it never ticked
            first = first_slot(rule, e.created_at)
            timers[e.id] = TickTimer(
                e.id,
                rule,
                e.created_at,
                [] if first is None else [first],
                # As the node's `timer_after`: none for a new one-off, run at its instant.
                after=(
                    timer_floor(body.get("rule"), raw, last_ticked)
                    if isinstance(rule, OnceRule)
                    else ran_until
                ),
            )
            versions[e.id] = e.version
        elif e.type in _SLOT_EVENTS:
            if e.type == TICKED and isinstance(body.get("due_at"), int):
                last_ticked = body.get("due_at")
            slot, due_at = body.get("slot"), body.get("due_at")
            if isinstance(due_at, int) and not isinstance(due_at, bool):
                # Any timer's (one unreadable here, too): that instant ran.
                ran_until = due_at if ran_until is None else max(ran_until, due_at)
            timer = timers.get(str(body.get("timer_id")))
            if timer is not None and isinstance(slot, int) and isinstance(due_at, int):
                timer.known.append(Slot(slot, due_at))
                if e.type == TICKED and e.request_id != f"{timer.id}#{slot}":
                    timer.ran_apart.add(slot)
    # Stable: the events of one command share its version, and come in log order.
    return sorted(timers.values(), key=lambda t: versions[t.id])


def backfill_slots(
    timers: list[TickTimer],
    start: int,
    until: int,
    *,
    limit: int = MAX_BACKFILL_SLOTS,
) -> list[BackfillSlot]:
    """Every slot due in `[start, until]` (epoch ms), each under the timer its instant
    belongs to (see the module); `timers` in log order (`tick_timers`); `BackfillError`
    past `limit` slots.

    A timer's instants end where any later one's began: each `set_at` is the clock of the
    node that set it, and a later timer set by a node whose clock is behind began before
    the one it retired, by those clocks. Its successor's slots from then ran live under the
    successor's ids: under the retired timer's they would run again."""
    if until < start:
        raise BackfillError(f"the range ends ({until}) before it starts ({start})")
    out: list[BackfillSlot] = []
    ends = _ends(timers, until)
    for timer, hi in zip(timers, ends, strict=True):
        lo = max(start, timer.set_at)
        if timer.after is not None:
            lo = max(lo, timer.after + 1)  # those ran under an older timer (see the module)
        if lo > hi:
            continue
        # A slot the log knows keeps its index (one the runner estimated, too).
        known = {k.due_at: k.index for k in timer.known}
        slot = _at_or_after(timer, lo)
        while slot is not None and slot.due_at <= hi:
            if len(out) == limit:
                raise TooManySlots(f"the range has more than {limit} slots: backfill a shorter one")
            slot = Slot(known.get(slot.due_at, slot.index), slot.due_at)
            if slot.index not in timer.ran_apart:
                out.append(BackfillSlot(timer.id, slot.index, slot.due_at))
            slot = next_slot(timer.rule, slot)
    return out


def _ends(timers: list[TickTimer], until: int) -> list[int]:
    """The last instant of each timer's own (`backfill_slots`): `until`, or before the
    earliest `set_at` of the timers after it, whichever is first."""
    ends, end = [], until
    for timer in reversed(timers):
        ends.append(end)
        end = min(end, timer.set_at - 1)
    return ends[::-1]


def first_unheld(slots: list[BackfillSlot], held_after: int) -> BackfillSlot | None:
    """The first of `slots` due at or before `held_after` (epoch ms), if any: a live run of
    it was applied by then at the latest, and its request id may be forgotten by the time
    the backfill is decided, so the node could not tell that it ran."""
    return next((slot for slot in slots if slot.due_at <= held_after), None)


def _at_or_after(timer: TickTimer, at: int) -> Slot | None:
    """The timer's first slot due at or after `at`, with its live index."""
    rule = timer.rule
    if isinstance(rule, OnceRule | IntervalRule):
        # Their indexes are arithmetic on the rule alone (a once rule's only slot is 0).
        slot = first_slot(rule, at)
        return slot if slot is not None and slot.due_at >= at else None
    if not timer.known:
        return None  # its rule had no slot when it was set
    known = [s for s in timer.known if s.due_at <= at]
    found: Slot | None = max(known, key=lambda s: s.due_at) if known else min(timer.known)
    steps = 0
    while found is not None and found.due_at < at:
        steps += 1
        if steps > MAX_COUNT_STEPS:
            raise BackfillError(
                f"more than {MAX_COUNT_STEPS} slots of {rule.expr!r} lie between the last one "
                f"timer {timer.id} ran and the range: backfill a range nearer to it"
            )
        found = next_slot(rule, found)
    return found
