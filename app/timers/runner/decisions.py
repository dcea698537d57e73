"""What the runner does to a timer: pure functions of a loaded row, a result and a time.

Every function here takes values and `now` (epoch ms) and returns a `Decision`: the one
conditional write to make (`TimerChange`), and whether to send or park. Nothing here reads
a clock, a store or a socket, so the loop that carries the decisions out stays dumb and
hypothesis can test the rules by themselves. What a decision is: `decision_types`; how
long a slot may be sent, which bounds them: `send_window`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

from app.timers.runner.decision_types import NOTHING, Action, Decision
from app.timers.runner.options import TimerOptions, backoff_ms
from app.timers.runner.send_results import (
    FIRED_OUTCOMES,
    NOT_CLAIMED,
    RULE_ERROR,
    SENT,
    TIMEOUT,
    TRANSPORT_ERROR,
    WITHDRAWN,
    SendResult,
    Verdict,
    classify,
    error_of,
)
from app.timers.runner.send_window import held_until, not_before_its_slot, send_until
from tables.copies import change_of, copied
from tables.slots import Slot, caught_up, jittered_due, latest_due, next_slot
from tables.timer import Outcome, Timer, TimerChange, TimerStatus
from tables.writes import slot_left

__all__ = [
    "NOT_CLAIMED",
    "RULE_ERROR",
    "SENT",
    "TIMEOUT",
    "TRANSPORT_ERROR",
    "WITHDRAWN",
    "SendResult",
    "Verdict",
    "classify",
    "deferred_park",
    "error_of",
    "expire_or_claim",
    "guarded",
    "on_outcome",
    "release",
    "retry_parked",
    "skip_parked",
    "unparked",
]

logger = logging.getLogger(__name__)


REFUSED: Final = Decision(Action.OPERATOR_REFUSED)
"""An operator's retry refused: nothing written (`retry_parked`)."""


def _change(loaded: Timer, **update: Any) -> TimerChange:
    return change_of(loaded, copied(loaded, update))


def _slot(timer: Timer) -> Slot:
    return Slot(timer.slot, timer.slot_due_at)


def _following(timer: Timer) -> Slot | None:
    """The rule's slot after the timer's own, if any; never one behind it."""
    nxt = next_slot(timer.rule, _slot(timer))
    if nxt is not None and nxt.index <= timer.slot:
        raise ValueError(f"next_slot went back from slot {timer.slot} to {nxt.index}")
    return nxt


def _first_unexpired(timer: Timer, oldest: int) -> tuple[Slot, Slot | None]:
    """The rule's last slot due before `oldest` (expired), and its first slot after the
    timer's own that is due at or after `oldest` (not expired), or None if the rule has
    none; the timer's own slot is due before `oldest`."""
    last_expired = latest_due(timer.rule, _slot(timer), oldest - 1)
    nxt = next_slot(timer.rule, last_expired)
    if nxt is not None and nxt.index <= timer.slot:
        raise ValueError(f"next_slot went back from slot {timer.slot} to {nxt.index}")
    return last_expired, nxt


_RETRIED: Final = frozenset({Outcome.FAILED, Outcome.BUSY})
"""Outcomes of a slot that was sent and is being sent again: a send's retry, a BUSY
refusal, or an operator's retry of the PARKED timer (which keeps the outcome it parked with)."""


def expire_or_claim(timer: Timer, now: int, options: TimerOptions) -> Decision:
    """What a round does with a timer `due()` loaded: expire it, or claim it to send it.

    A PENDING timer or a FIRING one whose claim lapsed is due when its `due_at` has come;
    anything else is left alone. A slot past its `send_until` (due longer ago than
    `expires_after`, a retry as much as a first send) is not sent: a rule due once is
    CANCELLED/EXPIRED, a recurring one jumps in one write to its first slot not expired
    (PENDING, due then), counting the slots it passed over as skipped (its own among them);
    with none left, it is CANCELLED/EXPIRED too, its own slot and those after it skipped.
    """
    if timer.status not in (TimerStatus.PENDING, TimerStatus.FIRING) or timer.due_at > now:
        return NOTHING
    if now > send_until(timer, options):
        last_expired, nxt = _first_unexpired(timer, now - options.expires_after)
        if nxt is None:
            # Written conditionally like a claim, and never sent; its slot and those after
            # it to the rule's last, all expired, counted as skipped, as below.
            skipped = timer.skipped + last_expired.index - timer.slot + 1
            return Decision(
                Action.EXPIRE,
                _change(
                    timer, status=TimerStatus.CANCELLED, outcome=Outcome.EXPIRED, skipped=skipped
                ),
            )
        # One write however far behind: every slot passed over is counted as skipped. A
        # slot expired while it was retried keeps its failed attempts in a row, as a
        # catch-up does (below): a target down for good still parks its timer when the
        # backoffs outlast `expires_after`.
        skipped = timer.skipped + nxt.index - timer.slot
        expired = _at_slot(timer, nxt, Outcome.EXPIRED, skipped, attempts=timer.attempts)
        return Decision(Action.EXPIRE_SLOT, expired)
    catch = caught_up(timer.rule, _slot(timer), now)
    # Catch-up only ever moves forward. Its attempts go with it: they count the failed
    # sends in a row (of this slot, and of those a catch-up moved on from while they were
    # retried), so a target that stays down parks its timer after `max_attempts`, however
    # long the backoffs against the rule's interval (reset to 0 there, it never did). A
    # slot's send window is its own still (`send_until`: from its due time); a fire resets
    # them (`_at_slot`), as an operator's retry does.
    moved = catch.slot.index > timer.slot
    slot = catch.slot if moved else _slot(timer)
    return Decision(
        Action.CLAIM,
        _change(
            timer,
            status=TimerStatus.FIRING,
            slot=slot.index,
            slot_due_at=slot.due_at,
            skipped=timer.skipped + (catch.skipped if moved else 0),
            attempts=timer.attempts,
            due_at=now + options.claim_timeout,
            **(slot_left(timer) if moved else {}),
        ),
        send=True,
    )


def on_outcome(
    claimed: Timer, result: SendResult, now: int, options: TimerOptions, busy_in_a_row: int = 0
) -> Decision:
    """What the result of sending `claimed` (the FIRING row the claim wrote) does to it.

    Every outcome writes the attempt's error (`error_of`): the last failed, busy or
    rejected attempt's code and message stay on the row through its retries, its park, an
    expiry and an operator's retry or skip, until an attempt the target takes clears them.
    """
    if claimed.status is not TimerStatus.FIRING:
        return NOTHING
    verdict = classify(result.code)
    error = error_of(result)
    if verdict is Verdict.FIRED:
        return _fired(claimed, FIRED_OUTCOMES[result.code], error)
    if verdict is Verdict.BUSY and busy_in_a_row < options.max_busy_retries:
        # Backpressure, not a failure: the first backoff, attempts as they were.
        return Decision(
            Action.BUSY,
            _change(
                claimed,
                status=TimerStatus.PENDING,
                due_at=not_before_its_slot(claimed, now + backoff_ms(options.retry, 1)),
                outcome=Outcome.BUSY,
                **error,
            ),
            busy_in_a_row=busy_in_a_row + 1,
        )
    # A technical failure, or one BUSY refusal more than the budget: a failed attempt.
    outcome = Outcome.BUSY if verdict is Verdict.BUSY else Outcome.FAILED
    busy_after = busy_in_a_row + 1 if verdict is Verdict.BUSY else 0
    failures = claimed.attempts + 1
    retry_due = not_before_its_slot(claimed, now + backoff_ms(options.retry, failures))
    retry = _change(
        claimed,
        status=TimerStatus.PENDING,
        attempts=failures,
        due_at=retry_due,
        outcome=outcome,
        **error,
    )
    if failures < options.retry.max_attempts:
        return Decision(Action.RETRY, retry, busy_in_a_row=busy_after)
    # Spent: park, but only once the ledger has the target. If the ledger fails, the last
    # attempt is sent again after the backoff: its attempts stay as they were loaded.
    again = _change(
        claimed,
        status=TimerStatus.PENDING,
        due_at=retry_due,
        outcome=outcome,
        **error,
    )
    return Decision(
        Action.PARK,
        _change(claimed, status=TimerStatus.PARKED, attempts=failures, outcome=outcome, **error),
        fallback=again,
        busy_in_a_row=busy_after,
    )


def unparked(decision: Decision) -> Decision:
    """A park whose ledger record failed: its fallback, the last attempt sent again; none
    (the row stays as it is) for a park deferred from its fallback (`deferred_park`)."""
    if not decision.park:
        return decision
    if decision.fallback is None:
        return NOTHING
    return Decision(Action.RETRY, decision.fallback, busy_in_a_row=decision.busy_in_a_row)


def deferred_park(decision: Decision) -> Decision:
    """A park written later than its timer's outcome: from its fallback's row (the last
    attempt sent again after the backoff, written now) to the park's. If the ledger then
    refuses, or that row changed meanwhile, nothing more is written: the fallback stands."""
    assert decision.park and decision.change is not None and decision.fallback is not None
    return Decision(
        Action.PARK,
        change_of(decision.fallback.next, decision.change.next),
        busy_in_a_row=decision.busy_in_a_row,
    )


def _fired(claimed: Timer, outcome: Outcome, error: dict[str, str | None]) -> Decision:
    nxt = _following(claimed)
    if nxt is None:
        return Decision(
            Action.FIRE, _change(claimed, status=TimerStatus.FIRED, outcome=outcome, **error)
        )
    return Decision(Action.NEXT_SLOT, _at_slot(claimed, nxt, outcome, error=error))


def _at_slot(
    timer: Timer,
    slot: Slot,
    outcome: Outcome,
    skipped: int | None = None,
    error: dict[str, str | None] | None = None,
    attempts: int = 0,
) -> TimerChange:
    """PENDING at `slot`; `error`: the fired attempt's error fields (an expired slot, which
    no attempt reached, keeps the row's)."""
    return _change(
        timer,
        status=TimerStatus.PENDING,
        slot=slot.index,
        slot_due_at=slot.due_at,
        due_at=jittered_due(timer.rule, timer.id, slot),
        attempts=attempts,
        skipped=timer.skipped if skipped is None else skipped,
        outcome=outcome,
        **(error or {}),
        **slot_left(timer),
    )


def release(claimed: Timer) -> Decision:
    """Gives back a claim whose send was cancelled, for the partition's next owner: due at
    its slot's own time, a first attempt and a retry alike (it was claimed because it was
    due, its backoff waited out); its expiry (`send_until`) is as it was.

    Without it the next owner would wait for the claim to lapse; the send may have reached
    the target, which then finds the request id committed. Not due at the node's time: one
    whose clock runs ahead would have the next owner wait for the skew."""
    if claimed.status is not TimerStatus.FIRING:
        return NOTHING
    due_at = not_before_its_slot(claimed, 0)
    return Decision(Action.RELEASE, _change(claimed, status=TimerStatus.PENDING, due_at=due_at))


def retry_parked(
    timer: Timer, now: int, options: TimerOptions, window: int, *, past_window: bool = False
) -> Decision:
    """An operator's retry: a PARKED timer due now, its attempts reset, its slot as it was,
    sent until `retry_until` (`send_until`): `expires_after` from now, but no later than
    its target still knows the slot's request id (`held_until`, `window`: the target's
    request-id window).

    Past that, the target may have applied the slot (a send whose result never came) and
    forgotten its id: sent again, it would be applied twice. So such a retry is refused
    (`REFUSED`: nothing written, the timer stays PARKED) unless the operator asked
    `past_window`: then it is sent for `expires_after` from now, under its own request id
    (a target that still knows it answers DUPLICATE; a new id would be applied anyway).

    It keeps the outcome it parked with (FAILED or BUSY; FAILED if it had none).
    """
    if timer.status is not TimerStatus.PARKED:
        return NOTHING
    until = now + options.expires_after
    if not past_window:
        held = held_until(timer, window, options)
        if now > held:
            return REFUSED
        until = min(until, held)
    outcome = timer.outcome if timer.outcome in _RETRIED else Outcome.FAILED
    return Decision(
        Action.OPERATOR_RETRY,
        _change(
            timer,
            status=TimerStatus.PENDING,
            due_at=not_before_its_slot(timer, now),
            attempts=0,
            outcome=outcome,
            retry_until=until,
        ),
    )


def skip_parked(timer: Timer) -> Decision:
    """An operator's skip: a PARKED timer cancelled with the outcome SKIPPED."""
    if timer.status is not TimerStatus.PARKED:
        return NOTHING
    return Decision(
        Action.OPERATOR_SKIP,
        _change(timer, status=TimerStatus.CANCELLED, outcome=Outcome.SKIPPED),
    )


def guarded(decide: Callable[[], Decision], timer: Timer, now: int) -> Decision:
    """`decide()` (a decision on `timer`), except that a timer the rule arithmetic fails on
    is that timer's problem, not the round's: it is parked for an operator (retry or skip),
    instead of a round that fails, and so stops every timer of its type, each time. If the
    ledger refuses the park, the timer is tried again an hour later."""
    try:
        return decide()
    except Exception as exc:
        logger.error("timer %s: no decision (%r): parked", timer.request_id, exc)
        error = error_of(SendResult(RULE_ERROR, repr(exc)))
        return Decision(
            Action.PARK,
            _change(timer, status=TimerStatus.PARKED, outcome=Outcome.FAILED, **error),
            fallback=_change(timer, status=TimerStatus.PENDING, due_at=now + _HOUR, **error),
        )


_HOUR: Final = 3_600_000
