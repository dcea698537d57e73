"""Slot arithmetic: properties of every rule kind, cron against cronsim, and DST by example."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import islice, pairwise
from unittest.mock import patch

import pytest
from cronsim import CronSim
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tables import slots
from tables.bounds import MAX_INSTANT, MAX_INT64
from tables.exceptions import InvalidRule
from tables.rules import CronRule, IntervalRule, OnceRule, ScheduleRule, parse_rule
from tables.slots import (
    MAX_CRON_STEPS,
    CatchUp,
    Slot,
    caught_up,
    first_slot,
    latest_due,
    next_slot,
    nth_slot,
    sent_slot,
    slots_between,
)
from tables.zones import zone as ZoneInfo  # the package's zones, as rules step in

MINUTE = 60_000
HOUR = 60 * MINUTE
DAY = 24 * HOUR
Y2026 = 1_767_225_600_000  # 2026-01-01T00:00Z

EXPRESSIONS = [
    "* * * * *",
    "*/7 * * * *",
    "*/30 * * * *",
    "15 * * * *",
    "30 2 * * *",
    "0,30 2 * * *",
    "0 1-3 * * *",
    "30 1 * * *",
    "0 */2 * * *",
    "0 9 * * MON-FRI",
    "0 0 1 * *",
    "0 3 L * *",
    "0 30 2 * * *",
    "*/20 * * * * *",
]
ZONES = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",  # DST shifts by 30 minutes
    "Asia/Kolkata",
    "Pacific/Chatham",  # +12:45 / +13:45
]


def at(zone: str, year: int, month: int, day: int, hour: int, minute: int, fold: int = 0) -> int:
    """Epoch ms of a local wall-clock time in `zone` (`fold=1`: the second pass)."""
    local = datetime(year, month, day, hour, minute, tzinfo=ZoneInfo(zone), fold=fold)
    return (local - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


def local(zone: str, due_at: int) -> str:
    """A due time as local wall-clock time with its UTC offset, as a person reads it."""
    return datetime.fromtimestamp(due_at / 1000, ZoneInfo(zone)).isoformat(timespec="minutes")


def chain(rule: ScheduleRule, first: Slot | None, count: int) -> list[Slot]:
    out: list[Slot] = []
    slot = first
    while slot is not None and len(out) < count:
        out.append(slot)
        slot = next_slot(rule, slot)
    return out


def cronsim_dues(rule: CronRule, not_before: int, count: int) -> list[int]:
    """The brute force: one cronsim iterator started 6 h early, matches kept from `not_before`."""
    from_ = max(rule.start, not_before)
    begin = datetime.fromtimestamp((from_ - 6 * HOUR) // 1000, ZoneInfo(rule.zone))
    dues: list[int] = []
    for match in islice(CronSim(rule.expr, begin), 100_000):  # bounded: cronsim can cycle
        due = int(match.timestamp()) * 1000
        if due >= from_:
            dues.append(due)
        if len(dues) == count:
            break
    return dues


def brute_latest(rule: ScheduleRule, slot: Slot, now: int) -> Slot:
    """The latest slot due by `now`, by stepping `next_slot` one at a time."""
    latest = slot
    while (after := next_slot(rule, latest)) is not None and after.due_at <= now:
        latest = after
    return latest


interval_rules = st.builds(
    IntervalRule,
    start=st.integers(min_value=0, max_value=2**45),
    every=st.integers(min_value=1, max_value=10 * DAY),
    coalesce=st.booleans(),
)
# 2026's DST changes of ZONES (UTC): Berlin, New York, Lord Howe, Chatham; starts within two
# days of one make hypothesis try the transitions far more often than a year's spread would.
DST_CHANGES = [
    at("UTC", 2026, 3, 29, 1, 0),
    at("UTC", 2026, 10, 25, 1, 0),
    at("UTC", 2026, 3, 8, 7, 0),
    at("UTC", 2026, 11, 1, 6, 0),
    at("UTC", 2026, 4, 4, 15, 0),
    at("UTC", 2026, 10, 3, 15, 30),
    at("UTC", 2026, 4, 4, 14, 0),
    at("UTC", 2026, 9, 26, 14, 0),
]
cron_starts = st.one_of(
    st.integers(min_value=Y2026, max_value=Y2026 + 366 * DAY),
    st.builds(
        int.__add__, st.sampled_from(DST_CHANGES), st.integers(min_value=-2 * DAY, max_value=DAY)
    ),
)
cron_rules = st.builds(
    CronRule,
    expr=st.sampled_from(EXPRESSIONS),
    zone=st.sampled_from(ZONES),
    start=cron_starts,
    coalesce=st.booleans(),
)
once_rules = st.builds(
    OnceRule, at=st.integers(min_value=0, max_value=2**45), coalesce=st.booleans()
)
recurring_rules = st.one_of(interval_rules, cron_rules)
any_rules = st.one_of(once_rules, interval_rules, cron_rules)
offsets = st.integers(min_value=-3 * DAY, max_value=3 * DAY)
CRON = settings(max_examples=60, deadline=None)


# ---- every rule kind


@CRON
@given(recurring_rules, offsets)
def test_slots_strictly_increase_and_never_precede_start_or_not_before(
    rule: IntervalRule | CronRule, offset: int
) -> None:
    not_before = rule.start + offset
    slots_ = chain(rule, first_slot(rule, not_before), 12)
    assert len(slots_) == 12
    assert slots_[0].due_at >= max(rule.start, not_before)
    for before, after in pairwise(slots_):
        assert after.index == before.index + 1
        assert after.due_at > before.due_at


@CRON
@given(recurring_rules, st.integers(min_value=0, max_value=40))
def test_nth_slot_is_n_steps_from_the_first_slot_at_start(
    rule: IntervalRule | CronRule, n: int
) -> None:
    steps = chain(rule, first_slot(rule, rule.start), n + 1)
    assert nth_slot(rule, n) == Slot(n, steps[n].due_at)
    assert steps[0].index == 0


@given(once_rules, st.integers(min_value=0, max_value=2**45))
def test_once_rule_has_one_slot_even_in_the_past(rule: OnceRule, now: int) -> None:
    only = Slot(0, rule.at)
    assert first_slot(rule, now) == only
    assert next_slot(rule, only) is None
    assert nth_slot(rule, 0) == only
    assert nth_slot(rule, 1) is None
    assert latest_due(rule, only, now) == only
    assert slots_between(rule, only, now) == 0
    assert caught_up(rule, only, now) == CatchUp(only, 0)


@pytest.mark.parametrize(
    "rule",
    [OnceRule(at=5), IntervalRule(start=5, every=3), CronRule(expr="* * * * *")],
    ids=["once", "interval", "cron"],
)
def test_nth_slot_refuses_a_negative_index(rule: ScheduleRule) -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        nth_slot(rule, -1)


@CRON
@given(any_rules, offsets, st.integers(min_value=0, max_value=3 * DAY))
def test_catch_up_never_moves_back_and_leaves_at_most_one_slot_to_send(
    rule: ScheduleRule, offset: int, behind: int
) -> None:
    slot = first_slot(rule, rule.at if isinstance(rule, OnceRule) else rule.start + offset)
    assert slot is not None
    now = slot.due_at + behind
    result = caught_up(rule, slot, now)
    following = next_slot(rule, slot)
    assert result.slot.index >= slot.index
    assert result.slot.due_at >= slot.due_at
    assert result.skipped == result.slot.index - slot.index
    if isinstance(rule, OnceRule) or not rule.coalesce:
        assert result == CatchUp(slot, 0)  # each slot is sent in turn
    elif following is None or following.due_at > now:
        assert result == CatchUp(slot, 0)  # only one slot due: nothing to catch up
    else:
        assert result.slot.due_at <= now
        assert result.skipped >= 1
        after = next_slot(rule, result.slot)
        assert after is None or after.due_at > now


# ---- interval: integer arithmetic


@given(
    st.integers(min_value=0, max_value=MAX_INSTANT),
    st.integers(min_value=1, max_value=2**40),
    st.integers(min_value=0, max_value=MAX_INSTANT),
)
def test_interval_arithmetic_is_exact_for_any_magnitude(start: int, every: int, now: int) -> None:
    rule = IntervalRule(start=start, every=every)
    first = first_slot(rule, now)
    if first is None:
        # The rule ends at the last instant a datetime holds: no slot is due after it.
        behind = max(now - start, 0)
        assert start + -(-behind // every) * every > MAX_INSTANT
        return
    assert first.due_at == start + first.index * every <= MAX_INSTANT
    assert first.due_at >= now and (first.index == 0 or first.due_at - every < now)
    origin = Slot(0, start)
    latest = latest_due(rule, origin, now)
    if now < start + every:
        assert latest == origin
    else:
        assert latest.due_at <= now < latest.due_at + every
        assert latest == nth_slot(rule, latest.index)
        assert caught_up(rule, origin, now) == CatchUp(latest, latest.index)
    assert slots_between(rule, origin, now) == latest.index


@given(
    interval_rules, st.integers(min_value=0, max_value=50), st.integers(min_value=0, max_value=200)
)
def test_interval_catch_up_equals_stepping_one_slot_at_a_time(
    rule: IntervalRule, n: int, steps_behind: int
) -> None:
    slot = Slot(n, rule.start + n * rule.every)
    now = slot.due_at + steps_behind * rule.every // 2
    brute = brute_latest(rule, slot, now)
    assert latest_due(rule, slot, now) == brute
    assert slots_between(rule, slot, now) == brute.index - slot.index
    expected = CatchUp(brute, brute.index - slot.index) if rule.coalesce else CatchUp(slot, 0)
    assert caught_up(rule, slot, now) == expected


def test_interval_first_slot_rounds_up_to_the_grid() -> None:
    rule = IntervalRule(start=1_000, every=300)
    assert first_slot(rule, 0) == Slot(0, 1_000)
    assert first_slot(rule, 1_000) == Slot(0, 1_000)
    assert first_slot(rule, 1_001) == Slot(1, 1_300)
    assert first_slot(rule, 1_300) == Slot(1, 1_300)
    assert next_slot(rule, Slot(1, 1_300)) == Slot(2, 1_600)
    assert slots_between(rule, Slot(0, 1_000), 999) == 0
    assert slots_between(rule, Slot(0, 1_000), 1_899) == 2


# ---- cron: cronsim is the reference


# Every minute from 3 days before Lord Howe's fall-back (2026-04-05 02:00 +11:00): the
# half hour cronsim passes over holds 30 of the slots compared, so 8 were too few.
_LORD_HOWE_FALL_BACK = int(datetime(2026, 4, 4, 15, 0, tzinfo=UTC).timestamp()) * 1000


@CRON
@given(cron_rules, offsets)
@example(
    CronRule(expr="* * * * *", zone="Australia/Lord_Howe", start=_LORD_HOWE_FALL_BACK - 3 * DAY),
    3 * DAY - 2 * 60_000,
)
@example(  # a cron of seconds whose slots fall in the half hour cronsim passes over
    CronRule(expr="*/20 * * * * *", zone="Australia/Lord_Howe", start=1_775_055_480_001),
    259_200_000,
)
def test_cron_slots_are_cronsims_matches(rule: CronRule, offset: int) -> None:
    not_before = rule.start + offset
    # 8 compared, beyond the 30 minute slots cronsim may pass over (below).
    dues = [slot.due_at for slot in chain(rule, first_slot(rule, not_before), 38)]
    reference = cronsim_dues(rule, not_before, 38)
    # Where cronsim passes a wall time over (below), the rest is compared.
    ours = [d for d in dues if not cronsim_passes_over(rule, d)]
    theirs = [d for d in reference if not cronsim_passes_over(rule, d)]
    n = min(len(ours), len(theirs))
    # Fewer than 6 compared only when the pass-over took nearly all of ours (a cron of
    # seconds: its 38 slots may all fall in the half hour).
    assert n >= 6 or len(dues) - len(ours) > len(dues) - 6
    assert ours[:n] == theirs[:n]


def cronsim_passes_over(rule: CronRule, due: int) -> bool:
    """Whether `due` is in the half hour after a 30-minute fall-back (Lord Howe's April
    change, 02:00 +11:00 -> 01:30 +10:30), where cronsim (4.x) finds no slot: 02:00 +10:30
    comes once, after the repeated half hour, and is a slot (`test_a_fall_back_...`)."""
    zone = ZoneInfo(rule.zone)
    at = datetime.fromtimestamp(due / 1000, zone)
    before = datetime.fromtimestamp((due - 30 * 60_000 - 1) / 1000, zone)
    offsets = before.utcoffset(), at.utcoffset()
    return None not in offsets and offsets[0] - offsets[1] == timedelta(minutes=30)  # type: ignore[operator]


def test_a_fall_back_of_half_an_hour_keeps_the_wall_time_after_it() -> None:
    # 2026-04-05 in Lord Howe: 02:00 +11:00 is 01:30 +10:30; 01:30-02:00 comes twice, and
    # 02:00 +10:30 once after it. cronsim skips it to 04:00; a cron daemon runs it.
    start = int(datetime(2026, 4, 4, 23, 0, tzinfo=ZoneInfo("Australia/Lord_Howe")).timestamp())
    rule = CronRule(expr="0 */2 * * *", zone="Australia/Lord_Howe", start=start * 1000)
    local = [
        datetime.fromtimestamp(s.due_at / 1000, ZoneInfo(rule.zone)).isoformat()
        for s in chain(rule, first_slot(rule, rule.start), 3)
    ]
    assert local == [
        "2026-04-05T00:00:00+11:00",
        "2026-04-05T02:00:00+10:30",
        "2026-04-05T04:00:00+10:30",
    ]


@CRON
@given(cron_rules, st.integers(min_value=1, max_value=8))
def test_a_timers_own_slots_are_sent_and_one_off_by_a_slot_or_a_second_is_not(
    rule: CronRule, n: int
) -> None:
    slots_ = chain(rule, first_slot(rule, rule.start), n + 1)
    for before, slot in zip([None, *slots_], slots_, strict=False):
        assert sent_slot(rule, slot, rule.start, before)
        assert sent_slot(rule, slot, rule.start)
        assert not sent_slot(rule, Slot(slot.index + 1, slot.due_at), rule.start, before)
        assert not sent_slot(rule, Slot(slot.index, slot.due_at + 1_000), rule.start, before)


def mean_gap(rule: CronRule, slot: Slot) -> int:
    """The mean time between the next few slots: catch-ups a few dozen of these behind are
    long enough to matter and short enough to step through one slot at a time."""
    fourth = chain(rule, slot, 4)[-1]
    return (fourth.due_at - slot.due_at) // 3


gaps = st.integers(min_value=0, max_value=60_000)  # thousandths of a mean gap: up to 60


@CRON
@given(cron_rules, st.integers(min_value=0, max_value=40), gaps)
def test_cron_catch_up_equals_stepping_one_slot_at_a_time(
    rule: CronRule, n: int, behind: int
) -> None:
    slot = nth_slot(rule, n)
    assert slot is not None
    now = slot.due_at + behind * mean_gap(rule, slot) // 1000
    brute = brute_latest(rule, slot, now)
    assert latest_due(rule, slot, now) == brute
    assert slots_between(rule, slot, now) == brute.index - slot.index
    expected = CatchUp(brute, brute.index - slot.index) if rule.coalesce else CatchUp(slot, 0)
    assert caught_up(rule, slot, now) == expected


@settings(max_examples=40, deadline=None)
@given(cron_rules, gaps, gaps)
def test_cron_catch_up_past_the_step_limit_finds_the_latest_due_and_keeps_indices_unique(
    rule: CronRule, behind: int, further: int
) -> None:
    slot = first_slot(rule, rule.start)
    assert slot is not None
    gap = mean_gap(rule, slot)
    early_now = slot.due_at + behind * gap // 1000
    late_now = early_now + further * gap // 1000
    with patch.object(slots, "MAX_CRON_STEPS", 25):
        early = latest_due(rule, slot, early_now)
        late = latest_due(rule, slot, late_now)
    for now, latest in ((early_now, early), (late_now, late)):
        exact = brute_latest(rule, slot, now)
        assert latest.due_at == exact.due_at  # the due time is never estimated
        assert latest.index >= exact.index  # the index may be, only upwards
        if exact.index - slot.index < 25:
            assert latest == exact
    # the same due time always gets the same index, a later one a greater index
    assert (early.due_at < late.due_at and early.index < late.index) or early == late


def test_cron_catch_up_of_a_day_of_minutes_counts_each_minute() -> None:
    rule = CronRule(expr="* * * * *", zone="Europe/Berlin")
    slot = Slot(7, at("Europe/Berlin", 2026, 5, 4, 0, 0))
    result = caught_up(rule, slot, slot.due_at + DAY + 59_999)
    assert result == CatchUp(Slot(7 + 1440, slot.due_at + DAY), 1440)


def test_cron_catch_up_far_behind_is_bounded_and_exact_for_every_minute() -> None:
    rule = CronRule(expr="* * * * *", zone="Europe/Berlin")
    slot = Slot(0, at("Europe/Berlin", 2026, 1, 1, 0, 0))
    minutes = 10 * MAX_CRON_STEPS
    result = caught_up(rule, slot, slot.due_at + minutes * MINUTE + 30_000)
    # a minute cron has no minute without a match, so the estimate is exact here
    assert result == CatchUp(Slot(minutes, slot.due_at + minutes * MINUTE), minutes)


def test_cron_rule_without_a_slot_in_datetimes_range_has_none() -> None:
    rule = CronRule(expr="0 0 1 1 *", start=at("UTC", 9999, 6, 1, 0, 0))
    assert first_slot(rule, rule.start) is None
    assert nth_slot(rule, 0) is None
    last = Slot(3, at("UTC", 9999, 1, 1, 0, 0))
    assert next_slot(rule, last) is None
    assert latest_due(rule, last, 2**62) == last


def test_cron_nth_slot_refuses_an_index_it_would_have_to_iterate_to_for_long() -> None:
    with pytest.raises(ValueError, match="steps from its start"):
        nth_slot(CronRule(expr="* * * * *"), MAX_CRON_STEPS + 1)


def test_cron_index_counts_from_the_first_slot_at_or_after_not_before() -> None:
    rule = CronRule(expr="0 * * * *", start=at("UTC", 2026, 1, 1, 0, 0))
    assert first_slot(rule, at("UTC", 2026, 1, 1, 5, 0)) == Slot(0, at("UTC", 2026, 1, 1, 5, 0))
    assert first_slot(rule, at("UTC", 2026, 1, 1, 5, 0) + 1) == Slot(0, at("UTC", 2026, 1, 1, 6, 0))
    assert first_slot(rule, 0) == Slot(0, rule.start)
    assert nth_slot(rule, 5) == Slot(5, at("UTC", 2026, 1, 1, 5, 0))


# ---- cron: daylight saving time, by example


def dues_from(expr: str, zone: str, not_before: int, count: int) -> list[str]:
    rule = CronRule(expr=expr, zone=zone)
    return [local(zone, slot.due_at) for slot in chain(rule, first_slot(rule, not_before), count)]


BERLIN = "Europe/Berlin"
NEW_YORK = "America/New_York"


def test_berlin_spring_forward_fixed_time_fires_at_the_first_valid_minute() -> None:
    # 2026-03-29 02:00 CET becomes 03:00 CEST: 02:30 does not exist that day
    assert dues_from("30 2 * * *", BERLIN, at(BERLIN, 2026, 3, 28, 12, 0), 3) == [
        "2026-03-29T03:00+02:00",
        "2026-03-30T02:30+02:00",
        "2026-03-31T02:30+02:00",
    ]


def test_berlin_fall_back_fixed_time_fires_once_on_the_first_pass() -> None:
    # 2026-10-25 03:00 CEST becomes 02:00 CET: 02:30 happens twice
    assert dues_from("30 2 * * *", BERLIN, at(BERLIN, 2026, 10, 24, 12, 0), 3) == [
        "2026-10-25T02:30+02:00",
        "2026-10-26T02:30+01:00",
        "2026-10-27T02:30+01:00",
    ]


def test_berlin_wildcard_hour_skips_the_missing_hour_and_fires_on_both_passes() -> None:
    assert dues_from("*/30 * * * *", BERLIN, at(BERLIN, 2026, 3, 29, 1, 0), 4) == [
        "2026-03-29T01:00+01:00",
        "2026-03-29T01:30+01:00",
        "2026-03-29T03:00+02:00",
        "2026-03-29T03:30+02:00",
    ]
    assert dues_from("*/30 * * * *", BERLIN, at(BERLIN, 2026, 10, 25, 1, 30), 6) == [
        "2026-10-25T01:30+02:00",
        "2026-10-25T02:00+02:00",
        "2026-10-25T02:30+02:00",
        "2026-10-25T02:00+01:00",
        "2026-10-25T02:30+01:00",
        "2026-10-25T03:00+01:00",
    ]


def test_new_york_fixed_times_across_both_transitions() -> None:
    # 2026-03-08 02:00 EST becomes 03:00 EDT; 2026-11-01 02:00 EDT becomes 01:00 EST
    assert dues_from("30 2 * * *", NEW_YORK, at(NEW_YORK, 2026, 3, 7, 12, 0), 2) == [
        "2026-03-08T03:00-04:00",
        "2026-03-09T02:30-04:00",
    ]
    assert dues_from("30 2 * * *", NEW_YORK, at(NEW_YORK, 2026, 10, 31, 12, 0), 2) == [
        "2026-11-01T02:30-05:00",
        "2026-11-02T02:30-05:00",
    ]
    assert dues_from("30 1 * * *", NEW_YORK, at(NEW_YORK, 2026, 10, 31, 12, 0), 2) == [
        "2026-11-01T01:30-04:00",
        "2026-11-02T01:30-05:00",
    ]


def test_new_york_wildcard_hour_fires_on_both_passes() -> None:
    assert dues_from("*/30 * * * *", NEW_YORK, at(NEW_YORK, 2026, 11, 1, 0, 30), 6) == [
        "2026-11-01T00:30-04:00",
        "2026-11-01T01:00-04:00",
        "2026-11-01T01:30-04:00",
        "2026-11-01T01:00-05:00",
        "2026-11-01T01:30-05:00",
        "2026-11-01T02:00-05:00",
    ]
    assert dues_from("*/30 * * * *", NEW_YORK, at(NEW_YORK, 2026, 3, 8, 1, 0), 3) == [
        "2026-03-08T01:00-05:00",
        "2026-03-08T01:30-05:00",
        "2026-03-08T03:00-04:00",
    ]


@pytest.mark.parametrize(
    ("zone", "day", "hours"),
    [
        (BERLIN, (2026, 3, 29), 23),
        (BERLIN, (2026, 10, 25), 25),
        (NEW_YORK, (2026, 3, 8), 23),
        (NEW_YORK, (2026, 11, 1), 25),
    ],
)
def test_wildcard_jobs_match_every_real_half_hour_of_a_dst_day(
    zone: str, day: tuple[int, int, int], hours: int
) -> None:
    # independent of cronsim: every UTC minute of the local day whose local minute is 0 or 30
    begin, end = at(zone, *day, 0, 0), at(zone, *day, 0, 0) + hours * HOUR
    expected = [
        local(zone, due)
        for due in range(begin, end, MINUTE)
        if datetime.fromtimestamp(due / 1000, ZoneInfo(zone)).minute in (0, 30)
    ]
    assert len(expected) == 2 * hours
    assert dues_from("*/30 * * * *", zone, begin, len(expected) + 1)[:-1] == expected


@pytest.mark.parametrize(("day", "minutes"), [((2026, 3, 29), 23 * 60), ((2026, 10, 25), 25 * 60)])
def test_catch_up_over_a_dst_day_counts_its_real_minutes(
    day: tuple[int, int, int], minutes: int
) -> None:
    rule = CronRule(expr="* * * * *", zone=BERLIN)
    midnight = Slot(0, at(BERLIN, *day, 0, 0))
    next_midnight = at(BERLIN, day[0], day[1], day[2] + 1, 0, 0)
    assert caught_up(rule, midnight, next_midnight) == CatchUp(
        Slot(minutes, next_midnight), minutes
    )


def test_fixed_time_started_in_the_second_pass_does_not_go_back_to_the_first() -> None:
    # cronsim steps a fixed-time job on the wall clock, which forgets which pass it is in
    second_pass = at(BERLIN, 2026, 10, 25, 2, 10, fold=1)
    rule = CronRule(expr="30 2 * * *", zone=BERLIN)
    assert dues_from("30 2 * * *", BERLIN, second_pass, 1) == ["2026-10-26T02:30+01:00"]
    assert latest_due(rule, Slot(0, at(BERLIN, 2026, 10, 25, 2, 30)), second_pass + HOUR).index == 0


def test_six_field_expressions_get_no_debian_cron_adjustment() -> None:
    # with a seconds field cronsim follows the clock as it is, even at a fixed time
    assert dues_from("0 30 2 * * *", BERLIN, at(BERLIN, 2026, 3, 28, 12, 0), 2) == [
        "2026-03-30T02:30+02:00",
        "2026-03-31T02:30+02:00",
    ]
    assert dues_from("0 30 2 * * *", BERLIN, at(BERLIN, 2026, 10, 24, 12, 0), 3) == [
        "2026-10-25T02:30+02:00",
        "2026-10-25T02:30+01:00",
        "2026-10-26T02:30+01:00",
    ]


CHATHAM = "Pacific/Chatham"  # clocks change at 02:45 / 03:45 local, not on the hour


def test_a_start_just_before_a_change_off_the_hour_misses_no_slot() -> None:
    # 2026-09-27 02:45 +12:45 becomes 03:45 +13:45; from 02:44:59 cronsim alone skips 04:00
    rule = CronRule(expr="0 */2 * * *", zone=CHATHAM)
    first = first_slot(rule, at(CHATHAM, 2026, 9, 27, 2, 44) + 59_000)
    assert [local(CHATHAM, slot.due_at) for slot in chain(rule, first, 2)] == [
        "2026-09-27T04:00+13:45",
        "2026-09-27T06:00+13:45",
    ]


def test_a_repeated_span_off_the_hour_fires_every_minute_of_both_passes() -> None:
    # 2026-04-05 03:45 +13:45 becomes 02:45 +12:45: cronsim's own iterator repeats 03:00-03:44
    # of the first pass for ever; slots move on to the second pass, all of it, and the next day
    rule = CronRule(expr="* 3 * * *", zone=CHATHAM)
    dues = [
        local(CHATHAM, slot.due_at)
        for slot in chain(rule, first_slot(rule, at(CHATHAM, 2026, 4, 5, 2, 0)), 106)
    ]
    assert dues[:45] == [f"2026-04-05T03:{minute:02}+13:45" for minute in range(45)]
    assert dues[45:105] == [f"2026-04-05T03:{minute:02}+12:45" for minute in range(60)]
    assert dues[105] == "2026-04-06T03:00+12:45"


@pytest.mark.parametrize("zone", ["America", "localtime", "Mars/Olympus", "posixrules", ""])
def test_a_zone_that_is_no_iana_zone_is_an_invalid_rule(zone: str) -> None:
    from tables import InvalidRule, parse_rule

    with pytest.raises(InvalidRule, match="zone"):
        parse_rule({"kind": "cron", "expr": "* * * * *", "zone": zone})


@given(
    st.integers(min_value=0, max_value=MAX_INSTANT),
    st.integers(min_value=1, max_value=MAX_INT64),
    st.integers(min_value=0, max_value=10**6),
)
def test_an_interval_rule_ends_where_instants_end(start: int, every: int, index: int) -> None:
    """No slot of any rule within bounds is past MAX_INSTANT: every slot is a valid row."""
    rule = IntervalRule(start=start, every=every)
    slot = nth_slot(rule, index)
    if slot is not None:
        assert slot.due_at <= MAX_INSTANT
        following = next_slot(rule, slot)
        assert following is None or following.due_at <= MAX_INSTANT
    else:
        assert start + index * every > MAX_INSTANT


@pytest.mark.parametrize(
    "fields",
    [
        {"kind": "once", "at": MAX_INSTANT + 1},
        {"kind": "once", "at": 2**64 + 5},
        {"kind": "once", "at": -1},
        {"kind": "interval", "start": 0, "every": 2**70},
        {"kind": "interval", "start": MAX_INSTANT + 1, "every": 1},
        {"kind": "interval", "start": 0, "every": 0},
        {"kind": "cron", "expr": "* * * * *", "start": 2**63},
    ],
)
def test_a_rule_outside_the_bounds_is_invalid(fields: dict[str, object]) -> None:
    with pytest.raises(InvalidRule):
        parse_rule(fields)


def test_a_cron_rule_west_of_utc_ends_at_the_last_instant_a_timer_holds() -> None:
    """Year 9999 ends later in a zone west of UTC: its last local hours are past
    `MAX_INSTANT`, which no timer row holds (the subscription dead-lettered such a timer
    and the runner could not store its next slot). The rule ends there instead."""
    hourly = CronRule(expr="0 * * * *", zone="America/Los_Angeles")
    last = MAX_INSTANT + 1 - 3_600_000  # 9999-12-31T23:00Z, 15:00 in Los Angeles
    slot = first_slot(hourly, last)
    assert slot == Slot(0, last)
    assert next_slot(hourly, slot) is None
    assert first_slot(hourly, last + 1) is None
    new_year = CronRule(expr="0 23 31 12 *", zone="America/Los_Angeles", start=last - 1)
    assert first_slot(new_year, last - 1) is None
    assert latest_due(hourly, slot, MAX_INSTANT) == slot
