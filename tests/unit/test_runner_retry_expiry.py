"""A slot is sent, its retries included, until `expires_after` after it was due; an
operator's retry of a PARKED slot sends it for `expires_after` from the retry, within the
target's request-id window (issue 10, item 7; a hunt: retries measured from their own due
time outlived the window, and the target applied the slot twice).

The decisions by themselves (hypothesis), then rounds of a runner on a fake clock, a
restart included.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from fakes import MIN, OWNER, T0, TARGET, AnsweringSender, StillClock
from fakes import slot_timer as make
from hypothesis import given, settings
from hypothesis import strategies as st

from app.timers.runner import SendResult, TimerOptions, TimerRunner
from app.timers.runner.decision_types import Action, Decision
from app.timers.runner.decisions import expire_or_claim, on_outcome, retry_parked
from app.timers.runner.options import (
    DAY_MS,
    REQUEST_ID_WINDOW_MS,
    RetryPolicy,
)
from app.timers.runner.send_window import send_until
from tables import open_timer_store
from tables.ledger import MemoryFailureLedger
from tables.rules import IntervalRule, OnceRule
from tables.store import TimerStore
from tables.timer import Outcome, TimerStatus

SUB = TimerOptions.PARKED_SUBSCRIPTION
OPTIONS = TimerOptions(retry=RetryPolicy(max_attempts=2))
WINDOW = REQUEST_ID_WINDOW_MS


# --- the decisions ------------------------------------------------------------------------

outcomes = st.sampled_from(
    [None, Outcome.COMMITTED, Outcome.EXPIRED, Outcome.SENT, Outcome.FAILED, Outcome.BUSY]
)


@settings(max_examples=300, deadline=None)
@given(
    st.booleans(),
    outcomes,
    st.integers(0, 3 * DAY_MS),
    st.integers(0, 3 * DAY_MS),
    st.sampled_from([MIN, DAY_MS]),
)
def test_expiry_counts_from_the_slot_however_it_is_retried(
    recurring: bool, outcome: Outcome | None, retry_later: int, wait: int, expires_after: int
) -> None:
    """A retry (FAILED), a BUSY wait, a claim given back: each moved `due_at`, none moves
    the slot's expiry. Before, a retry counted from its own due time: its slot never
    expired as a whole, and was sent past the target's request-id window."""
    rule = IntervalRule(start=T0, every=7 * MIN) if recurring else OnceRule(at=T0)
    timer = make(rule, due_at=T0 + retry_later, outcome=outcome)
    now = timer.due_at + wait
    options = TimerOptions(expires_after=expires_after)
    decision = expire_or_claim(timer, now, options)
    assert send_until(timer, options) == T0 + expires_after
    if now - T0 > expires_after:
        assert decision.action is (Action.EXPIRE_SLOT if recurring else Action.EXPIRE)
        assert not decision.send
    else:
        assert decision.action is Action.CLAIM and decision.send


@settings(max_examples=200, deadline=None)
@given(
    st.booleans(),
    st.sampled_from([Outcome.FAILED, Outcome.BUSY, None]),
    st.integers(0, 12 * DAY_MS),
    st.booleans(),
)
def test_an_operators_retry_is_claimed_within_the_window_and_refused_past_it(
    recurring: bool, parked_with: Outcome | None, later: int, past_window: bool
) -> None:
    rule = IntervalRule(start=T0, every=DAY_MS, coalesce=False) if recurring else OnceRule(at=T0)
    parked = make(rule, status=TimerStatus.PARKED, attempts=5, outcome=parked_with)
    now = T0 + later
    retried = retry_parked(parked, now, OPTIONS, WINDOW, past_window=past_window)
    margin = OPTIONS.request_id_margin
    assert margin == DAY_MS  # as long as `expires_after`, a day: at most a day
    if now > T0 + WINDOW - margin and not past_window:
        # Its target may have applied it and forgotten its request id: left PARKED.
        assert retried == Decision(Action.OPERATOR_REFUSED) and retried.change is None
        return
    assert retried.change is not None
    row = retried.change.next
    assert (row.status, row.due_at, row.attempts) == (TimerStatus.PENDING, now, 0)
    assert (row.slot, row.slot_due_at) == (parked.slot, parked.slot_due_at)
    assert row.outcome in (Outcome.FAILED, Outcome.BUSY)
    held = T0 + WINDOW - margin
    assert row.retry_until == (
        now + OPTIONS.expires_after if past_window else min(now + OPTIONS.expires_after, held)
    )
    claim = expire_or_claim(row, now, OPTIONS)
    assert claim.action is Action.CLAIM and claim.change is not None
    # The parked slot itself: a rule that does not coalesce sends it, not a later one.
    assert claim.change.next.request_id == parked.request_id
    assert claim.change.next.retry_until == row.retry_until


def test_a_retry_that_fails_is_retried_then_parked_again_not_expired() -> None:
    parked = make(status=TimerStatus.PARKED, attempts=2, outcome=Outcome.FAILED)
    now = T0 + 3 * DAY_MS
    change = retry_parked(parked, now, OPTIONS, WINDOW).change
    assert change is not None
    timer = change.next
    for attempt in range(1, OPTIONS.retry.max_attempts + 1):
        claim = expire_or_claim(timer, now, OPTIONS)
        assert claim.action is Action.CLAIM and claim.change is not None
        outcome = on_outcome(claim.change.next, SendResult("ERROR"), now, OPTIONS)
        assert outcome.change is not None
        timer, now = outcome.change.next, outcome.change.next.due_at
        if attempt < OPTIONS.retry.max_attempts:
            assert outcome.action is Action.RETRY
    assert outcome.park and timer.status is TimerStatus.PARKED


def test_a_send_retried_past_its_slots_expiry_expires() -> None:
    """A retry due five days after its slot (a long backoff, a cluster down): before, it
    was sent, counted from its own due time; its slot expired four days before."""
    retried = make(due_at=T0 + 5 * DAY_MS, attempts=3, outcome=Outcome.FAILED)
    assert expire_or_claim(retried, T0 + 5 * DAY_MS, OPTIONS).action is Action.EXPIRE
    in_time = make(due_at=T0 + DAY_MS, attempts=3, outcome=Outcome.FAILED)
    assert expire_or_claim(in_time, T0 + DAY_MS, OPTIONS).action is Action.CLAIM
    assert expire_or_claim(in_time, T0 + DAY_MS + 1, OPTIONS).action is Action.EXPIRE


def test_an_operators_retry_that_waited_longer_than_expires_after_expires() -> None:
    """The retry itself was due more than a day ago (the cluster down): expired."""
    parked = make(status=TimerStatus.PARKED, attempts=2, outcome=Outcome.FAILED)
    change = retry_parked(parked, T0 + 2 * DAY_MS, OPTIONS, WINDOW).change
    assert change is not None and change.next.retry_until == T0 + 3 * DAY_MS
    retried = change.next
    assert expire_or_claim(retried, T0 + 3 * DAY_MS, OPTIONS).action is Action.CLAIM
    assert expire_or_claim(retried, T0 + 3 * DAY_MS + 1, OPTIONS).action is Action.EXPIRE


def test_a_slot_never_sent_still_expires_from_its_own_due_time() -> None:
    # A release or a lapsed claim moved due_at: the slot was never answered, so its age counts.
    released = make(due_at=T0 + DAY_MS, outcome=Outcome.COMMITTED)
    assert expire_or_claim(released, T0 + DAY_MS + 1, OPTIONS).action is Action.EXPIRE


# --- rounds of a runner -------------------------------------------------------------------


@pytest.fixture
async def store() -> AsyncIterator[TimerStore]:
    s = open_timer_store("memory://", partitions=1)
    yield s
    await s.close()


async def park_one_off(
    store: TimerStore, clock: StillClock, ledger: MemoryFailureLedger
) -> TimerRunner:
    """A one-off due at T0 whose sends fail until it is PARKED, its target in the ledger."""
    assert await store.put(make())
    runner = TimerRunner(store, AnsweringSender("ERROR", "ERROR"), clock, ledger, OPTIONS, [0])
    for _ in range(OPTIONS.retry.max_attempts):
        row = await store.find(OWNER, "remind")
        assert row is not None
        clock.t = max(clock.t, row.due_at)
        await runner.run_round()
    row = await store.find(OWNER, "remind")
    assert row is not None and row.status is TimerStatus.PARKED
    assert [e.target for e in await ledger.entries()] == [TARGET]
    return runner


async def test_a_one_off_parked_two_days_after_its_slot_is_sent_on_retry(
    store: TimerStore,
) -> None:
    clock, ledger = StillClock(T0), MemoryFailureLedger()
    await park_one_off(store, clock, ledger)
    clock.t = T0 + 2 * DAY_MS
    sender = AnsweringSender()
    runner = TimerRunner(store, sender, clock, ledger, OPTIONS, [0])
    assert await runner.retry(TARGET) == 1
    assert await ledger.entries() == []
    stats = await runner.run_round()
    assert (stats.expired, stats.fired) == (0, 1)
    assert sender.sent == ["t-1#0"]
    row = await store.find(OWNER, "remind")
    assert row is not None
    assert (row.status, row.outcome, row.slot_due_at) == (
        TimerStatus.FIRED,
        Outcome.COMMITTED,
        T0,
    )


async def test_the_retry_survives_a_restart_and_fails_into_the_ledger_again(
    store: TimerStore,
) -> None:
    """The retry is asked on one node; another (the row alone, no memory) sends it, its
    sends fail, and it parks again with its target back in the ledger: never EXPIRED."""
    clock, ledger = StillClock(T0), MemoryFailureLedger()
    await park_one_off(store, clock, ledger)
    clock.t = T0 + 2 * DAY_MS
    first = TimerRunner(store, AnsweringSender(), clock, ledger, OPTIONS, [0])
    assert await first.retry(TARGET) == 1
    sender = AnsweringSender(*["ERROR"] * OPTIONS.retry.max_attempts)
    restarted = TimerRunner(store, sender, clock, ledger, OPTIONS, [0])
    for _ in range(OPTIONS.retry.max_attempts):
        row = await store.find(OWNER, "remind")
        assert row is not None and row.status is TimerStatus.PENDING
        clock.t = max(clock.t, row.due_at)
        stats = await restarted.run_round()
        assert stats.expired == 0
    assert sender.sent == ["t-1#0"] * OPTIONS.retry.max_attempts
    row = await store.find(OWNER, "remind")
    assert row is not None and (row.status, row.outcome) == (TimerStatus.PARKED, Outcome.FAILED)
    assert [e.target for e in await ledger.entries()] == [TARGET]


async def test_a_recurring_timer_retried_days_later_sends_its_parked_slot(
    store: TimerStore,
) -> None:
    """A rule that does not coalesce sends the parked slot itself, then the next ones
    (the expired of those are jumped over as before)."""
    rule = IntervalRule(start=T0, every=MIN, coalesce=False)
    assert await store.put(make(rule))
    clock, ledger = StillClock(T0), MemoryFailureLedger()
    runner = TimerRunner(store, AnsweringSender("ERROR", "ERROR"), clock, ledger, OPTIONS, [0])
    for _ in range(OPTIONS.retry.max_attempts):
        row = await store.find(OWNER, "remind")
        assert row is not None
        clock.t = max(clock.t, row.due_at)
        await runner.run_round()
    row = await store.find(OWNER, "remind")
    assert row is not None and row.status is TimerStatus.PARKED and row.slot == 0
    clock.t = T0 + 3 * DAY_MS
    sender = AnsweringSender()
    runner = TimerRunner(store, sender, clock, ledger, OPTIONS, [0])
    assert await runner.retry(TARGET) == 1
    await runner.run_round()
    assert sender.sent == ["t-1#0"]
    row = await store.find(OWNER, "remind")
    assert row is not None and (row.status, row.slot) == (TimerStatus.PENDING, 1)
    assert row.retry_until is None, "the retry's horizon was slot 0's alone"
    # Slot 1 was due three days ago and never sent: it expires, as any such slot does.
    stats = await runner.run_round()
    assert stats.expired == 1 and sender.sent == ["t-1#0"]
