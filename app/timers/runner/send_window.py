"""When a timer's slot may be sent: pure functions of the row and the options, which the
rules of `decisions` bound their writes by. A send is never due before its slot
(`not_before_its_slot`), never sent past its expiry (`send_until`), and an operator's retry
not past the time its target surely still knows the slot's request id (`held_until`)."""

from __future__ import annotations

from app.timers.runner.options import TimerOptions
from tables.slots import Slot, jittered_due
from tables.timer import Timer

__all__ = ["held_until", "not_before_its_slot", "send_until"]


def send_until(timer: Timer, options: TimerOptions) -> int:
    """The last time the timer's slot may be sent; a send due later is expired instead.

    `expires_after` past the slot's own due time (its jitter included: a slot jittered
    further than `expires_after` would expire unsent the moment it came), for its first
    send and every retry alike: a retry's own due time does not count, so that however
    the retries are spread (backoff, BUSY refusals, a claim given back), the slot is never
    sent past the target's request-id window (`expires_after` is below it: the node's
    settings), where the target, having forgotten the id, would apply it again. An
    operator's retry says its own (`Timer.retry_until`, `decisions.retry_parked`). All
    come from the row, so a restarted node decides the same.
    """
    if timer.retry_until is not None:
        return timer.retry_until
    return _slot_due(timer) + options.expires_after


def held_until(timer: Timer, window: int, options: TimerOptions) -> int:
    """The last time a send of the timer's slot is still sure to be found by its target
    under its request id, the target keeping ids for `window` (ms; its
    `TICKWHEEL_REQUEST_ID_WINDOW_MS`): the slot's own due time (jitter included: no send
    of it, so no application, is earlier) plus `window`, less the options'
    `request_id_margin` (the trip to the target, its backlog, the clocks' skew)."""
    return _slot_due(timer) + window - options.request_id_margin


def _slot_due(timer: Timer) -> int:
    """The timer's slot's own due time, its jitter included."""
    return jittered_due(timer.rule, timer.id, Slot(timer.slot, timer.slot_due_at))


def not_before_its_slot(timer: Timer, at: int) -> int:
    """`at`, or the timer's slot's own due time (its jitter included) when that is later: a
    retry, a BUSY wait or a claim given back is never due before its slot is. Only a clock
    stepped back (NTP, a resumed VM) between the claim and the outcome makes it later; sent
    then, the target would refuse the command as not due on its clock, and the timer park."""
    return max(at, _slot_due(timer))
