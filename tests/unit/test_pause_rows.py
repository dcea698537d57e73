"""Pause and resume of a timer row (`tables.writes.pause_row`, `resume_row`): pure, so
hypothesis holds them to their rules on every rule kind. A PARKED timer pauses too, and
its resume parks it again."""

from __future__ import annotations

from fakes import MIN, T0, Rule
from fakes import slot_timer as make_timer
from hypothesis import given
from hypothesis import strategies as st

from app.timers.runner.decision_types import NOTHING
from app.timers.runner.decisions import retry_parked, skip_parked
from app.timers.runner.options import DAY_MS, TimerOptions
from tables.keys import decode_timer, encode_timer
from tables.rules import CronRule, IntervalRule, OnceRule
from tables.slots import Slot, caught_up, first_slot, jittered_due, next_slot
from tables.timer import Outcome, Timer, TimerStatus
from tables.writes import cancel_row, pause_row, resume_row

rules: st.SearchStrategy[Rule] = st.one_of(
    st.builds(OnceRule, at=st.integers(T0, T0 + DAY_MS)),
    st.builds(
        IntervalRule,
        start=st.integers(T0 - DAY_MS, T0),
        every=st.sampled_from([1000, MIN, 7 * MIN, 3_600_000, DAY_MS]),
        coalesce=st.booleans(),
        jitter=st.sampled_from([None, 500]),
        count=st.sampled_from([None, 3, 50]),
    ),
    st.builds(
        CronRule,
        expr=st.sampled_from(["*/5 * * * *", "0 * * * *", "30 2 * * *"]),
        zone=st.sampled_from(["UTC", "Europe/Berlin"]),
        start=st.just(T0 - DAY_MS),
        coalesce=st.booleans(),
    ),
)


@st.composite
def running(draw: st.DrawFn) -> Timer:
    """A PENDING or FIRING timer at some slot of its rule, at version 3."""
    rule = draw(rules)
    # a rule whose count ended by then: its first slot
    slot = first_slot(rule, draw(st.integers(T0 - DAY_MS, T0))) or first_slot(rule, 0)
    assert slot is not None
    for _ in range(draw(st.integers(0, 2))):
        slot = next_slot(rule, slot) or slot
    return make_timer(
        rule,
        slot,
        version=3,
        status=draw(st.sampled_from([TimerStatus.PENDING, TimerStatus.FIRING])),
        due_at=slot.due_at + draw(st.integers(0, 10 * MIN)),
        attempts=draw(st.integers(0, 4)),
        skipped=draw(st.integers(0, 3)),
    )


@given(running(), st.integers(3, 9))
def test_a_pause_holds_the_row_as_it_was(timer: Timer, version: int) -> None:
    paused = pause_row(timer, version)
    assert paused is not None
    assert paused.status is TimerStatus.PAUSED
    assert paused.version == version
    kept = ("id", "rule", "slot", "slot_due_at", "attempts", "skipped", "outcome", "target")
    assert all(getattr(paused, f) == getattr(timer, f) for f in kept)
    if timer.status is TimerStatus.FIRING:
        # the claim is given up: its slot fires at its own (jittered) time when resumed
        assert paused.due_at == jittered_due(
            timer.rule, timer.id, Slot(timer.slot, timer.slot_due_at)
        )
    else:
        assert paused.due_at == timer.due_at
    assert pause_row(paused, version + 1) is None, "a paused timer pauses no further"
    assert pause_row(timer, timer.version - 1) is None, "an older pause does nothing"


@given(running(), st.integers(0, 3 * DAY_MS))
def test_a_resume_catches_up_by_the_rules_policy(timer: Timer, paused_for: int) -> None:
    paused = pause_row(timer, 4)
    assert paused is not None
    now = max(paused.due_at, T0) + paused_for
    assert resume_row(paused, 3, now) is None, "an older resume does nothing"
    resumed = resume_row(paused, 5, now)
    assert resumed is not None
    assert resumed.status is TimerStatus.PENDING and resumed.version == 5
    assert resume_row(resumed, 6, now) is None, "a running timer's resume does nothing"
    assert (resumed.id, resumed.rule, resumed.key) == (paused.id, paused.rule, paused.key)
    catch = caught_up(paused.rule, Slot(paused.slot, paused.slot_due_at), now)
    assert resumed.slot == max(paused.slot, catch.slot.index)
    assert resumed.slot >= paused.slot
    if resumed.slot == paused.slot:
        # nothing passed over: the row is the paused one, running again
        assert resumed == paused.model_copy(update={"status": TimerStatus.PENDING, "version": 5})
        return
    # a coalescing rule moved to its latest slot due at `now`, the others skipped
    assert paused.rule.coalesce and not isinstance(paused.rule, OnceRule)
    assert resumed.slot_due_at <= now
    assert resumed.skipped == paused.skipped + resumed.slot - paused.slot
    assert resumed.attempts == 0
    assert resumed.due_at == jittered_due(
        resumed.rule, resumed.id, Slot(resumed.slot, resumed.slot_due_at)
    )
    later = next_slot(resumed.rule, Slot(resumed.slot, resumed.slot_due_at))
    assert later is None or later.due_at > now, "nothing due is left to catch up"


@given(running(), st.integers(0, DAY_MS))
def test_a_rule_that_does_not_coalesce_keeps_its_slot(timer: Timer, paused_for: int) -> None:
    if isinstance(timer.rule, OnceRule):
        rule: Rule = timer.rule
    else:
        rule = timer.rule.model_copy(update={"coalesce": False})
    paused = pause_row(timer.model_copy(update={"rule": rule}), 3)
    assert paused is not None
    resumed = resume_row(paused, 4, paused.due_at + paused_for)
    assert resumed is not None
    # the runner sends each slot it passed over in turn, from this one
    assert (resumed.slot, resumed.slot_due_at, resumed.due_at) == (
        paused.slot,
        paused.slot_due_at,
        paused.due_at,
    )


@st.composite
def parked(draw: st.DrawFn) -> Timer:
    """A PARKED timer at version 3: its attempts spent, its outcome FAILED or BUSY, due at
    its last claim's deadline (as the runner parks it)."""
    timer = draw(running())
    return timer.model_copy(
        update={
            "status": TimerStatus.PARKED,
            "outcome": draw(st.sampled_from([Outcome.FAILED, Outcome.BUSY])),
            "error_code": "ERROR",
        }
    )


@given(parked(), st.integers(3, 9), st.integers(0, 3 * DAY_MS))
def test_a_parked_timer_paused_is_parked_again_by_its_resume(
    timer: Timer, version: int, paused_for: int
) -> None:
    """Before, a pause left a PARKED row as it was: the owner's pause was committed, yet
    an operator's retry fired the timer it held paused."""
    paused = pause_row(timer, version)
    assert paused is not None
    assert (paused.status, paused.version, paused.parked_when_paused) == (
        TimerStatus.PAUSED,
        version,
        True,
    )
    kept = ("id", "rule", "slot", "slot_due_at", "due_at", "attempts", "outcome", "error_code")
    assert all(getattr(paused, f) == getattr(timer, f) for f in kept)
    assert decode_timer(encode_timer(paused)) == paused, "the changelog keeps the mark"
    # An operator's retry or skip acts on PARKED rows: it passes over a paused one.
    retried = retry_parked(paused, paused.due_at + paused_for, TimerOptions(), DAY_MS * 7)
    assert retried == NOTHING
    assert skip_parked(paused) == NOTHING
    assert pause_row(paused, version + 1) is None, "a paused timer pauses no further"
    # Its resume parks it again as it was, whenever it comes: no catch-up, no send; an
    # operator's retry sends it (`retry_parked`), as any parked timer.
    resumed = resume_row(paused, version + 1, max(paused.due_at, T0) + paused_for)
    assert resumed == timer.model_copy(update={"version": version + 1})
    assert not resumed.parked_when_paused
    assert "parked_when_paused" not in encode_timer(resumed).decode()
    # Cancelled while paused: CANCELLED, unmarked (the mark is a PAUSED row's alone).
    cancelled = cancel_row(paused, version + 1)
    assert cancelled is not None and cancelled.status is TimerStatus.CANCELLED
    assert not cancelled.parked_when_paused


@given(running(), st.integers(3, 9))
def test_a_running_timer_paused_is_not_marked_parked(timer: Timer, version: int) -> None:
    paused = pause_row(timer, version)
    assert paused is not None and not paused.parked_when_paused
    assert "parked_when_paused" not in encode_timer(paused).decode(), "rows as before"


@given(st.sampled_from([TimerStatus.FIRED, TimerStatus.CANCELLED]))
def test_only_an_active_timer_pauses(status: TimerStatus) -> None:
    timer = make_timer(status=status)
    assert pause_row(timer, 5) is None
    assert pause_row(None, 5) is None


@given(
    st.sampled_from(
        [
            TimerStatus.PENDING,
            TimerStatus.FIRING,
            TimerStatus.PARKED,
            TimerStatus.FIRED,
            TimerStatus.CANCELLED,
        ]
    )
)
def test_only_a_paused_timer_resumes(status: TimerStatus) -> None:
    timer = make_timer(status=status)
    assert resume_row(timer, 5, T0) is None
    assert resume_row(None, 5, T0) is None
