"""A job instance's runs: the key of the timer that runs a failed slot again (`run_key`),
which of those timers a new failure drops (`runs_to_drop`, `drop_oldest_runs`), its
handler run as user code (`run_handler`, `handler_failure`), whether a slot may be due
under the instance's tick timer (`slot_reachable`) and is one it sends (`slot_sent`), and
the slots that timer owes when a new rule replaces it (`owed_slots`). Used by
`app.jobs.schedule`'s decisions (and `app.jobs.extra_runs`')."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Final, NamedTuple

from app.jobs.declaration import Job, JobRun
from app.jobs.schedule_state import (
    MAX_BACKFILLED_RUNS,
    BackfilledRun,
    ScheduleState,
    is_one_off,
    run_key,
    with_backfilled,
)
from app.log_limit import LogLimit
from app.model.aggregate import Decision
from app.model.decide import cut_message
from app.model.user_code import not_awaitable, user_code
from tables.bounds import MAX_INSTANT
from tables.exceptions import InvalidRule
from tables.rules import OnceRule, ScheduleRule, parse_rule
from tables.slots import (
    Slot,
    caught_up,
    first_slot,
    latest_due,
    next_slot,
    reachable,
    sent_slot,
    slots_between,
)

__all__ = [
    "MAX_DROPS_PER_FAILURE",
    "MAX_FAILED_RUNS",
    "MAX_OWED_SLOTS",
    "OwedSlots",
    "backfill_refusal",
    "drop_oldest_runs",
    "handler_failure",
    "no_slot_left",
    "owed_slots",
    "ran_before",
    "run_handler",
    "run_key",
    "runs_to_drop",
    "slot_reachable",
    "slot_sent",
    "tick_refusal",
]

logger = logging.getLogger(__name__)

# A job failing on every slot of every instance (a 1-second job, a thousand tenants, each
# run tried again) would log thousands of tracebacks a second: per job and exception type,
# the first in full, then one a minute with the count.
_HANDLER_FAILURES = LogLimit()
# A job failing every second drops a slot a second: a line a minute per job, with a count.
_DROPS = LogLimit()


MAX_FAILED_RUNS: Final = 100
"""The failed slots an instance keeps to run again, by default: its newest. Each has a
`run:` timer, retried, then parked until an operator retries or skips it; a job failing
every minute for a week would otherwise leave some 10,000 parked timers that nothing
removes. A slot failing past it drops the oldest (`runs_to_drop`)."""

MAX_DROPS_PER_FAILURE: Final = 10
"""The run timers one failed tick drops at most: more than `MAX_FAILED_RUNS` are named
only by a state folded again from a log written before the bound (a rebuild), and one
decision cancelling thousands at once would be a transaction of thousands of events.
Each later failure drops as many, so the backlog drains."""

MAX_OWED_SLOTS: Final = 100
"""The owed slots of a rule that does not coalesce that a new rule's command runs at most
(`owed_slots`), oldest first. Each is a run of the handler in that command's one decision:
one transaction of the partition, timed as one by the node's handler timeout, its records
`MAX_DECISION_RECORDS` at most; a node down for weeks would otherwise owe thousands. Those
past it are logged, counted, for a backfill (`app.jobs.slot_runs`)."""


def no_slot_left(rule: ScheduleRule, now: int, expires_after: int) -> str | None:
    """Why a tick timer of `rule` set at `now` would never send a slot, or None: the rule
    has none left (its until or count passed, or its next slot is after `MAX_INSTANT`), or
    its only slot, a once rule's, was due longer ago than `expires_after` (the timers'
    option: the runner expires it unsent). Set, such a timer would leave the instance
    looking enabled, and the job would never run."""
    if first_slot(rule, now) is None:
        return (
            f"it has no slot left at {now}: it ended (its until or count passed, or its next "
            f"slot is after {MAX_INSTANT}, 9999-12-31T23:59:59.999Z, the last instant a "
            "timer holds)"
        )
    if isinstance(rule, OnceRule) and rule.at < now - expires_after:
        return (
            f"its once slot, at {rule.at}, was due more than the timers' expires_after "
            f"({expires_after} ms) before now ({now}): its timer would expire it unsent"
        )
    return None


def runs_to_drop(failed: Sequence[str], keep: int = MAX_FAILED_RUNS) -> list[str]:
    """Of the run keys of an instance's failed slots (`ScheduleState.failed_runs`, oldest
    first), those whose timers a new failure cancels: the oldest, so that with the new one
    `keep` are left, `MAX_DROPS_PER_FAILURE` at most."""
    over = len(failed) + 1 - keep
    return list(failed[: min(max(over, 0), MAX_DROPS_PER_FAILURE)])


def drop_oldest_runs(state: ScheduleState, d: Decision, keep: int, instance: object) -> None:
    """On a slot's failure, the oldest failed slots past `keep` given up (`runs_to_drop`):
    their run timers cancelled (PENDING, or PARKED in the failure ledger), so that a job
    failing for weeks keeps its newest failures, not one parked timer per slot. Only a
    slot still waiting is dropped: one that ran (`Ran`) left `failed_runs`."""
    dropped = runs_to_drop(state.failed_runs, keep)
    for key in dropped:
        d.cancel_schedule(key)
    if dropped and (more := _DROPS.check(state.job)) is not None:
        logger.warning(
            "%s: more than %d failed slots wait to run again: the oldest %d dropped (%s), "
            "their run timers cancelled (a run already sent still runs once)%s",
            instance,
            keep,
            len(dropped),
            ", ".join(dropped),
            more,
        )


def run_handler(job: Job, run: JobRun, *, log_limit: LogLimit = _HANDLER_FAILURES) -> str | None:
    """Runs the handler; None when it returned, else what it raised, cut to
    `MAX_ERROR_TEXT` characters (an exception's text has no bound: whole, it could outgrow
    the record of the event or result that carries it). `log_limit` bounds the lines about
    its failures (the node's one, shared by every job, by default)."""
    failure = handler_failure(job, run, log_limit=log_limit)
    return None if failure is None else cut_message(repr(failure))


def handler_failure(
    job: Job, run: JobRun, *, log_limit: LogLimit = _HANDLER_FAILURES
) -> Exception | None:
    """`run_handler`, giving what the handler raised as it is (None when it returned)."""
    try:
        with user_code("the handler of job", job.name):
            # Declared returning None; an object whose `__call__` is async returns a
            # coroutine all the same.
            handler: Callable[[JobRun], object] = job.handler
            result = handler(run)
            not_awaitable(result, f"the handler of job {job.name}")
    except Exception as exc:
        if run.retried:
            what = "failed again"
        elif run.triggered or run.backfilled:
            what = "failed (nothing of the run commits)"
        else:
            what = "failed (its run: timer runs it again)"
        if (more := log_limit.check((job.name, type(exc)))) is not None:
            logger.exception(
                "job %s on slot %d of %s %s%s", job.name, run.slot, run.instance, what, more
            )
        return exc
    return None


def _rule_of(state: ScheduleState) -> ScheduleRule | None:
    """The instance's tick timer's rule; None when there is none to tell by (none, or one
    this version cannot read: not these checks' to refuse, the timer table has the rule it
    fires by)."""
    if state.rule is None:
        return None
    try:
        return parse_rule(state.rule)
    except InvalidRule:
        return None


def slot_reachable(state: ScheduleState, slot: int, by: int) -> bool:
    """Whether `slot` of the instance's tick timer may be due by `by` under the timer's
    rule (`tables.slots.reachable`); True when there is no rule to tell."""
    rule = _rule_of(state)
    return rule is None or reachable(rule, slot, state.timer_set_at or 0, by)


def slot_sent(state: ScheduleState, slot: int, due_at: int) -> bool:
    """Whether the instance's tick timer sends `slot` due at `due_at`: on its rule, of the
    index the timer gives that due time (`tables.slots.sent_slot`), counted from the last
    slot that ran; True when there is no rule to tell."""
    if (rule := _rule_of(state)) is None:
        return True
    last = None
    if state.last_slot is not None and state.last_due_at is not None:
        last = Slot(state.last_slot, state.last_due_at)
    return sent_slot(rule, Slot(slot, due_at), state.timer_set_at or 0, last)


def ran_before(state: ScheduleState, due_at: int) -> bool:
    """Whether a slot of the instance's tick timer due at `due_at` is due no later than the
    last slot run before the timer was set (`ScheduleState.timer_after`): that instant ran
    under an older timer, as when a rule changes at a slot's due time (the change, or the
    tick it rode on, ran the old timer's slot, and the new timer's first is due then too)
    or after the clock stepped back. Run again, a slot would run twice. A state from before
    `timer_after` tells it while the timer ran nothing yet (`last_due_at` is the older's)."""
    after = _timer_after(state)
    return after is not None and due_at <= after


def _timer_after(state: ScheduleState) -> int | None:
    if is_one_off(state.rule):
        # None but for a one-off set again whose instant ran (`timer_floor`); a state
        # from before it: none, the operator's explicit run at its instant.
        return state.timer_after
    if state.timer_after is None and state.last_slot is None:
        return state.last_due_at
    return state.timer_after


def tick_refusal(state: ScheduleState, timer_id: str, slot: int, due_at: int) -> str | None:
    """Why a tick of `slot` of the current tick timer, due at `due_at`, is no send of the
    timer's, or None: a slot its rule does not reach by then (a hand-made one of a far
    slot), or one it does not make (another producer's, off the rule or numbered past its
    due time). Either, taken, would pass over the real slots up to it as run."""
    if not slot_reachable(state, slot, due_at):
        return f"slot {slot} of {timer_id} is not due by {due_at} under its rule"
    if not slot_sent(state, slot, due_at):
        return f"slot {slot} of {timer_id} due at {due_at} is not one its rule makes"
    return None


class OwedSlots(NamedTuple):
    """What a tick timer owes when a new rule replaces it (`owed_slots`)."""

    slots: list[Slot]
    """The slots to run, oldest first."""
    beyond: int
    """How many more are due after them, past the limit (estimated as `slots_between`)."""


def owed_slots(state: ScheduleState, now: int, limit: int = MAX_OWED_SLOTS) -> OwedSlots | None:
    """The slots of the instance's tick timer that are due by `now` and have not run, as the
    timer would send them: from the next after the last one that ran (its first, when none
    did), a coalescing rule's latest due alone, every one of a rule that does not coalesce
    (`limit` at most: the others are `beyond`), less those a backfill ran ahead of its
    ticks (`ScheduleState.backfilled`). What a new rule, replacing the timer now,
    would otherwise drop: the timer's row goes, and with it a slot handed to its cycle and
    not fired yet. None: nothing due, or nothing to tell it by (no timer, no rule this
    version reads, a state from before `timer_set_at` or `last_due_at`)."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    if not state.enabled or state.timer_id is None or state.timer_set_at is None:
        return None
    if (rule := _rule_of(state)) is None:
        return None
    if state.last_slot is None:
        after = first_slot(rule, state.timer_set_at)
        floor = _timer_after(state)
        if after is not None and floor is not None and after.due_at <= floor:
            # Its slots up to the last one an older timer ran are not owed: they ran.
            after = next_slot(rule, latest_due(rule, after, floor))
    elif state.last_due_at is None:
        return None
    else:
        after = next_slot(rule, Slot(state.last_slot, state.last_due_at))
    if after is None or after.due_at > now:
        return None
    if isinstance(rule, OnceRule) or rule.coalesce:
        slot = caught_up(rule, after, now).slot
        # The one it would send: none, when a backfill ran it.
        return None if _backfilled_run(state, slot.index) else OwedSlots([slot], 0)
    slots: list[Slot] = []
    at: Slot | None = after
    while at is not None and at.due_at <= now and len(slots) < limit:
        if (run := _backfilled_run(state, at.index)) is not None:
            # Run by a backfill under its tick's request id: run again, it would run twice.
            at = next_slot(rule, Slot(run.last, run.last_due_at))
            continue
        slots.append(at)
        at = next_slot(rule, at)
    if not slots:
        return None
    last = slots[-1].index
    backfilled = sum(r.last - max(r.first, last + 1) + 1 for r in state.backfilled if r.last > last)
    return OwedSlots(slots, max(slots_between(rule, slots[-1], now) - backfilled, 0))


def _backfilled_run(state: ScheduleState, index: int) -> BackfilledRun | None:
    """The run of backfilled slots (`ScheduleState.backfilled`) that holds slot `index`."""
    return next((r for r in state.backfilled if r.first <= index <= r.last), None)


def backfill_refusal(state: ScheduleState, timer_id: str, slot: int, due_at: int) -> str | None:
    """Why a Backfill of `slot` of the current tick timer `timer_id`, due at `due_at`, is
    refused, or None: as a tick of it (`tick_refusal`), or, ahead of the ticks, one
    whose slot the instance cannot keep as backfilled (`MAX_BACKFILLED_RUNS` runs held):
    not kept, a new rule would run it again as a slot the timer owes. Its live tick still
    runs it."""
    if (why := tick_refusal(state, timer_id, slot, due_at)) is not None:
        return why
    if state.last_slot is not None and slot <= state.last_slot:
        return None
    if len(with_backfilled(state.backfilled, slot, due_at)) > MAX_BACKFILLED_RUNS:
        return (
            f"slot {slot} of {timer_id} is ahead of the instance's ticks, which hold "
            f"{MAX_BACKFILLED_RUNS} runs of backfilled slots apart already: its live tick "
            "runs it (backfill ranges in order, or once the ticks passed them)"
        )
    return None
