"""Slot arithmetic of schedule rules: when each firing of a timer is due. Pure: no I/O, no clock.

Times are epoch milliseconds (UTC). A slot is one firing: its `index` counts the rule's
firings and its `due_at` is when it is due. Interval rules are integer arithmetic; cron
rules are read by cronsim in the rule's IANA zone, at whole seconds (five fields, or six
with a leading seconds field).

Cron rules and daylight saving time: cronsim follows Debian cron. A job at a fixed local
time (neither its minute nor its hour field starts with `*`, e.g. `30 2 * * *`) whose time
falls in the hour skipped when clocks spring forward fires at the first valid minute after
it (02:30 becomes 03:00 on 2026-03-29 in Europe/Berlin), and in the hour repeated when
clocks fall back it fires once, on the first pass. A job whose minute or hour field starts
with `*` (`*/30 * * * *`, `15 * * * *`) follows the wall clock as it is: it does not fire at
local times that do not exist and fires on both passes of the repeated hour. Six-field
expressions (with seconds) are outside Debian cron and get no such adjustment: at a fixed
local time they do not fire on the spring-forward day and fire twice on the fall-back day.
Rules in UTC have none of this.

A recurring rule's `until` and `count` end it: no slot is due after `until`, and none has
an index of `count` or more. Every function here stops there: past the last slot there is
no next one (`None`), and a catch-up goes no further than the last.

The same holds where clocks change by half an hour or off the hour (Australia/Lord_Howe,
Pacific/Chatham) and in zones of offsets off the hour (Asia/Kathmandu): cronsim steps local
times without a zone and `tables.cron_matches` applies the changes, as cronsim's own
iterator skips matches there (e.g. 02:45 after Lord Howe's clocks jump from 02:00 to 02:30).
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

from tables.bounds import MAX_INSTANT
from tables.cron_matches import WINDOW_STEPS, count_matches, cron_after, nth_match_after
from tables.rules import CronRule, IntervalRule, OnceRule, ScheduleRule

__all__ = [
    "MAX_CRON_STEPS",
    "CatchUp",
    "Slot",
    "caught_up",
    "first_slot",
    "jitter_offset",
    "jittered_due",
    "latest_due",
    "next_slot",
    "nth_slot",
    "reachable",
    "sent_slot",
    "slots_between",
]

# Counting cron matches costs ~7-40 µs each on the runner's event loop: past this many (70 ms
# to 0.4 s) the latest due slot is found by bisection instead and its index estimated, or,
# under a count, counted (`tables.cron_matches`).
MAX_CRON_STEPS = 10_000


class Slot(NamedTuple):
    """One firing of a rule: its index and its due time (epoch ms)."""

    # shadows tuple.index on purpose: a slot is a record, never searched as a sequence
    index: int  # type: ignore[assignment]
    due_at: int


class CatchUp(NamedTuple):
    """The slot to send after a catch-up, and how many slots before it were skipped."""

    slot: Slot
    skipped: int


def jitter_offset(request_id: str, jitter: int | None) -> int:
    """A slot's jitter: an offset in [0, `jitter`) ms, the same for the same request id
    (`<timer id>#<slot>`) on every node and every replay or rebuild; 0 without jitter."""
    if not jitter or jitter <= 1:
        return 0
    digest = hashlib.blake2b(request_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % jitter


def jittered_due(rule: ScheduleRule, timer_id: str, slot: Slot) -> int:
    """When the timer `timer_id` fires `slot`: its due time plus its jitter. The slot's own
    due time (`slot_due_at`) stays unjittered: catch-up and expiry count from it."""
    jitter = rule.jitter
    if not jitter or jitter <= 1:
        return slot.due_at  # no request id to hash: every ingested timer without jitter
    return slot.due_at + jitter_offset(f"{timer_id}#{slot.index}", jitter)


def first_slot(rule: ScheduleRule, not_before: int) -> Slot | None:
    """The rule's first slot due at or after `not_before` (a once rule: its only slot).

    An interval slot's index counts from the rule's start; a cron rule's first slot is
    index 0 whatever its start. None: the rule has no slot then (past `MAX_INSTANT`, the end
    of year 9999 UTC, or its own end).
    """
    if isinstance(rule, OnceRule):
        # even a past one: the runner decides whether it is late or expired
        return Slot(0, rule.at)
    if isinstance(rule, IntervalRule):
        behind = not_before - rule.start
        n = -(-behind // rule.every) if behind > 0 else 0
        return _interval_slot(rule, n)
    due = next(cron_after(rule, max(rule.start, not_before) - 1), None)
    return None if due is None else _within(rule, Slot(0, due))


def next_slot(rule: ScheduleRule, slot: Slot) -> Slot | None:
    """The slot after `slot`; None when there is none (a once rule)."""
    if isinstance(rule, OnceRule):
        return None
    if isinstance(rule, IntervalRule):
        return _interval_slot(rule, slot.index + 1, slot.due_at + rule.every)
    due = next(cron_after(rule, slot.due_at), None)
    return None if due is None else _within(rule, Slot(slot.index + 1, due))


def nth_slot(rule: ScheduleRule, n: int) -> Slot | None:
    """The `n`-th slot counted from the rule's own start (0 is the first); None if none.

    For a cron rule that is `n` steps of iteration: `ValueError` past `MAX_CRON_STEPS`.
    """
    if n < 0:
        raise ValueError(f"slot index must not be negative, got {n}")
    if isinstance(rule, OnceRule):
        return Slot(0, rule.at) if n == 0 else None
    if isinstance(rule, IntervalRule):
        return _interval_slot(rule, n)
    if rule.count is not None and n >= rule.count:
        return None
    if n > MAX_CRON_STEPS:
        raise ValueError(f"cron slot {n} is more than {MAX_CRON_STEPS} steps from its start")
    for index, due in enumerate(cron_after(rule, rule.start - 1)):
        if index == n:
            return _within(rule, Slot(n, due))
    return None


def reachable(rule: ScheduleRule, index: int, set_at: int, by: int) -> bool:
    """Whether slot `index` of a timer of `rule` set at `set_at` may be due at or before
    `by`: what a command claiming to be that slot, sent no later than `by`, must pass.

    Exact for once and interval rules. A cron timer's indices count from its first slot,
    due at or after `max(start, set_at)`, and each step of an index stands for one match
    or more, which are `_resolution` apart at least (even where `latest_due` estimates
    them): slot `index` is due `index` resolutions after that at the earliest.
    """
    if index < 0:
        return False
    if isinstance(rule, OnceRule):
        return index == 0 and rule.at <= by
    if isinstance(rule, IntervalRule):
        slot = _interval_slot(rule, index)
        return slot is not None and slot.due_at <= by
    if rule.count is not None and index >= rule.count:
        return False
    return max(rule.start, set_at) + index * _resolution(rule) <= by


def sent_slot(rule: ScheduleRule, slot: Slot, set_at: int, after: Slot | None = None) -> bool:
    """Whether a timer of `rule` set at `set_at` sends `slot` (its index and due time): the
    due time one of the rule's and the index the one the timer gives it. What a command
    claiming to be a slot of the timer must be, beyond `reachable`: a slot off the rule, or
    of an index past its due time's, is no send of the timer's.

    `after`: a slot the timer sent before (its index and due time), counted from instead of
    the timer's first slot when `slot` is later. Exact for once and interval rules. A cron
    index is the timer's own count of matches up to the due time, but a catch-up of more
    than `MAX_CRON_STEPS` slots estimates it upwards (`latest_due`), perhaps over several
    catch-ups: past that many matches, any index from `MAX_CRON_STEPS` on to one per
    `_resolution` is taken.
    """
    if not reachable(rule, slot.index, set_at, slot.due_at):
        return False
    if isinstance(rule, OnceRule):
        return slot.due_at == rule.at
    if isinstance(rule, IntervalRule):
        return _interval_slot(rule, slot.index) == slot
    start = after
    if start is None or start.due_at > slot.due_at or start.index > slot.index:
        start = first_slot(rule, set_at)
        if start is None or start.due_at > slot.due_at:
            return False
    latest = latest_due(rule, start, slot.due_at)
    if latest.due_at != slot.due_at:
        return False  # no match of the rule then, or past its end
    if latest.index == slot.index:
        return True
    # Estimated: the latest due was stepped past `MAX_CRON_STEPS` matches, so as many at
    # least lie in between, and at most one per resolution.
    most = start.index + (slot.due_at - start.due_at) // _resolution(rule)
    return latest.index - start.index >= MAX_CRON_STEPS and (
        start.index + MAX_CRON_STEPS <= slot.index <= most
    )


def latest_due(rule: ScheduleRule, slot: Slot, now: int) -> Slot:
    """The latest slot at or after `slot` due at or before `now`; `slot` if the next is not due.

    Cron rules count the slots in between one by one up to `MAX_CRON_STEPS`; further behind,
    the latest slot's due time is still exact but the rest of its index is estimated as one
    slot per minute (per second with a seconds field): an upper bound of the slots in
    between that keeps each slot's index unique and increasing. Under a count the index is
    never estimated: past a few steps the slots in between are counted without stepping
    (`tables.cron_matches`, exact but for the cases its docstring names), in one call.
    """
    if isinstance(rule, OnceRule):
        return slot
    if rule.until is not None:
        now = min(now, rule.until)  # no slot is due after it
    if isinstance(rule, IntervalRule):
        steps = (now - slot.due_at) // rule.every
        if rule.count is not None:
            steps = min(steps, rule.count - 1 - slot.index)
        if steps <= 0:
            return slot
        return Slot(slot.index + steps, slot.due_at + steps * rule.every)
    return _cron_latest(rule, slot, now)


def slots_between(rule: ScheduleRule, slot: Slot, until: int) -> int:
    """How many slots after `slot` are due at or before `until` (estimated as `latest_due`)."""
    return latest_due(rule, slot, until).index - slot.index


def caught_up(rule: ScheduleRule, slot: Slot, now: int) -> CatchUp:
    """The slot a claim at `now` sends: a coalescing rule skips to the latest slot due.

    Only when the slot after `slot` is due too; a rule that does not coalesce sends each
    slot in turn, and a once rule has nothing to skip.
    """
    if isinstance(rule, OnceRule) or not rule.coalesce:
        return CatchUp(slot, 0)
    latest = latest_due(rule, slot, now)
    return CatchUp(latest, latest.index - slot.index)


def _interval_slot(rule: IntervalRule, n: int, due_at: int | None = None) -> Slot | None:
    """Slot `n` of an interval rule; None past `MAX_INSTANT` (the rule has ended there, as
    a cron rule ends at year 9999) or past the rule's own end."""
    due = rule.start + n * rule.every if due_at is None else due_at
    return _within(rule, Slot(n, due)) if due <= MAX_INSTANT else None


def _within(rule: IntervalRule | CronRule, slot: Slot) -> Slot | None:
    """`slot`, unless the rule has ended by then (`until`, `count`, or `MAX_INSTANT`: a
    cron rule's year 9999 is local, and in a zone west of UTC its last hours are past the
    last instant a timer's row holds)."""
    if slot.due_at > MAX_INSTANT:
        return None
    if rule.count is not None and slot.index >= rule.count:
        return None
    if rule.until is not None and slot.due_at > rule.until:
        return None
    return slot


def _cron_latest(rule: CronRule, slot: Slot, now: int) -> Slot:
    """`latest_due` of a cron rule (`now` already no later than its `until`)."""
    # Under a count the index is exact, to stop at the last one.
    last = None if rule.count is None else rule.count - 1
    latest, more = _stepped(rule, slot, now, last)
    if not more:
        return latest
    due = _cron_bisect(rule, latest.due_at, now)
    if last is None:
        return Slot(latest.index + (due - latest.due_at) // _resolution(rule), due)
    # Under a count, the matches up to the latest counted (a few ms for decades of
    # per-second matches, where stepping took minutes).
    between, steps = count_matches(rule, latest.due_at, due, WINDOW_STEPS)
    if latest.index + between <= last:
        # a count off (tables.cron_matches) must still move the index with the due time
        return Slot(latest.index + max(between, 1 if due > latest.due_at else 0), due)
    if latest.index == last:
        return latest
    return Slot(last, nth_match_after(rule, latest.due_at, last - latest.index, due, steps))


def _stepped(rule: CronRule, slot: Slot, now: int, last: int | None) -> tuple[Slot, bool]:
    """The latest slot due by `now` (of index `last` at most) within `MAX_CRON_STEPS` of
    `slot`, exact; and whether later ones may be due past those steps."""
    latest = slot
    for step, due in enumerate(cron_after(rule, slot.due_at), start=1):
        if due > now or (last is not None and slot.index + step > last):
            return latest, False
        latest = Slot(slot.index + step, due)
        if step == MAX_CRON_STEPS:
            return latest, True
    return latest, False  # the rule has no later match


def _resolution(rule: CronRule) -> int:
    """The least time (ms) between two matches: the index estimate counts one per such step.

    Five-field expressions match at second 0, so two matches are a minute apart at least
    (tzdata has no UTC offset of a fraction of a minute after 1972, when `now` cannot be).
    """
    return 60_000 if len(rule.expr.split()) == 5 else 1_000


def _cron_bisect(rule: CronRule, due: int, now: int) -> int:
    """The latest match at or before `now`, given `due`, a match at or before `now`.

    Bisection on whole seconds: each probe is one cronsim search, so a year of per-second
    matches takes ~25 probes instead of 31 million steps.
    """
    # invariant: the first match after second `low` is due by `now`, none after `high` is
    low, high = due // 1000 - 1, now // 1000
    while high - low > 1:
        middle = (low + high) // 2
        match = next(cron_after(rule, middle * 1000), None)
        if match is not None and match <= now:
            low = middle
        else:
            high = middle
    match = next(cron_after(rule, low * 1000), None)
    return due if match is None or match > now else match
