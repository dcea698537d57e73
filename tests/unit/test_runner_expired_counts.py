"""Every slot of a timer that is done was sent or counted as skipped: an expiry with no
slot left counts its own slot and those after it to the rule's last, as an expiry that
moves on to a later slot counts those it passes over (a hunt: the last expiry of a rule
with an end counted none of them)."""

from __future__ import annotations

from fakes import MIN, T0
from fakes import slot_timer as make_timer
from hypothesis import given, settings
from hypothesis import strategies as st

from app.timers.runner import SendResult, TimerOptions
from app.timers.runner.decision_types import Action
from app.timers.runner.decisions import expire_or_claim, on_outcome
from tables.rules import IntervalRule, OnceRule
from tables.slots import first_slot, jittered_due
from tables.timer import Outcome, TimerStatus

OPTIONS = TimerOptions(expires_after=10 * MIN)


def test_the_last_expiry_of_a_rule_with_a_count_counts_the_slots_it_passes_over() -> None:
    timer = make_timer(IntervalRule(start=T0, every=MIN, count=3), skipped=1)
    decision = expire_or_claim(timer, T0 + 2 * MIN + OPTIONS.expires_after + 1, OPTIONS)
    assert decision.action is Action.EXPIRE and decision.change is not None
    nxt = decision.change.next
    assert (nxt.status, nxt.outcome, nxt.slot) == (TimerStatus.CANCELLED, Outcome.EXPIRED, 0)
    assert nxt.skipped == 1 + 3  # slots 0, 1 and 2, none sent


def test_the_expiry_of_a_once_rule_counts_its_slot() -> None:
    decision = expire_or_claim(make_timer(OnceRule(at=T0)), T0 + OPTIONS.expires_after + 1, OPTIONS)
    assert decision.action is Action.EXPIRE and decision.change is not None
    assert decision.change.next.skipped == 1


rules = st.builds(
    IntervalRule,
    start=st.just(T0),
    every=st.sampled_from([1000, MIN, 7 * MIN]),
    count=st.one_of(st.none(), st.integers(1, 6)),
    until=st.one_of(st.none(), st.integers(T0, T0 + 40 * MIN)),
    coalesce=st.booleans(),
    jitter=st.sampled_from([None, 999]),
).filter(lambda r: r.count is not None or r.until is not None)


@settings(max_examples=300, deadline=None)
@given(rules, st.lists(st.sampled_from([0, 1, MIN, 3 * MIN, 11 * MIN, 40 * MIN]), max_size=60))
def test_every_slot_of_a_timer_that_is_done_was_sent_or_skipped(
    rule: IntervalRule, waits: list[int]
) -> None:
    slot = first_slot(rule, T0)
    assert slot is not None
    timer = make_timer(rule, slot, due_at=jittered_due(rule, "t-1", slot))
    now, sent = T0, 0
    for wait in [*waits, 10_000 * MIN]:  # the last wait sees every slot expired, at most
        now = max(now, timer.due_at) + wait
        change = expire_or_claim(timer, now, OPTIONS).change
        assert change is not None
        if change.next.status is TimerStatus.FIRING:
            sent += 1
            change = on_outcome(change.next, SendResult("COMMITTED"), now, OPTIONS).change
            assert change is not None
        timer = change.next
        if timer.status is not TimerStatus.PENDING:
            break
    assert timer.status in (TimerStatus.FIRED, TimerStatus.CANCELLED)
    slots = rule.count if rule.count is not None else 10**9
    if rule.until is not None:
        slots = min(slots, (rule.until - rule.start) // rule.every + 1)
    assert sent + timer.skipped == slots
