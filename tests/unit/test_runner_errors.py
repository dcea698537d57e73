"""Why a timer did not fire (#22): each attempt's error code and text on the row, as the
runner's pure decisions write them, and how long they stay."""

from __future__ import annotations

from fakes import MIN, T0
from fakes import slot_timer as make_timer
from hypothesis import given, settings
from hypothesis import strategies as st

from app.timers.runner.decision_types import Action, Decision
from app.timers.runner.decisions import (
    RULE_ERROR,
    SENT,
    TIMEOUT,
    SendResult,
    Verdict,
    classify,
    error_of,
    expire_or_claim,
    guarded,
    on_outcome,
    release,
    retry_parked,
    skip_parked,
    unparked,
)
from app.timers.runner.options import DAY_MS, REQUEST_ID_WINDOW_MS, RetryPolicy, TimerOptions
from tables.rules import IntervalRule, OnceRule
from tables.timer import CUT_MARKER, MAX_ERROR_TEXT, Outcome, Timer, TimerStatus, error_text

TAKEN = ["COMMITTED", "DUPLICATE", "UNCHANGED", SENT]
"""Codes of an attempt the target took: they clear the row's error."""
KEPT = ["REJECTED", "BUSY", "ERROR", "SCHEDULE_NOT_DUE", TIMEOUT, "TRANSPORT_ERROR"]
"""Codes an attempt's error is kept with."""

codes = st.sampled_from([*TAKEN, *KEPT])
messages = st.one_of(
    st.just(""),
    st.text(max_size=50),
    st.text(min_size=MAX_ERROR_TEXT - 5, max_size=MAX_ERROR_TEXT + 50),
)
rules = st.sampled_from([OnceRule(at=T0), IntervalRule(start=T0, every=MIN)])
OPTIONS = TimerOptions(retry=RetryPolicy(max_attempts=3), max_busy_retries=2)


def valid(timer: Timer) -> Timer:
    """The row as a store would read it back: `model_copy` does not validate, so this
    proves the decision wrote fields within their bounds."""
    again = Timer.model_validate_json(timer.model_dump_json())
    assert again == timer
    return again


@given(st.text(max_size=MAX_ERROR_TEXT + 100))
def test_an_error_text_is_bounded_and_cut_with_a_marker(message: str) -> None:
    text = error_text(message)
    if not message:
        assert text is None
        return
    assert text is not None and len(text) <= MAX_ERROR_TEXT
    if len(message) <= MAX_ERROR_TEXT:
        assert text == message
    else:
        assert text.endswith(CUT_MARKER)
        assert message.startswith(text.removesuffix(CUT_MARKER))
        assert len(text) == MAX_ERROR_TEXT


@given(codes, messages)
def test_an_attempts_error_is_its_code_and_bounded_message_unless_the_target_took_it(
    code: str, message: str
) -> None:
    error = error_of(SendResult(code, message))
    if code in TAKEN:
        assert error == {"error_code": None, "error_text": None}
    else:
        assert error == {"error_code": code, "error_text": error_text(message)}


@settings(deadline=None)
@given(rules, codes, messages, st.integers(0, 2), st.integers(0, 2), st.sampled_from(KEPT))
def test_every_outcome_writes_the_attempts_error(
    rule: OnceRule | IntervalRule,
    code: str,
    message: str,
    attempts: int,
    busy: int,
    earlier: str,
) -> None:
    """Whatever the row held before (an earlier attempt's error), the outcome of this
    attempt replaces it: its own code and text, or nothing once the target took it."""
    timer = make_timer(rule, attempts=attempts, error_code=earlier, error_text="before")
    claim = expire_or_claim(timer, T0, OPTIONS)
    assert claim.change is not None
    firing = claim.change.next
    # A claim is not an attempt's outcome: the earlier error stays.
    assert (firing.error_code, firing.error_text) == (earlier, "before")
    decision = on_outcome(firing, SendResult(code, message), T0 + 10, OPTIONS, busy)
    assert decision.change is not None
    nxt = valid(decision.change.next)
    if code in TAKEN:
        assert (nxt.error_code, nxt.error_text) == (None, None)
        assert classify(code) is Verdict.FIRED
    else:
        assert (nxt.error_code, nxt.error_text) == (code, error_text(message))
    if decision.park:
        # Parked with its reason; if the ledger refuses the park, the retry keeps it too.
        assert nxt.status is TimerStatus.PARKED and nxt.error_code == code
        back = unparked(decision).change
        assert back is not None and valid(back.next).error_code == code


@settings(deadline=None)
@given(st.sampled_from(KEPT), st.text(max_size=20), st.integers(0, 3 * DAY_MS))
def test_what_no_attempt_decides_keeps_the_last_error(code: str, text: str, later: int) -> None:
    """Expiry, a release, an operator's retry or skip: the last attempt's error stays."""
    kept = {"error_code": code, "error_text": text or None}

    def error(row: Timer) -> dict[str, str | None]:
        return {"error_code": row.error_code, "error_text": row.error_text}

    failed = {**kept, "outcome": Outcome.FAILED}
    recurring = make_timer(IntervalRule(start=T0, every=MIN), None, **failed)
    once = make_timer(OnceRule(at=T0), None, **failed)
    now = T0 + OPTIONS.expires_after + 1 + later
    for timer in (recurring, once):
        expired = expire_or_claim(timer, now, OPTIONS)
        assert expired.action in (Action.EXPIRE, Action.EXPIRE_SLOT)
        assert expired.change is not None
        assert expired.change.next.outcome is Outcome.EXPIRED
        assert error(valid(expired.change.next)) == kept
        firing = timer.model_copy(update={"status": TimerStatus.FIRING, "due_at": T0 + 1000})
        released = release(firing)
        assert released.change is not None
        assert error(released.change.next) == kept
        parked = timer.model_copy(update={"status": TimerStatus.PARKED})
        retried = retry_parked(parked, now, OPTIONS, REQUEST_ID_WINDOW_MS, past_window=True)
        for decision in (retried, skip_parked(parked)):
            assert decision.change is not None
            assert error(decision.change.next) == kept


def test_a_target_answering_error_keeps_its_message_through_retries_and_the_park() -> None:
    timer = make_timer(OnceRule(at=T0))
    now = T0
    for attempt in range(1, OPTIONS.retry.max_attempts + 1):
        claim = expire_or_claim(timer, now, OPTIONS)
        assert claim.change is not None
        result = SendResult("ERROR", f"out of stock ({attempt})")
        decision = on_outcome(claim.change.next, result, now, OPTIONS)
        assert decision.change is not None
        timer = decision.change.next
        assert (timer.error_code, timer.error_text) == ("ERROR", f"out of stock ({attempt})")
        now = max(now, timer.due_at)
    assert timer.status is TimerStatus.PARKED and timer.outcome is Outcome.FAILED
    # Retried by an operator and committed: the error is cleared.
    retried = retry_parked(timer, now, OPTIONS, REQUEST_ID_WINDOW_MS).change
    assert retried is not None
    claim = expire_or_claim(retried.next, now, OPTIONS)
    assert claim.change is not None
    done = on_outcome(claim.change.next, SendResult("COMMITTED"), now, OPTIONS).change
    assert done is not None
    assert done.next.status is TimerStatus.FIRED
    assert (done.next.error_code, done.next.error_text) == (None, None)


def test_a_rejection_fires_the_slot_and_keeps_the_targets_reason() -> None:
    timer = make_timer(IntervalRule(start=T0, every=MIN))
    claim = expire_or_claim(timer, T0, OPTIONS)
    assert claim.change is not None
    result = SendResult("REJECTED", "order already shipped")
    decision = on_outcome(claim.change.next, result, T0, OPTIONS)
    assert decision.action is Action.NEXT_SLOT and decision.change is not None
    nxt = decision.change.next
    assert (nxt.outcome, nxt.slot) == (Outcome.REJECTED, 1)
    assert (nxt.error_code, nxt.error_text) == ("REJECTED", "order already shipped")


def test_a_timer_no_decision_can_be_made_on_is_parked_with_a_rule_error() -> None:
    timer = make_timer(OnceRule(at=T0))

    def broken() -> Decision:
        raise OverflowError("date value out of range " + "x" * 2000)

    decision = guarded(broken, timer, T0)
    assert decision.park and decision.change is not None and decision.fallback is not None
    for row in (decision.change.next, decision.fallback.next):
        assert valid(row).error_code == RULE_ERROR
        assert row.error_text is not None
        assert row.error_text.startswith("OverflowError('date value out of range xxx")
        assert row.error_text.endswith(CUT_MARKER) and len(row.error_text) == MAX_ERROR_TEXT
