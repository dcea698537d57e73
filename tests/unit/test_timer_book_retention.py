"""A timer book forgets the timers whose rule ended more than its retention before an
event (#20): each `BookTimer` records its rule's end (`timer_end`), every applier keeps
only `live_timers` at the event's own time, so a replay folds to the same state; a pause,
resume or trigger of a forgotten key is refused as a never-set one. Pure: `decide` and
`fold` with the clock given as each command's `now`."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.clients.book_state import CRON_END_STEPS, BookState, BookTimer, live_timers, timer_end
from app.clients.timer_book import (
    BOOK_RETENTION,
    PAUSE_TIMER,
    RESUME_TIMER,
    RULE_ENDED,
    SET_TIMER,
    TRIGGER_TIMER,
    ended_refusal,
    timer_book,
)
from app.model.decide import Decided, StoredAggregate, decide, fold
from app.protocol.wire import CommandEnvelope, EventEnvelope, ResultCode
from app.timers.runner.options import TimerOptions
from tables import AggregateRef, CommandSpec, CronRule, IntervalRule, OnceRule
from tables.slots import first_slot, next_slot

CTX = "rem"
NOW = 1_800_000_000_000
DAY = 24 * 60 * 60 * 1000
TARGET = {"context": CTX, "aggregate": "order", "id": "o-1"}
BOOK = timer_book(CTX, "order-timers")


def command(type_: str, body: dict[str, Any], request_id: str) -> CommandEnvelope:
    return CommandEnvelope(
        request_id=request_id,
        type=type_,
        aggregate=AggregateRef(context=CTX, aggregate="order-timers", id="o-1"),
        body=body,
        issued_at=NOW,
    )


def set_body(key: str, rule: dict[str, Any]) -> dict[str, Any]:
    return {
        "key": key,
        "rule": rule,
        "target": TARGET,
        "command": {"type": "reminders.Remind", "body": {"key": key}},
    }


class Book:
    """One book driven by commands at given times, keeping every event it appended."""

    def __init__(self) -> None:
        self.stored: StoredAggregate | None = None
        self.log: list[EventEnvelope] = []
        self.n = 0

    def send(self, type_: str, body: dict[str, Any], now: int) -> Decided:
        self.n += 1
        d = decide(BOOK, self.stored, command(type_, body, f"r{self.n}"), now=now, seen=False)
        if d.code == ResultCode.COMMITTED:
            self.stored = d.stored
            self.log.extend(d.events)
        return d

    @property
    def keys(self) -> set[str]:
        assert self.stored is not None
        return set(BookState.model_validate(self.stored.state).timers)


def test_the_default_retention_is_the_timer_tables_finished_retention() -> None:
    options = TimerOptions()
    assert BOOK_RETENTION == options.finished_retention == 7 * DAY
    assert options.expires_after < BOOK_RETENTION  # past it no slot is sent or retried
    with pytest.raises(ValueError, match="retention must be an integer of ms from 1 to"):
        timer_book(CTX, "x", retention=0)


def test_a_once_timers_key_is_kept_until_its_end_and_retention_then_dropped() -> None:
    book = Book()
    end = NOW + 5000
    book.send(SET_TIMER, set_body("pay", {"kind": "once", "at": end}), NOW)
    book.send(SET_TIMER, set_body("tick", {"kind": "interval", "start": NOW, "every": DAY}), NOW)
    assert BookState.model_validate(book.stored.state if book.stored else {}).timers[
        "pay"
    ].ends == (end)

    # an event exactly a retention after its end keeps it (a trigger of it is refused as
    # ended then: `test_a_trigger_past_the_rules_end_is_refused_and_a_pause_is_not`)
    assert (
        book.send(PAUSE_TIMER, {"key": "tick"}, end + BOOK_RETENTION).code == ResultCode.COMMITTED
    )
    assert book.keys == {"pay", "tick"}
    # the next event past that drops it (whatever the event: here another key's resume)
    assert (
        book.send(RESUME_TIMER, {"key": "tick"}, end + BOOK_RETENTION + 1).code
        == ResultCode.COMMITTED
    )
    assert book.keys == {"tick"}
    assert book.stored is not None and book.stored.version == 4

    for type_ in (PAUSE_TIMER, RESUME_TIMER, TRIGGER_TIMER):
        refused = book.send(type_, {"key": "pay"}, end + BOOK_RETENTION + 2)
        assert refused.code == ResultCode.REJECTED and refused.events == []
        assert "has no timer 'pay' (never set, cancelled, or ended" in refused.message
    never = book.send(TRIGGER_TIMER, {"key": "nothing"}, end + BOOK_RETENTION + 2)
    assert never.code == ResultCode.REJECTED


def test_a_key_past_its_end_and_retention_is_refused_before_any_event_drops_it() -> None:
    book = Book()
    book.send(SET_TIMER, set_body("pay", {"kind": "once", "at": NOW}), NOW)
    ended = book.send(TRIGGER_TIMER, {"key": "pay"}, NOW + BOOK_RETENTION)
    assert (ended.code, ended.refusal) == (ResultCode.REJECTED, RULE_ENDED)  # known: ended
    assert book.send(RESUME_TIMER, {"key": "pay"}, NOW + BOOK_RETENTION).code is (
        ResultCode.UNCHANGED
    )
    assert book.keys == {"pay"}  # no event since has dropped it...
    late = book.send(TRIGGER_TIMER, {"key": "pay"}, NOW + BOOK_RETENTION + 1)
    assert late.code == ResultCode.REJECTED  # ...but a command after its retention is refused
    assert "has no timer 'pay'" in late.message
    assert late.refusal is None


def test_endless_timers_are_kept_and_a_set_again_counts_from_its_new_end() -> None:
    book = Book()
    book.send(SET_TIMER, set_body("tick", {"kind": "interval", "start": NOW, "every": 1000}), NOW)
    many = CRON_END_STEPS + 1
    book.send(
        SET_TIMER, set_body("cron", {"kind": "cron", "expr": "0 9 * * *", "count": many}), NOW
    )
    book.send(SET_TIMER, set_body("pay", {"kind": "once", "at": NOW}), NOW)
    later = NOW + 100 * 365 * DAY
    book.send(SET_TIMER, set_body("pay", {"kind": "once", "at": later}), NOW + BOOK_RETENTION)
    assert book.send(TRIGGER_TIMER, {"key": "tick"}, later).code == ResultCode.COMMITTED
    assert book.keys == {"tick", "cron", "pay"}
    ends = BookState.model_validate(book.stored.state if book.stored else {}).timers
    assert (ends["tick"].ends, ends["cron"].ends, ends["pay"].ends) == (None, None, later)


def test_a_paused_timer_is_kept_past_its_end_until_resumed() -> None:
    book = Book()
    book.send(SET_TIMER, set_body("pay", {"kind": "once", "at": NOW}), NOW)
    book.send(PAUSE_TIMER, {"key": "pay"}, NOW - 1000)
    far = NOW + 10 * BOOK_RETENTION
    book.send(SET_TIMER, set_body("other", {"kind": "once", "at": far}), far)
    assert book.keys == {"pay", "other"}  # its row stays PAUSED in the table: resumable
    assert book.send(RESUME_TIMER, {"key": "pay"}, far).code == ResultCode.COMMITTED
    assert book.keys == {"other"}  # running again, long ended: dropped by its own event


def test_a_replay_of_the_log_folds_to_the_same_state() -> None:
    book = Book()
    t = NOW
    for i in range(30):
        # one-off timers under unique keys, a day apart, and one endless timer
        book.send(SET_TIMER, set_body(f"once-{i}", {"kind": "once", "at": t + 3600_000}), t)
        if i == 0:
            rule = {"kind": "interval", "start": t, "every": 60_000}
            book.send(SET_TIMER, set_body("tick", rule), t)
        t += DAY
    assert book.stored is not None
    days_kept = BOOK_RETENTION // DAY
    assert book.keys == {"tick"} | {f"once-{i}" for i in range(30 - days_kept - 1, 30)}
    assert fold(BOOK, None, book.log) == book.stored
    # and folded in any split, as a restore from a stored state and the log's tail does
    for cut in (1, 7, 20):
        head = fold(BOOK, None, book.log[:cut])
        assert fold(BOOK, head, book.log[cut:]) == book.stored


def test_a_state_stored_before_ends_existed_reads_as_kept_until_cancelled() -> None:
    old = {
        "timers": {
            "pay": {
                "target": AggregateRef.model_validate(TARGET).model_dump(mode="json"),
                "command": {"type": "reminders.Remind", "body": {}},
                "paused": False,
            }
        }
    }
    stored = StoredAggregate(version=1, state=old)
    d = decide(
        BOOK, stored, command(TRIGGER_TIMER, {"key": "pay"}, "r9"), now=NOW + 1000 * DAY, seen=False
    )
    assert d.code == ResultCode.COMMITTED and d.stored is not None
    assert d.stored.state == old  # read, kept, and written back as it was (no "ends")
    assert BookState.model_validate({}).timers == {}
    empty = decide(
        BOOK,
        StoredAggregate(version=1),
        command(PAUSE_TIMER, {"key": "x"}, "r"),
        now=NOW,
        seen=False,
    )
    assert empty.code == ResultCode.REJECTED


def test_timer_end_of_each_kind_of_rule() -> None:
    assert timer_end(OnceRule(at=NOW), 0) == NOW
    assert timer_end(OnceRule(at=NOW, jitter=500), 0) == NOW + 500
    assert timer_end(IntervalRule(start=NOW, every=10), NOW) is None
    assert timer_end(IntervalRule(start=NOW, every=10, until=NOW + 95), NOW) == NOW + 95
    assert timer_end(IntervalRule(start=NOW, every=10, count=3), NOW + 5) == NOW + 20
    assert timer_end(IntervalRule(start=NOW, every=10, count=3, until=NOW + 15), NOW) == NOW + 15
    assert timer_end(IntervalRule(start=0, every=2**40, count=2**40), 0) is None  # past year 9999
    assert timer_end(CronRule(expr="0 9 * * *"), NOW) is None
    assert timer_end(CronRule(expr="0 9 * * *", count=CRON_END_STEPS + 1), NOW) is None
    big = CronRule(expr="0 9 * * *", count=CRON_END_STEPS + 1, until=NOW + DAY)
    assert timer_end(big, NOW) == NOW + DAY
    # a cron rule counts its slots from its first at or after the set
    daily = CronRule(expr="0 9 * * *", count=3)
    first = first_slot(daily, NOW)
    assert first is not None
    assert timer_end(daily, NOW) == first.due_at + 2 * DAY


RULES = st.one_of(
    st.builds(
        IntervalRule,
        start=st.integers(NOW - DAY, NOW + DAY),
        every=st.integers(1000, DAY),
        count=st.integers(1, CRON_END_STEPS),
        until=st.none() | st.integers(NOW + DAY, NOW + 30 * DAY),
        jitter=st.none() | st.integers(1, 1000),
    ),
    st.builds(
        CronRule,
        expr=st.sampled_from(["*/7 * * * *", "0 9 * * 1-5", "30 2 * * *", "15 */3 * * *"]),
        zone=st.sampled_from(["UTC", "Europe/Berlin", "America/New_York"]),
        count=st.integers(1, CRON_END_STEPS),
        until=st.none() | st.integers(NOW + DAY, NOW + 30 * DAY),
    ),
)


@settings(max_examples=60, deadline=None)
@given(rule=RULES, set_at=st.integers(NOW - DAY, NOW + DAY))
def test_no_slot_of_a_counted_rule_is_due_after_its_end(
    rule: IntervalRule | CronRule, set_at: int
) -> None:
    end = timer_end(rule, set_at)
    assert end is not None
    slot, last = first_slot(rule, set_at), None
    while slot is not None:
        last, slot = slot, next_slot(rule, slot)
    if last is not None:  # the end is the last slot (or the until past it), jitter added
        assert last.due_at + (rule.jitter or 0) <= end
        if rule.until is None:
            assert end == last.due_at + (rule.jitter or 0)


TIMERS = st.dictionaries(
    st.text(min_size=1, max_size=5),
    st.builds(
        BookTimer,
        target=st.just(AggregateRef(context=CTX, aggregate="order", id="o-1")),
        command=st.just(CommandSpec(type="reminders.Remind")),
        paused=st.booleans(),
        ends=st.none() | st.integers(0, 10 * DAY),
    ),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(
    timers=TIMERS,
    now=st.integers(0, 20 * DAY),
    later=st.integers(0, 5 * DAY),
    retention=st.integers(1, 8 * DAY),
)
def test_live_timers_keeps_exactly_the_paused_endless_and_recent(
    timers: dict[str, BookTimer], now: int, later: int, retention: int
) -> None:
    kept = live_timers(timers, now, retention)
    assert kept == {
        k: t for k, t in timers.items() if t.paused or t.ends is None or t.ends + retention >= now
    }
    assert live_timers(kept, now, retention) == kept  # idempotent: a replay meets no surprise
    # what is dropped at one time is dropped at every later one
    assert live_timers(timers, now + later, retention).keys() <= kept.keys()
    # a longer retention keeps at least as much
    assert kept.keys() <= live_timers(timers, now, retention + later).keys()


# --- a trigger (refused) or pause (appended) of a timer whose rule ended (#22) -------------


@pytest.mark.parametrize(
    ("action", "paused", "ends", "refused"),
    [
        (TRIGGER_TIMER, False, NOW, True),  # its last slot is due now: sent already, or soon
        (TRIGGER_TIMER, False, NOW - DAY, True),
        (TRIGGER_TIMER, False, NOW + 1, False),
        (TRIGGER_TIMER, False, None, False),  # endless
        (TRIGGER_TIMER, True, NOW - DAY, False),  # paused before its end: its slot never fired
        (TRIGGER_TIMER, "after its end", NOW - DAY, True),  # it may have fired before
        # A PARKED (or FIRING) row is held by the table, a FIRED one left: not the book's
        (PAUSE_TIMER, False, NOW - 1, False),
        (PAUSE_TIMER, False, NOW + 1, False),
        (RESUME_TIMER, False, NOW - 1, False),  # nothing to resume: UNCHANGED, not refused
        (RESUME_TIMER, True, NOW - 1, False),  # its slot is held: resumed, caught up
        (RESUME_TIMER, "after its end", NOW - 1, False),  # a PARKED row parked again
    ],
)
def test_ended_refusal_of_each_action(
    action: str, paused: bool | str, ends: int | None, refused: bool
) -> None:
    timer = BookTimer(
        target=AggregateRef.model_validate(TARGET),
        command=CommandSpec(type="reminders.Remind"),
        paused=bool(paused),
        ended_when_paused=paused == "after its end",
        ends=ends,
    )
    why = ended_refusal(action, timer, NOW)
    assert (why is not None) == refused
    if why is not None:
        assert why.startswith("its rule ended at ") and "nothing to " in why


@settings(max_examples=60, deadline=None)
@given(
    at=st.integers(NOW - DAY, NOW + DAY),
    jitter=st.none() | st.integers(1, 60_000),
    after=st.integers(-2 * DAY, BOOK_RETENTION),
    paused=st.booleans(),
)
def test_a_trigger_past_the_rules_end_is_refused_and_a_pause_is_not(
    at: int, jitter: int | None, after: int, paused: bool
) -> None:
    """Decided by the book alone, so on whichever node it is asked: a once timer's trigger
    is COMMITTED before its `at` (+ jitter) and REJECTED as ended from then on (a trigger
    of a fired once-timer sent its command again), unless it was paused before. Its pause
    is COMMITTED either way (the table holds a PARKED row, leaves a FIRED one), and a
    trigger after that pause is refused as before it."""
    book = Book()
    rule: dict[str, Any] = {"kind": "once", "at": at} | ({"jitter": jitter} if jitter else {})
    assert book.send(SET_TIMER, set_body("pay", rule), NOW - 2 * DAY).code == ResultCode.COMMITTED
    if paused:
        assert book.send(PAUSE_TIMER, {"key": "pay"}, NOW - 2 * DAY).code == ResultCode.COMMITTED
    end = at + (jitter or 0)
    now = end + after
    ended = not paused and now >= end
    for action in (TRIGGER_TIMER, PAUSE_TIMER, TRIGGER_TIMER):
        d = book.send(action, {"key": "pay"}, now)
        if ended and action == TRIGGER_TIMER:
            assert d.code == ResultCode.REJECTED and d.events == [], (action, d)
            assert d.refusal is RULE_ENDED and "'pay'" in d.message
            assert not d.message.startswith("RULE_ENDED")  # the code is typed, not the text's
        else:
            assert d.code in (ResultCode.COMMITTED, ResultCode.UNCHANGED), (action, d)
    resumed = book.send(RESUME_TIMER, {"key": "pay"}, now)
    assert resumed.code == ResultCode.COMMITTED  # paused, before or after its end
    d = book.send(TRIGGER_TIMER, {"key": "pay"}, now)
    assert (d.code == ResultCode.REJECTED) is (now >= end), d


@settings(max_examples=60, deadline=None)
@given(
    key=st.text(min_size=1, max_size=40) | st.sampled_from(["RULE_ENDED: x", "its rule ended at"])
)
def test_no_key_makes_a_refusal_read_as_ended(key: str) -> None:
    """The web edge's 409 is chosen by the typed `refusal`: a key never set, whatever its text
    (one holding the ended refusal's words included), is refused without that code."""
    book = Book()
    for action in (TRIGGER_TIMER, PAUSE_TIMER):
        d = book.send(action, {"key": key}, NOW)
        assert d.code == ResultCode.REJECTED and d.refusal is None, d
