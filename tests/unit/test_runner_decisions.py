"""The runner's decisions: hypothesis for the invariants, one example per seed sentence."""

from __future__ import annotations

import pytest
from fakes import MIN, T0, Rule
from fakes import slot_timer as make_timer
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from app.protocol.wire import ResultCode
from app.timers.runner.decision_types import Action, Decision
from app.timers.runner.decisions import (
    SENT,
    TIMEOUT,
    TRANSPORT_ERROR,
    SendResult,
    Verdict,
    classify,
    expire_or_claim,
    on_outcome,
    release,
    retry_parked,
    skip_parked,
)
from app.timers.runner.options import (
    DAY_MS,
    RetryPolicy,
    TimerOptions,
    backoff_ms,
)
from app.timers.runner.send_window import held_until, send_until
from tables.rules import CronRule, IntervalRule, OnceRule
from tables.slots import Slot, first_slot, jittered_due, next_slot
from tables.timer import Outcome, Timer, TimerStatus

OPTIONS = TimerOptions()

FIRED_CODES = ["COMMITTED", "DUPLICATE", "UNCHANGED", "REJECTED", SENT]
FAILED_CODES = [
    "ERROR",
    "SCHEDULE_NOT_DUE",
    "SCHEDULE_JOB_INVALID",
    TIMEOUT,
    TRANSPORT_ERROR,
    "CONTENDED",
    "UNKNOWN",
    "",
]


def claimed(timer: Timer, now: int, options: TimerOptions = OPTIONS) -> Timer:
    decision = expire_or_claim(timer, now, options)
    assert decision.action is Action.CLAIM and decision.change is not None
    return decision.change.next


def claimed_in_time(case: tuple[Timer, int], options: TimerOptions) -> tuple[Timer, int]:
    """The FIRING row a claim of `case`'s timer at its time wrote, and that time: one due
    longer ago than `expires_after` is claimed at its slot's own time (expired otherwise)."""
    timer, claim_time = case
    if claim_time - timer.slot_due_at > options.expires_after:
        timer = timer.model_copy(update={"due_at": timer.slot_due_at})
        claim_time = timer.slot_due_at
    return claimed(timer, claim_time, options), claim_time


# --- strategies -------------------------------------------------------------------------

rules: st.SearchStrategy[Rule] = st.one_of(
    st.builds(OnceRule, at=st.integers(T0, T0 + DAY_MS)),
    st.builds(
        IntervalRule,
        start=st.integers(T0 - DAY_MS, T0),
        every=st.sampled_from([1, 1000, MIN, 7 * MIN, 3_600_000, DAY_MS]),
        coalesce=st.booleans(),
    ),
    st.builds(
        CronRule,
        expr=st.sampled_from(["*/5 * * * *", "0 * * * *", "30 2 * * *", "0 9 * * 1"]),
        zone=st.sampled_from(["UTC", "Europe/Berlin"]),
        start=st.just(T0 - DAY_MS),
        coalesce=st.booleans(),
    ),
)

options_st = st.builds(
    TimerOptions,
    expires_after=st.sampled_from([MIN, 3_600_000, DAY_MS]),
    claim_timeout=st.sampled_from([10_000, 30_000]),
    send_timeout=st.just(5_000),
    retry=st.builds(
        RetryPolicy,
        initial_backoff_ms=st.integers(1, 5000),
        multiplier=st.floats(1.0, 4.0),
        max_backoff_ms=st.just(120_000),
        max_attempts=st.integers(1, 6),
    ),
    max_busy_retries=st.integers(0, 4),
)

codes = st.one_of(st.sampled_from([*FIRED_CODES, "BUSY", *FAILED_CODES]), st.text(max_size=12))


@st.composite
def due_timers(draw: st.DrawFn) -> tuple[Timer, int]:
    """A PENDING or lapsed FIRING timer at some slot of its rule, and a time it is due."""
    rule = draw(rules)
    slot = first_slot(rule, draw(st.integers(T0 - DAY_MS, T0)))
    assert slot is not None
    for _ in range(draw(st.integers(0, 3))):
        slot = next_slot(rule, slot) or slot
    status = draw(st.sampled_from([TimerStatus.PENDING, TimerStatus.FIRING]))
    due_at = slot.due_at + draw(st.integers(0, 10 * MIN))
    timer = make_timer(
        rule,
        slot,
        status=status,
        due_at=due_at,
        attempts=draw(st.integers(0, 5)),
        skipped=draw(st.integers(0, 3)),
    )
    now = due_at + draw(st.one_of(st.integers(0, 2 * MIN), st.integers(0, 3 * DAY_MS)))
    return timer, now


def assert_written_from(decision: Decision, loaded: Timer) -> Timer:
    assert decision.change is not None
    assert decision.change.loaded == loaded
    nxt = decision.change.next
    # Identity never changes: the same timer, only its firing state moves.
    assert (nxt.id, nxt.owner, nxt.key, nxt.version, nxt.partition, nxt.rule) == (
        loaded.id,
        loaded.owner,
        loaded.key,
        loaded.version,
        loaded.partition,
        loaded.rule,
    )
    assert nxt.slot >= loaded.slot, "slots only move forward"
    assert nxt.skipped >= loaded.skipped
    if nxt.slot == loaded.slot:
        assert nxt.slot_due_at == loaded.slot_due_at
        if decision.action is not Action.OPERATOR_RETRY:
            assert nxt.attempts >= loaded.attempts, "attempts never decrease"
    else:
        assert nxt.slot_due_at > loaded.slot_due_at
    if isinstance(loaded.rule, IntervalRule):
        # Every send of a slot carries that slot's own due time, whatever moved due_at.
        assert nxt.slot_due_at == loaded.rule.start + nxt.slot * loaded.rule.every
    if nxt.status is TimerStatus.FIRED:
        assert next_slot(loaded.rule, Slot(loaded.slot, loaded.slot_due_at)) is None
    return nxt


def first_unexpired(timer: Timer, now: int, options: TimerOptions) -> Slot:
    """The first slot after the timer's that is not expired at `now`, found the long way."""
    oldest = now - options.expires_after
    rule = timer.rule
    if isinstance(rule, IntervalRule):
        # Walking one slot of a millisecond at a time through days would take a while.
        n = max(timer.slot + 1, -(-(oldest - rule.start) // rule.every))
        return Slot(n, rule.start + n * rule.every)
    slot = next_slot(rule, Slot(timer.slot, timer.slot_due_at))
    while slot is not None and slot.due_at < oldest:
        slot = next_slot(rule, slot)
    assert slot is not None
    return slot


# --- invariants -------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(due_timers(), options_st)
def test_expire_or_claim_invariants(case: tuple[Timer, int], options: TimerOptions) -> None:
    timer, now = case
    decision = expire_or_claim(timer, now, options)
    nxt = assert_written_from(decision, timer)
    has_next = next_slot(timer.rule, Slot(timer.slot, timer.slot_due_at)) is not None
    if now - timer.slot_due_at > options.expires_after:
        assert not decision.send
        assert nxt.outcome is Outcome.EXPIRED
        if has_next:
            assert decision.action is Action.EXPIRE_SLOT
            # Its failed sends in a row go on with it, as a catch-up's do.
            assert (nxt.status, nxt.attempts) == (TimerStatus.PENDING, timer.attempts)
            assert nxt.due_at == nxt.slot_due_at
            # One jump, to the first slot not expired; every slot passed over is skipped.
            assert (nxt.slot, nxt.slot_due_at) == first_unexpired(timer, now, options)
            assert nxt.skipped - timer.skipped == nxt.slot - timer.slot
        else:
            assert decision.action is Action.EXPIRE
            assert nxt.status is TimerStatus.CANCELLED
            # Its own slot and any after it, all expired: skipped, none sent.
            assert nxt.skipped - timer.skipped >= 1
        return
    assert decision.send and decision.action is Action.CLAIM
    assert nxt.status is TimerStatus.FIRING
    assert nxt.due_at == now + options.claim_timeout
    if nxt.slot == timer.slot:
        # A claim moves only due_at.
        assert nxt.attempts == timer.attempts and nxt.skipped == timer.skipped
    else:
        assert timer.rule.kind != "once" and timer.rule.coalesce
        # Caught up: the failed sends in a row go with it (a target down parks it).
        assert nxt.slot_due_at <= now and nxt.attempts == timer.attempts
        assert nxt.skipped - timer.skipped == nxt.slot - timer.slot
        after = next_slot(timer.rule, Slot(nxt.slot, nxt.slot_due_at))
        assert after is None or after.due_at > now, "the latest slot due"


@settings(max_examples=400, deadline=None)
@given(due_timers(), options_st, codes, st.integers(0, 6), st.integers(0, 2 * MIN))
def test_on_outcome_invariants(
    case: tuple[Timer, int], options: TimerOptions, code: str, busy: int, took: int
) -> None:
    firing, claim_time = claimed_in_time(case, options)
    now = claim_time + took
    decision = on_outcome(firing, SendResult(code), now, options, busy)
    nxt = assert_written_from(decision, firing)
    assert not decision.send
    verdict = classify(code)
    if verdict is Verdict.FIRED:
        has_next = next_slot(firing.rule, Slot(firing.slot, firing.slot_due_at)) is not None
        assert nxt.outcome == Outcome(code)
        if has_next:
            assert (nxt.status, nxt.slot, nxt.attempts) == (TimerStatus.PENDING, firing.slot + 1, 0)
            assert nxt.due_at == nxt.slot_due_at
        else:
            assert nxt.status is TimerStatus.FIRED
        assert decision.busy_in_a_row == 0
        return
    # Not fired: a retry or a park moves only due_at (and attempts), never the slot.
    assert (nxt.slot, nxt.slot_due_at, nxt.skipped) == (
        firing.slot,
        firing.slot_due_at,
        firing.skipped,
    )
    assert nxt.attempts >= firing.attempts, "attempts never decrease"
    if verdict is Verdict.BUSY and busy < options.max_busy_retries:
        assert decision.action is Action.BUSY
        assert nxt.attempts == firing.attempts
        assert nxt.due_at == now + options.retry.initial_backoff_ms
        assert decision.busy_in_a_row == busy + 1
        return
    assert nxt.attempts == firing.attempts + 1
    if decision.park:
        assert firing.attempts + 1 >= options.retry.max_attempts, "parking only when spent"
        assert nxt.status is TimerStatus.PARKED
        assert decision.fallback is not None
        back = decision.fallback.next
        assert decision.fallback.loaded == firing
        assert (back.status, back.attempts) == (TimerStatus.PENDING, firing.attempts)
        assert back.slot_due_at == firing.slot_due_at and back.due_at > now
    else:
        assert firing.attempts + 1 < options.retry.max_attempts
        assert decision.action is Action.RETRY and nxt.status is TimerStatus.PENDING
        assert nxt.due_at == now + backoff_ms(options.retry, nxt.attempts) > now


@given(due_timers(), options_st, codes, st.integers(0, 6), st.integers(1, DAY_MS))
def test_after_the_clock_stepped_back_no_retry_or_release_is_due_before_its_slot(
    case: tuple[Timer, int], options: TimerOptions, code: str, busy: int, back: int
) -> None:
    # NTP stepped the clock back while the send was out: a retry at `now + backoff` (or a
    # claim given back due `now`) would be sent before its slot is due on this very clock,
    # refused by its target as not due, and the timer parked.
    firing, claim_time = claimed_in_time(case, options)
    now = claim_time - back
    slot_due = jittered_due(firing.rule, firing.id, Slot(firing.slot, firing.slot_due_at))
    outcome = on_outcome(firing, SendResult(code), now, options, busy)
    for decision in (outcome, release(firing)):
        for change in (decision.change, decision.fallback):
            if change is None or change.next.slot != firing.slot:
                continue  # fired: its next slot's own due time
            if change.next.status is TimerStatus.PENDING:
                assert change.next.due_at >= slot_due


@settings(max_examples=150, deadline=None)
@given(
    rules,
    options_st,
    st.lists(st.tuples(codes, st.integers(0, 3 * DAY_MS // 2)), min_size=1, max_size=40),
)
def test_a_timer_over_many_rounds(
    rule: Rule, options: TimerOptions, steps: list[tuple[str, int]]
) -> None:
    """One timer through rounds of claims and random results: the invariants hold across
    them, and every send carries its own slot's due time."""
    timer = make_timer(rule)
    now = timer.due_at
    busy = 0
    # Failed sends in a row: a fire starts over, a catch-up or an expired slot does not.
    failures_in_a_row = 0
    for code, wait in steps:
        if timer.status not in (TimerStatus.PENDING, TimerStatus.FIRING):
            break
        now = max(now + wait, timer.due_at)
        decision = expire_or_claim(timer, now, options)
        nxt = assert_written_from(decision, timer)
        if not decision.send:
            timer, busy = nxt, 0
            continue
        assert nxt.attempts == failures_in_a_row
        # not_before of the send: the rule's own due time for that slot.
        assert nxt.slot_due_at <= now
        firing = nxt
        decision = on_outcome(firing, SendResult(code), now, options, busy)
        nxt = assert_written_from(decision, firing)
        busy = decision.busy_in_a_row
        if nxt.slot == firing.slot and nxt.attempts > firing.attempts:
            failures_in_a_row += 1
        elif nxt.slot != firing.slot:
            failures_in_a_row = 0  # fired
        if decision.park:
            assert failures_in_a_row == options.retry.max_attempts
        timer = nxt


@settings(deadline=None)
@given(
    due_timers(),
    st.integers(0, 12 * DAY_MS),
    st.sampled_from([2 * DAY_MS, 7 * DAY_MS]),
    st.booleans(),
)
def test_operator_retry_and_skip(
    case: tuple[Timer, int], later: int, window: int, past_window: bool
) -> None:
    """A retry sends the slot from now for `expires_after`, never past its request-id
    window (less the margin) unless asked past it; past the window, unasked, it is refused
    and writes nothing."""
    timer, _ = case
    parked = timer.model_copy(update={"status": TimerStatus.PARKED, "attempts": 5})
    now = parked.due_at + later
    retried = retry_parked(parked, now, OPTIONS, window, past_window=past_window)
    first_due = jittered_due(parked.rule, parked.id, Slot(parked.slot, parked.slot_due_at))
    held = first_due + window - min(OPTIONS.expires_after, DAY_MS)
    assert held_until(parked, window, OPTIONS) == held
    if now > held and not past_window:
        assert retried == Decision(Action.OPERATOR_REFUSED)
    else:
        nxt = assert_written_from(retried, parked)
        assert (nxt.status, nxt.due_at, nxt.attempts) == (TimerStatus.PENDING, now, 0)
        assert (nxt.slot, nxt.slot_due_at) == (parked.slot, parked.slot_due_at)
        until = now + OPTIONS.expires_after
        assert nxt.retry_until == (until if past_window else min(until, held))
        assert send_until(nxt, OPTIONS) == nxt.retry_until
        # Claimed now, sent; claimed past its horizon, expired, never sent.
        assert expire_or_claim(nxt, now, OPTIONS).send
        late = expire_or_claim(nxt, nxt.retry_until + 1, OPTIONS)
        assert not late.send and late.action in (Action.EXPIRE, Action.EXPIRE_SLOT)
        if late.action is Action.EXPIRE_SLOT:
            assert late.change is not None and late.change.next.retry_until is None
    skipped = skip_parked(parked)
    nxt = assert_written_from(skipped, parked)
    assert (nxt.status, nxt.outcome) == (TimerStatus.CANCELLED, Outcome.SKIPPED)
    # Both leave anything not PARKED alone.
    assert retry_parked(timer, now, OPTIONS, window).change is None
    assert skip_parked(timer).change is None


# --- one example per seed sentence -------------------------------------------------------

ONCE = OnceRule(at=T0)
EVERY_MIN = IntervalRule(start=T0, every=MIN)
EVERY_MIN_EACH = IntervalRule(start=T0, every=MIN, coalesce=False)


def test_a_slot_due_longer_ago_than_expires_after_is_cancelled_as_expired() -> None:
    timer = make_timer(ONCE)
    decision = expire_or_claim(timer, T0 + DAY_MS + 1, OPTIONS)
    assert decision.action is Action.EXPIRE and not decision.send
    assert decision.change is not None
    assert decision.change.next.status is TimerStatus.CANCELLED
    assert decision.change.next.outcome is Outcome.EXPIRED


def test_expiry_is_strictly_longer_ago() -> None:
    assert expire_or_claim(make_timer(ONCE), T0 + DAY_MS, OPTIONS).action is Action.CLAIM


def test_an_expired_slot_of_a_recurring_rule_moves_on_to_its_next_slot() -> None:
    # Its 3 failed sends go on with it: a target down for good still parks the timer.
    timer = make_timer(EVERY_MIN, attempts=3)
    decision = expire_or_claim(timer, T0 + DAY_MS + 1, OPTIONS)
    assert decision.action is Action.EXPIRE_SLOT and not decision.send
    assert decision.change is not None
    nxt = decision.change.next
    assert (nxt.status, nxt.slot, nxt.slot_due_at, nxt.due_at, nxt.attempts) == (
        TimerStatus.PENDING,
        1,
        T0 + MIN,
        T0 + MIN,
        3,
    )


def test_a_recurring_timer_far_behind_jumps_to_its_first_slot_not_expired_at_once() -> None:
    timer = make_timer(EVERY_MIN, skipped=2)
    now = T0 + 3 * DAY_MS + 30_000
    decision = expire_or_claim(timer, now, OPTIONS)
    assert decision.action is Action.EXPIRE_SLOT and not decision.send
    assert decision.change is not None
    nxt = decision.change.next
    # Slot 2 * 1440 is due at T0 + 2 days, 30 s longer ago than a day: expired too.
    first = 2 * 1440 + 1
    assert (nxt.status, nxt.slot, nxt.slot_due_at, nxt.due_at, nxt.outcome) == (
        TimerStatus.PENDING,
        first,
        T0 + first * MIN,
        T0 + first * MIN,
        Outcome.EXPIRED,
    )
    assert nxt.skipped == 2 + first
    # Due already: the next round claims it, not expires it again.
    assert expire_or_claim(nxt, now, OPTIONS).action is Action.CLAIM


def test_a_cron_timer_far_behind_jumps_to_its_first_slot_not_expired() -> None:
    rule = CronRule(expr="0 * * * *", zone="UTC", start=T0)
    timer = make_timer(rule)
    now = timer.slot_due_at + 10 * DAY_MS
    decision = expire_or_claim(timer, now, OPTIONS)
    assert decision.action is Action.EXPIRE_SLOT and decision.change is not None
    nxt = decision.change.next
    assert (nxt.slot, nxt.slot_due_at) == (9 * 24, timer.slot_due_at + 9 * DAY_MS)
    assert nxt.skipped == 9 * 24


def test_a_claim_is_pending_to_firing_due_again_at_its_deadline() -> None:
    timer = make_timer(ONCE, attempts=2)
    decision = expire_or_claim(timer, T0 + 5, OPTIONS)
    assert decision.send and decision.change is not None
    assert decision.change.loaded == timer
    nxt = decision.change.next
    assert nxt.status is TimerStatus.FIRING
    assert nxt.due_at == T0 + 5 + OPTIONS.claim_timeout
    assert (nxt.slot, nxt.slot_due_at, nxt.attempts) == (0, T0, 2)


def test_a_timer_not_due_yet_or_a_claim_not_lapsed_is_left_alone() -> None:
    assert expire_or_claim(make_timer(ONCE), T0 - 1, OPTIONS).change is None
    firing = claimed(make_timer(ONCE), T0)
    assert expire_or_claim(firing, T0 + 1, OPTIONS).change is None
    parked = make_timer(ONCE, status=TimerStatus.PARKED)
    assert expire_or_claim(parked, T0 + 1, OPTIONS).change is None


def test_a_lapsed_claim_is_claimed_anew_with_the_same_request_id() -> None:
    firing = claimed(make_timer(ONCE), T0)
    lapsed_at = firing.due_at
    again = claimed(firing, lapsed_at)
    assert again.status is TimerStatus.FIRING
    assert again.due_at == lapsed_at + OPTIONS.claim_timeout
    assert again.request_id == firing.request_id == "t-1#0"


@pytest.mark.parametrize("code", ["COMMITTED", "DUPLICATE", "UNCHANGED", "REJECTED"])
def test_a_fired_slot_of_a_rule_due_once_is_fired(code: str) -> None:
    decision = on_outcome(claimed(make_timer(ONCE), T0), SendResult(code), T0 + 9, OPTIONS)
    assert decision.action is Action.FIRE and decision.change is not None
    assert decision.change.next.status is TimerStatus.FIRED
    assert decision.change.next.outcome == Outcome(code)


@pytest.mark.parametrize("code", ["COMMITTED", "DUPLICATE", "UNCHANGED", "REJECTED"])
def test_a_fired_slot_of_a_recurring_rule_is_pending_at_its_next_slot(code: str) -> None:
    firing = claimed(make_timer(EVERY_MIN, attempts=2), T0)
    decision = on_outcome(firing, SendResult(code), T0 + 9, OPTIONS)
    assert decision.action is Action.NEXT_SLOT and decision.change is not None
    nxt = decision.change.next
    assert (nxt.status, nxt.slot, nxt.slot_due_at, nxt.due_at, nxt.attempts, nxt.outcome) == (
        TimerStatus.PENDING,
        1,
        T0 + MIN,
        T0 + MIN,
        0,
        Outcome(code),
    )


def test_a_rejection_is_not_a_failure() -> None:
    firing = claimed(make_timer(ONCE, attempts=4), T0)
    decision = on_outcome(firing, SendResult("REJECTED"), T0, OPTIONS)
    assert not decision.park and decision.action is Action.FIRE


def test_a_cross_context_send_acknowledged_is_fired_as_sent() -> None:
    decision = on_outcome(claimed(make_timer(ONCE), T0), SendResult(SENT), T0, OPTIONS)
    assert decision.change is not None
    assert (decision.change.next.status, decision.change.next.outcome) == (
        TimerStatus.FIRED,
        Outcome.SENT,
    )


@pytest.mark.parametrize("code", FAILED_CODES)
def test_a_technical_failure_stays_pending_due_after_the_backoff(code: str) -> None:
    firing = claimed(make_timer(ONCE, attempts=1), T0)
    decision = on_outcome(firing, SendResult(code), T0 + 100, OPTIONS)
    assert decision.action is Action.RETRY and decision.change is not None
    nxt = decision.change.next
    assert (nxt.status, nxt.attempts, nxt.outcome) == (TimerStatus.PENDING, 2, Outcome.FAILED)
    assert nxt.due_at == T0 + 100 + 2000  # the second failure: initial x multiplier
    assert nxt.slot_due_at == T0


def test_spent_attempts_park_and_a_failing_ledger_sends_the_last_attempt_again() -> None:
    firing = claimed(make_timer(ONCE, attempts=4), T0)
    decision = on_outcome(firing, SendResult("ERROR"), T0 + 100, OPTIONS)
    assert decision.park and decision.change is not None and decision.fallback is not None
    assert (decision.change.next.status, decision.change.next.attempts) == (TimerStatus.PARKED, 5)
    back = decision.fallback.next
    assert (back.status, back.attempts) == (TimerStatus.PENDING, 4)
    assert back.due_at == T0 + 100 + backoff_ms(OPTIONS.retry, 5)


def test_busy_is_backpressure_up_to_max_busy_retries_then_an_attempt() -> None:
    firing = claimed(make_timer(ONCE, attempts=1), T0)
    busy = SendResult("BUSY")
    within = on_outcome(firing, busy, T0, OPTIONS, busy_in_a_row=9)
    assert within.action is Action.BUSY and within.change is not None
    assert within.change.next.attempts == 1 and within.busy_in_a_row == 10
    assert within.change.next.due_at == T0 + OPTIONS.retry.initial_backoff_ms
    beyond = on_outcome(firing, busy, T0, OPTIONS, busy_in_a_row=10)
    assert beyond.action is Action.RETRY and beyond.change is not None
    assert beyond.change.next.attempts == 2 and beyond.change.next.outcome is Outcome.BUSY
    assert beyond.busy_in_a_row == 11


def test_a_target_that_stays_busy_parks_the_timer_in_the_end() -> None:
    timer, now, busy = make_timer(ONCE), T0, 0
    for _ in range(100):
        decision = on_outcome(claimed(timer, now), SendResult("BUSY"), now, OPTIONS, busy)
        assert decision.change is not None
        if decision.park:
            break
        timer, now, busy = decision.change.next, decision.change.next.due_at, decision.busy_in_a_row
    else:
        pytest.fail("never parked")
    assert busy == OPTIONS.max_busy_retries + OPTIONS.retry.max_attempts - 1


def test_a_coalescing_rule_sends_only_the_latest_slot_due() -> None:
    timer = make_timer(EVERY_MIN)
    nxt = claimed(timer, T0 + 10 * MIN + 5)
    assert (nxt.slot, nxt.slot_due_at, nxt.skipped) == (10, T0 + 10 * MIN, 10)
    assert nxt.request_id == "t-1#10"


def test_a_rule_that_does_not_coalesce_sends_slot_by_slot() -> None:
    nxt = claimed(make_timer(EVERY_MIN_EACH), T0 + 10 * MIN + 5)
    assert (nxt.slot, nxt.slot_due_at, nxt.skipped) == (0, T0, 0)


def test_a_timer_one_time_of_its_rule_behind_is_not_caught_up() -> None:
    nxt = claimed(make_timer(EVERY_MIN), T0 + MIN - 1)
    assert (nxt.slot, nxt.skipped) == (0, 0)


def test_a_released_claim_is_due_at_its_slot_with_its_attempts() -> None:
    """A retry too (claimed once due, its backoff waited out): due at the node's time, it
    had the next owner wait for the skew of a node whose clock ran ahead."""
    firing = claimed(make_timer(ONCE, attempts=3), T0 + 5_000)
    decision = release(firing)
    assert decision.change is not None
    nxt = decision.change.next
    assert (nxt.status, nxt.due_at, nxt.attempts, nxt.slot_due_at) == (
        TimerStatus.PENDING,
        T0,
        3,
        T0,
    )
    assert release(make_timer(ONCE)).change is None


def test_an_outcome_for_a_row_not_firing_does_nothing() -> None:
    assert on_outcome(make_timer(ONCE), SendResult("COMMITTED"), T0, OPTIONS).change is None


# --- options -----------------------------------------------------------------------------


def test_backoff_grows_and_is_capped() -> None:
    policy = RetryPolicy()
    assert [backoff_ms(policy, n) for n in range(1, 9)] == [
        1000,
        2000,
        4000,
        8000,
        16000,
        32000,
        60000,
        60000,
    ]
    assert backoff_ms(policy, 0) == 1000
    assert backoff_ms(policy, 10**9) == 60_000


def test_defaults() -> None:
    options = TimerOptions()
    assert options.expires_after == DAY_MS and options.claim_timeout == 30_000
    assert options.retry == RetryPolicy(
        initial_backoff_ms=1000, multiplier=2.0, max_backoff_ms=60_000, max_attempts=5
    )
    assert (options.max_busy_retries, options.batch_limit, options.poll_interval_ms) == (
        10,
        1000,
        100,
    )
    assert TimerOptions.PARKED_SUBSCRIPTION == "tickwheel.timers"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"expires_after": 0}, "expires_after"),
        ({"claim_timeout": -1}, "claim_timeout"),
        ({"batch_limit": 0}, "batch_limit"),
        ({"poll_interval_ms": 0}, "poll_interval_ms"),
        ({"max_busy_retries": -1}, "max_busy_retries"),
        ({"send_timeout": 60_000}, "must not exceed claim_timeout"),
        ({"retry": {"max_attempts": 0}}, "max_attempts"),
        ({"retry": {"initial_backoff_ms": 0}}, "initial_backoff_ms"),
        ({"retry": {"initial_backoff_ms": 10, "max_backoff_ms": 5}}, "at least"),
        ({"retry": {"multiplier": 0.5}}, "multiplier"),
    ],
)
def test_bad_options_are_refused_clearly(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        TimerOptions.model_validate(fields)


def test_options_are_frozen() -> None:
    with pytest.raises(ValidationError):
        OPTIONS.batch_limit = 5  # type: ignore[misc]


def test_every_result_code_is_classified() -> None:
    assert {code: classify(code.value) for code in ResultCode} == {
        ResultCode.COMMITTED: Verdict.FIRED,
        ResultCode.DUPLICATE: Verdict.FIRED,
        ResultCode.UNCHANGED: Verdict.FIRED,
        ResultCode.REJECTED: Verdict.FIRED,
        ResultCode.BUSY: Verdict.BUSY,
        ResultCode.SCHEDULE_NOT_DUE: Verdict.FAILED,
        ResultCode.SCHEDULE_JOB_INVALID: Verdict.FAILED,
        ResultCode.ERROR: Verdict.FAILED,
    }
