"""`until` and `count` on interval and cron rules: the slots are the same rule's slots
without them, cut where they say (first_slot, next_slot, nth_slot, latest_due), and so the
runner's decisions fire each slot up to the end, catch up and expire no further, then the
timer is done; a rule without them is read and written exactly as before they existed."""

from __future__ import annotations

import orjson
import pytest
from fakes import OWNER, slot_timer
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from app.protocol.wire import SCHEDULE_SET, EventEnvelope
from app.timers.runner.decision_types import Action
from app.timers.runner.decisions import SendResult, expire_or_claim, on_outcome
from app.timers.runner.options import DAY_MS, TimerOptions
from app.timers.subscription import CancelTimer, PutTimer, apply, timer_op
from tables.exceptions import InvalidRule
from tables.memory_store import MemoryTimerStore
from tables.rules import CronRule, IntervalRule, OnceRule, parse_rule
from tables.slots import (
    MAX_CRON_STEPS,
    Slot,
    caught_up,
    first_slot,
    latest_due,
    next_slot,
    nth_slot,
)
from tables.timer import Outcome, Timer, TimerStatus
from tables.tombstones import CancelMark

Y2026 = 1_767_225_600_000
MINUTE = 60_000
EXPRESSIONS = ["* * * * *", "*/7 * * * *", "30 2 * * *", "15 * * * *", "0 30 2 * * *"]
ZONES = ["UTC", "Europe/Berlin", "America/New_York"]


def chain(rule: IntervalRule | CronRule, not_before: int, n: int) -> list[Slot]:
    out: list[Slot] = []
    slot = first_slot(rule, not_before)
    while slot is not None and len(out) < n:
        out.append(slot)
        slot = next_slot(rule, slot)
    return out


def unbounded(rule: IntervalRule | CronRule) -> IntervalRule | CronRule:
    return rule.model_copy(update={"until": None, "count": None})


def expected(rule: IntervalRule | CronRule, slots: list[Slot]) -> list[Slot]:
    """The unbounded slots up to the first past the rule's end."""
    kept = []
    for s in slots:
        if (rule.count is not None and s.index >= rule.count) or (
            rule.until is not None and s.due_at > rule.until
        ):
            break
        kept.append(s)
    return kept


intervals = st.builds(
    IntervalRule,
    start=st.integers(Y2026, Y2026 + 10 * MINUTE),
    every=st.integers(1, 5 * MINUTE),
    until=st.none() | st.integers(Y2026 + 10 * MINUTE, Y2026 + 60 * MINUTE),
    count=st.none() | st.integers(1, 40),
)
crons = st.builds(
    CronRule,
    expr=st.sampled_from(EXPRESSIONS),
    zone=st.sampled_from(ZONES),
    start=st.integers(Y2026, Y2026 + 10 * MINUTE),
    until=st.none() | st.integers(Y2026 + 10 * MINUTE, Y2026 + 3 * 86_400_000),
    count=st.none() | st.integers(1, 40),
)


@settings(max_examples=120, deadline=None)
@given(rule=intervals | crons, after=st.integers(0, 30 * MINUTE))
def test_the_slots_are_the_unbounded_ones_cut_at_the_end(
    rule: IntervalRule | CronRule, after: int
) -> None:
    at = rule.start + after
    free = chain(unbounded(rule), at, 50)
    got = chain(rule, at, 50)
    assert got == expected(rule, free)
    if got and len(got) < len(free):
        assert next_slot(rule, got[-1]) is None  # ended: the runner's timer is done
    if isinstance(rule, IntervalRule) or after == 0:
        # indexes count from the rule's start (a cron rule's: from its first slot then)
        for s in got:
            assert nth_slot(rule, s.index) == s
    if rule.count is not None:
        assert nth_slot(rule, rule.count) is None


@settings(max_examples=80, deadline=None)
@given(
    rule=intervals | crons,
    behind=st.integers(0, 4 * 86_400_000),
)
def test_a_catch_up_stops_at_the_last_slot(rule: IntervalRule | CronRule, behind: int) -> None:
    first = first_slot(rule, rule.start)
    assume(first is not None)  # a rule ended before its first match has no slot at all
    assert first is not None
    now = first.due_at + behind
    got = latest_due(rule, first, now)
    every = expected(rule, chain(unbounded(rule), rule.start, 400))
    due = [s for s in every if s.due_at <= now]
    if len(every) < 400 or due[-1] != every[-1]:  # the slots listed reach past `now`
        assert got == (due[-1] if due else first)
    assert (rule.count is None or got.index < rule.count) and (
        rule.until is None or got.due_at <= rule.until
    )
    catch = caught_up(rule, first, now)
    assert catch.slot == (got if rule.coalesce else first)


def test_a_count_is_exact_however_far_a_cron_rule_is_behind() -> None:
    """Indexes are never estimated under a count: far behind, one catch-up counts the slots
    in between (tables.cron_matches) and stops at the last one."""
    rule = CronRule(expr="* * * * * *", start=Y2026, count=MAX_CRON_STEPS + 500)
    first = first_slot(rule, Y2026)
    assert first == Slot(0, Y2026)
    far = Y2026 + 10 * 86_400_000
    last = latest_due(rule, first, far)
    assert last == Slot(MAX_CRON_STEPS + 499, Y2026 + (MAX_CRON_STEPS + 499) * 1000)
    assert next_slot(rule, last) is None
    assert latest_due(rule, first, Y2026 + 5_000_000) == Slot(5_000, Y2026 + 5_000_000)


@pytest.mark.parametrize(
    "data",
    [
        {"kind": "interval", "start": 5, "every": 10},
        {"kind": "interval", "start": 5, "every": 10, "coalesce": False},
        {"kind": "cron", "expr": "0 9 * * MON-FRI", "zone": "Europe/Berlin", "start": 0},
        {"kind": "once", "at": 7},
    ],
)
def test_a_rule_without_an_end_reads_and_writes_as_before(data: dict[str, object]) -> None:
    rule = parse_rule(data)
    written = orjson.loads(rule.model_dump_json())
    assert "until" not in written and "count" not in written
    assert parse_rule(written) == rule
    assert {k: written[k] for k in data} == data


def test_a_rule_with_an_end_round_trips() -> None:
    rule = parse_rule({"kind": "interval", "start": 5, "every": 10, "until": 95, "count": 3})
    assert isinstance(rule, IntervalRule) and (rule.until, rule.count) == (95, 3)
    assert parse_rule(orjson.loads(rule.model_dump_json())) == rule
    assert chain(rule, 0, 10) == [Slot(0, 5), Slot(1, 15), Slot(2, 25)]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"kind": "interval", "start": 100, "every": 5, "until": 99}, "until 99 is before"),
        ({"kind": "cron", "expr": "* * * * *", "start": 100, "until": 1}, "until 1 is before"),
        ({"kind": "interval", "start": 0, "every": 5, "count": 0}, "interval.count"),
        ({"kind": "cron", "expr": "* * * * *", "count": -1}, "cron.count"),
        ({"kind": "once", "at": 0, "count": 1}, "once.count: Extra inputs are not permitted"),
        ({"kind": "once", "at": 0, "until": 1}, "once.until: Extra inputs are not permitted"),
        ({"kind": "interval", "start": 0, "every": 5, "until": 2**64}, "interval.until"),
    ],
)
def test_a_bad_end_is_refused_naming_it(data: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidRule, match=message):
        parse_rule(data)


def test_a_once_rule_is_untouched() -> None:
    rule = OnceRule(at=5)
    assert first_slot(rule, 0) == Slot(0, 5) and next_slot(rule, Slot(0, 5)) is None


# --- what the runner's decisions make of them (app.timers.runner.decisions) ----------------

OPTIONS = TimerOptions()


def sent(timer: Timer, now: int) -> tuple[Timer, str]:
    """One round at `now` and the send committed: the row after, and the request id sent."""
    claim = expire_or_claim(timer, now, OPTIONS)
    assert claim.action is Action.CLAIM and claim.change is not None
    firing = claim.change.next
    after = on_outcome(firing, SendResult("COMMITTED"), now + 1, OPTIONS)
    assert after.change is not None
    return after.change.next, firing.request_id


@settings(max_examples=60, deadline=None)
@given(rule=intervals | crons, lag=st.integers(0, 5 * MINUTE))
def test_a_timer_fires_each_slot_up_to_its_end_then_is_done(
    rule: IntervalRule | CronRule, lag: int
) -> None:
    """Each round on time (`lag` after its slot): the request ids are the bounded slots'."""
    rule = rule.model_copy(update={"coalesce": False})
    first = first_slot(rule, rule.start)
    assume(first is not None)
    assert first is not None
    timer = slot_timer(rule, first)
    ids: list[str] = []
    while timer.status is TimerStatus.PENDING and len(ids) < 60:
        timer, request_id = sent(timer, timer.due_at + lag)
        ids.append(request_id)
    bounded = chain(rule, rule.start, 60)
    assert ids == [f"t-1#{s.index}" for s in bounded]
    if len(bounded) < 60:
        assert timer.status is TimerStatus.FIRED and timer.slot == bounded[-1].index


def test_a_coalescing_catch_up_sends_the_last_slot_then_the_timer_is_done() -> None:
    rule = IntervalRule(start=Y2026, every=MINUTE, count=5)
    timer = slot_timer(rule, Slot(0, Y2026))
    done, request_id = sent(timer, Y2026 + 60 * MINUTE)  # 60 slots behind, 5 in all
    assert request_id == "t-1#4"
    assert (done.status, done.slot, done.skipped) == (TimerStatus.FIRED, 4, 4)


def test_an_expired_last_slot_cancels_the_timer_as_expired() -> None:
    rule = IntervalRule(start=Y2026, every=MINUTE, until=Y2026 + 2 * MINUTE)
    timer = slot_timer(rule, Slot(0, Y2026))
    decision = expire_or_claim(timer, Y2026 + DAY_MS + 3 * MINUTE, OPTIONS)
    assert decision.action is Action.EXPIRE and decision.change is not None
    assert (decision.change.next.status, decision.change.next.outcome) == (
        TimerStatus.CANCELLED,
        Outcome.EXPIRED,
    )


def _set(rule: IntervalRule | CronRule, version: int, at: int) -> EventEnvelope:
    return EventEnvelope(
        id=f"e-{version}",
        type=SCHEDULE_SET,
        aggregate=OWNER,
        version=version,
        created_at=at,
        body={
            "key": "remind",
            "rule": rule.model_dump(mode="json"),
            "command": {"type": "Remind"},
        },
    )


async def test_a_timer_set_again_to_a_rule_that_has_ended_is_done() -> None:
    """A reschedule to a rule whose `until` or `count` has passed (`jobs reschedule`, an
    aggregate's `d.schedule`) ends the timer under its key; it was dead-lettered, and the
    timer it was to replace went on firing by its old rule."""
    start = 1_767_225_600_000
    rule = IntervalRule(start=start, every=60_000)
    now = start + 10 * 60_000
    for ended in (
        IntervalRule(start=start, every=60_000, count=3),
        IntervalRule(start=start, every=60_000, until=start + 60_000),
        CronRule(expr="* * * * *", start=start, until=start + 120_000),
    ):
        store = MemoryTimerStore(partitions=1)
        await store.assign({0})
        op = timer_op(_set(rule, 1, now), 0)
        assert isinstance(op, PutTimer) and await apply(store, op)
        again = timer_op(_set(ended, 2, now), 0)
        assert again == CancelTimer(OWNER, "remind", 2, CancelMark(0, "e-2", now))
        assert await apply(store, again)
        row = await store.find(OWNER, "remind")
        assert row is not None and (row.status, row.version) == (TimerStatus.CANCELLED, 2)
        await store.close()


def test_a_cron_timer_west_of_utc_is_done_after_its_last_slot_a_row_holds() -> None:
    """Its next match, 16:00 in Los Angeles on 9999-12-31, is past `MAX_INSTANT`: the
    timer is done after 15:00, as after a rule's last slot, not stored at a slot no row
    holds."""
    rule = CronRule(expr="0 * * * *", zone="America/Los_Angeles")
    last = Slot(7, 253_402_297_200_000)  # 9999-12-31T23:00Z
    done, request_id = sent(slot_timer(rule, last), last.due_at)
    assert request_id == "t-1#7"
    assert (done.status, done.slot) == (TimerStatus.FIRED, 7)
