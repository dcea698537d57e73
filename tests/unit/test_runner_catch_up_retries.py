"""A coalescing recurring timer whose target stays down parks after `max_attempts` failed
sends in a row, whichever slots they were for (a hunt: a catch-up to the latest slot due,
when the retries' backoffs added up past the rule's interval, reset its attempts to 0, so
it never parked: any interval under about 15 s with the default retry policy, every
minute with `max_attempts=10`).

The decisions by themselves (hypothesis), then rounds of a runner on a fake clock.
"""

from __future__ import annotations

from fakes import MIN, T0, World, always, raw_store, world
from fakes import slot_timer as make_timer
from hypothesis import given, settings
from hypothesis import strategies as st

from app.timers.runner import SendResult, TimerOptions
from app.timers.runner.decision_types import Action
from app.timers.runner.decisions import expire_or_claim, on_outcome
from app.timers.runner.options import RetryPolicy
from tables.rules import CronRule, IntervalRule
from tables.timer import Outcome, TimerStatus

__all__ = ["raw_store", "world"]

SUB = TimerOptions.PARKED_SUBSCRIPTION

recurring = st.one_of(
    st.builds(IntervalRule, start=st.just(T0), every=st.sampled_from([1, 500, 1000, 10_000, MIN])),
    st.builds(CronRule, expr=st.sampled_from(["* * * * *", "* * * * * *"]), start=st.just(T0)),
)

policies = st.builds(
    RetryPolicy,
    initial_backoff_ms=st.integers(1, 5000),
    multiplier=st.floats(1.0, 4.0),
    max_backoff_ms=st.just(120_000),
    max_attempts=st.integers(1, 12),
)


@settings(max_examples=200, deadline=None)
@given(recurring, policies, st.lists(st.integers(0, 3 * MIN), min_size=12, max_size=12))
def test_a_target_that_stays_down_parks_after_max_attempts_failed_sends_in_a_row(
    rule: IntervalRule | CronRule, retry: RetryPolicy, late: list[int]
) -> None:
    options = TimerOptions(retry=retry)
    timer = make_timer(rule)
    now = timer.due_at
    slots = []
    for sends, wait in enumerate(late, start=1):
        now = max(now, timer.due_at) + wait
        claim = expire_or_claim(timer, now, options)
        assert claim.action is Action.CLAIM and claim.change is not None
        firing = claim.change.next
        # The failures so far go with the slot a catch-up moves to; its own window stays.
        assert firing.attempts == sends - 1
        assert firing.slot_due_at <= now
        slots.append(firing.slot)
        outcome = on_outcome(firing, SendResult("ERROR"), now, options)
        assert outcome.change is not None
        if outcome.park:
            assert sends == retry.max_attempts
            assert outcome.change.next.attempts == retry.max_attempts
            return
        assert outcome.action is Action.RETRY and sends < retry.max_attempts
        timer = outcome.change.next
    raise AssertionError(f"never parked after {len(late)} failed sends, of slots {slots}")


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 4), st.integers(2 * MIN, 10 * MIN))
def test_a_fire_after_a_catch_up_resets_the_attempts(failures: int, late: int) -> None:
    options = TimerOptions(retry=RetryPolicy(max_attempts=5))
    timer = make_timer(IntervalRule(start=T0, every=MIN), attempts=failures)
    firing = expire_or_claim(timer, T0 + late, options).change
    assert firing is not None and firing.next.slot == late // MIN
    assert firing.next.attempts == failures
    fired = on_outcome(firing.next, SendResult("COMMITTED"), T0 + late, options)
    assert fired.action is Action.NEXT_SLOT and fired.change is not None
    assert (fired.change.next.attempts, fired.change.next.outcome) == (0, Outcome.COMMITTED)


async def test_a_coalescing_timer_whose_target_stays_down_is_parked_and_named(
    world: World,
) -> None:
    await world.put(rule=IntervalRule(start=T0, every=10_000))
    runner = world.runner(always("ERROR"))
    for _ in range(20):
        row = await world.row()
        if row.status is TimerStatus.PARKED:
            break
        world.clock.set(row.due_at)
        await runner.run_round()
    row = await world.row()
    assert (row.status, row.attempts) == (TimerStatus.PARKED, 5)
    # Five failed sends in a row, the last ones for slots caught up to.
    assert len(world.sender.sends) == 5
    assert row.slot > 0 and row.skipped == row.slot
    entry = await world.ledger.entry(SUB, row.target)
    assert entry is not None and row.request_id in entry.timers


@settings(max_examples=100, deadline=None)
@given(
    every=st.sampled_from([1000, 10_000, MIN]),
    expires_after=st.integers(1000, 60_000),
    max_attempts=st.integers(1, 8),
    multiplier=st.floats(2.0, 10.0),
)
def test_a_target_that_stays_down_parks_when_its_backoffs_outlast_expires_after(
    every: int, expires_after: int, max_attempts: int, multiplier: float
) -> None:
    # Each slot expires while it is retried (the backoff past its send window): the next
    # slot carries the failed sends on, as a catch-up does, so the timer still parks.
    retry = RetryPolicy(
        initial_backoff_ms=1000,
        multiplier=multiplier,
        max_backoff_ms=7 * 24 * 3_600_000,
        max_attempts=max_attempts,
    )
    options = TimerOptions(expires_after=expires_after, retry=retry)
    timer = make_timer(IntervalRule(start=T0, every=every))
    sends, now = 0, T0
    for _ in range(10 * max_attempts):
        now = max(now, timer.due_at)
        d = expire_or_claim(timer, now, options)
        assert d.change is not None
        if d.action is Action.EXPIRE_SLOT:
            timer = d.change.next
            continue
        assert d.action is Action.CLAIM
        sends += 1
        outcome = on_outcome(d.change.next, SendResult("ERROR"), now, options)
        if outcome.park:
            assert sends == max_attempts
            return
        assert outcome.change is not None
        timer = outcome.change.next
    raise AssertionError(f"never parked after {sends} failed sends")
