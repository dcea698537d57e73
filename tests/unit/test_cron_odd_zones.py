"""Cron rules in zones whose offsets are not whole hours or whose clocks change by half an
hour: every local time that matches fires once, by the daylight-saving policy of
`tables.slots` (fixed-time jobs as Debian cron, any other job on the wall clock as it is),
checked against a brute force over UTC minutes that does not step cronsim at all."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from cronsim import CronSim
from hypothesis import given, settings
from hypothesis import strategies as st

from tables.rules import CronRule
from tables.slots import Slot, first_slot, latest_due, next_slot
from tables.zones import zone as ZoneInfo

MINUTE = 60
LORD_HOWE = "Australia/Lord_Howe"  # +10:30, and +11:00 from the first Sunday of October
ADELAIDE = "Australia/Adelaide"  # +09:30 / +10:30
KATHMANDU = "Asia/Kathmandu"  # +05:45 since 1986 (+05:30 before: a 15-minute gap)
KOLKATA = "Asia/Kolkata"  # +05:30
CHATHAM = "Pacific/Chatham"  # +12:45 / +13:45, changes at 02:45 / 03:45 local


def at(zone: str, year: int, month: int, day: int, hour: int, minute: int, fold: int = 0) -> int:
    """Epoch seconds of a local wall-clock time in `zone` (`fold=1`: the second pass)."""
    return int(
        datetime(year, month, day, hour, minute, tzinfo=ZoneInfo(zone), fold=fold).timestamp()
    )


def local(zone: str, second: int) -> str:
    return datetime.fromtimestamp(second, ZoneInfo(zone)).isoformat(timespec="minutes")


def slot_dues(rule: CronRule, low: int, end: int) -> list[int]:
    """The rule's slots due in [low, end) seconds, each from the one before (`next_slot`)."""
    out, slot = [], first_slot(rule, low * 1000)
    while slot is not None and slot.due_at < end * 1000:
        out.append(slot.due_at // 1000)
        slot = next_slot(rule, slot)
    return out


def _matches(fields: CronSim, wall: datetime) -> bool:
    return (
        wall.month in fields.months
        and fields.match_day(wall.date())
        and wall.hour in fields.hours
        and wall.minute in fields.minutes
        and wall.second in fields.seconds
    )


def policy_dues(rule: CronRule, low: int, end: int) -> list[int]:
    """The brute force: each UTC second in [low, end) whose local time matches; for a
    fixed-time job (five fields, minute and hour not `*...`) only the first pass of a
    repeated local time, and a skipped span's matches once, at the first minute after it."""
    zone, fields = rule.tz, CronSim(rule.expr, datetime(2000, 1, 1, tzinfo=UTC))
    parts = rule.expr.split()
    fixed = len(parts) == 5 and not parts[0].startswith("*") and not parts[1].startswith("*")
    out = []
    for minute in range(low - low % MINUTE, end, MINUTE):
        now = datetime.fromtimestamp(minute, zone)
        wall = now.replace(tzinfo=None, fold=0)
        if fixed:
            jump = now.utcoffset() - datetime.fromtimestamp(minute - MINUTE, zone).utcoffset()  # type: ignore[operator]
            skipped = (
                wall - jump + timedelta(minutes=k) for k in range(jump // timedelta(minutes=1))
            )
            if any(_matches(fields, w) for w in skipped) or (
                now.fold == 0 and _matches(fields, wall)
            ):
                out.append(minute)
            continue
        for second in sorted(fields.seconds):
            when = datetime.fromtimestamp(minute + second, zone).replace(tzinfo=None, fold=0)
            if _matches(fields, when):
                out.append(minute + second)
    return [due for due in out if low <= due < end]


# 2026's changes (UTC): Lord Howe's and Adelaide's in April and October, Chatham's; and
# Kathmandu's move to +05:45 (1986-01-01 00:00 local became 00:15)
CHANGES = {
    LORD_HOWE: [at("UTC", 2026, 4, 4, 15, 0), at("UTC", 2026, 10, 3, 15, 30)],
    ADELAIDE: [at("UTC", 2026, 4, 4, 16, 30), at("UTC", 2026, 10, 3, 16, 30)],
    CHATHAM: [at("UTC", 2026, 4, 4, 14, 0), at("UTC", 2026, 9, 26, 14, 0)],
    KATHMANDU: [at("UTC", 1985, 12, 31, 18, 30)],
    KOLKATA: [at("UTC", 2026, 6, 1, 0, 0)],  # no change: offsets off the hour alone
}
EXPRESSIONS = [
    "* * * * *",
    "*/15 * * * *",
    "*/7 * * * *",
    "45 * * * *",
    "0,30 * * * *",
    "* 1,2 * * *",
    "*/10 1-3 * * *",
    "15 2 * * *",
    "45 1 * * *",
    "0,15,30,45 1,2 * * *",
    "5,20 0 * * *",
    "30 2 * * *",
    "0 */2 * * *",
    "0 30 1 * * *",
    "*/20 * * * * *",
]
zoned_starts = st.sampled_from(sorted(CHANGES)).flatmap(
    lambda zone: st.tuples(
        st.just(zone),
        st.sampled_from(CHANGES[zone]),
        st.integers(min_value=-4 * 3600, max_value=2 * 3600),
    )
)


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(EXPRESSIONS), zoned_starts, st.integers(min_value=1, max_value=6))
def test_every_match_that_exists_fires_once_across_the_changes(
    expr: str, start: tuple[str, int, int], hours: int
) -> None:
    zone, change, shift = start
    rule = CronRule(expr=expr, zone=zone)
    low = change + shift
    end = low + hours * 3600
    expected = policy_dues(rule, low, end)
    assert [local(zone, due) for due in slot_dues(rule, low, end)] == [
        local(zone, due) for due in expected
    ]
    # a catch-up over the span counts the same slots
    if expected:
        first = Slot(0, expected[0] * 1000)
        assert latest_due(rule, first, (end - 1) * 1000) == Slot(
            len(expected) - 1, expected[-1] * 1000
        )


def dues_from(expr: str, zone: str, low: int, count: int) -> list[str]:
    rule = CronRule(expr=expr, zone=zone)
    return [local(zone, due) for due in slot_dues(rule, low, low + 3 * 86_400)[:count]]


def test_lord_howe_repeated_half_hour_fires_on_both_passes() -> None:
    # 2026-04-05 02:00 +11:00 becomes 01:30 +10:30: 01:30-01:59 happen twice
    assert dues_from("*/15 * * * *", LORD_HOWE, at(LORD_HOWE, 2026, 4, 5, 1, 0), 8) == [
        "2026-04-05T01:00+11:00",
        "2026-04-05T01:15+11:00",
        "2026-04-05T01:30+11:00",
        "2026-04-05T01:45+11:00",
        "2026-04-05T01:30+10:30",
        "2026-04-05T01:45+10:30",
        "2026-04-05T02:00+10:30",
        "2026-04-05T02:15+10:30",
    ]
    assert dues_from("45 * * * *", LORD_HOWE, at(LORD_HOWE, 2026, 4, 5, 0, 0), 4) == [
        "2026-04-05T00:45+11:00",
        "2026-04-05T01:45+11:00",
        "2026-04-05T01:45+10:30",
        "2026-04-05T02:45+10:30",
    ]
    # the hour after the change happens once, every minute of it
    two = dues_from("* 2 * * *", LORD_HOWE, at(LORD_HOWE, 2026, 4, 5, 1, 0), 61)
    assert two[:60] == [f"2026-04-05T02:{minute:02}+10:30" for minute in range(60)]
    assert two[60] == "2026-04-06T02:00+10:30"


def test_lord_howe_fixed_time_in_the_repeated_half_hour_fires_once() -> None:
    assert dues_from("45 1 * * *", LORD_HOWE, at(LORD_HOWE, 2026, 4, 4, 12, 0), 2) == [
        "2026-04-05T01:45+11:00",
        "2026-04-06T01:45+10:30",
    ]


def test_lord_howe_skipped_half_hour() -> None:
    # 2026-10-04 02:00 +10:30 becomes 02:30 +11:00: 02:00-02:29 do not exist that day
    assert dues_from("*/15 * * * *", LORD_HOWE, at(LORD_HOWE, 2026, 10, 4, 1, 30), 4) == [
        "2026-10-04T01:30+10:30",
        "2026-10-04T01:45+10:30",
        "2026-10-04T02:30+11:00",
        "2026-10-04T02:45+11:00",
    ]
    assert dues_from("45 * * * *", LORD_HOWE, at(LORD_HOWE, 2026, 10, 4, 1, 0), 3) == [
        "2026-10-04T01:45+10:30",
        "2026-10-04T02:45+11:00",
        "2026-10-04T03:45+11:00",
    ]
    # a fixed time skipped fires at the first valid minute, once for all its skipped matches
    assert dues_from("0,15,45 2 * * *", LORD_HOWE, at(LORD_HOWE, 2026, 10, 3, 12, 0), 4) == [
        "2026-10-04T02:30+11:00",
        "2026-10-04T02:45+11:00",
        "2026-10-05T02:00+11:00",
        "2026-10-05T02:15+11:00",
    ]


def test_kathmandus_quarter_hour_gap_and_offsets_off_the_hour() -> None:
    # 1986-01-01 00:00 +05:30 became 00:15 +05:45
    assert dues_from("10 0 * * *", KATHMANDU, at(KATHMANDU, 1985, 12, 31, 12, 0), 2) == [
        "1986-01-01T00:15+05:45",
        "1986-01-02T00:10+05:45",
    ]
    assert dues_from("*/5 * * * *", KATHMANDU, at(KATHMANDU, 1985, 12, 31, 23, 55), 3) == [
        "1985-12-31T23:55+05:30",
        "1986-01-01T00:15+05:45",
        "1986-01-01T00:20+05:45",
    ]
    rule = CronRule(expr="0 9 * * *", zone=KATHMANDU)
    assert slot_dues(rule, at("UTC", 2026, 6, 1, 0, 0), at("UTC", 2026, 6, 2, 0, 0)) == [
        at("UTC", 2026, 6, 1, 3, 15)
    ]
    rule = CronRule(expr="0 9 * * *", zone=KOLKATA)
    assert slot_dues(rule, at("UTC", 2026, 6, 1, 0, 0), at("UTC", 2026, 6, 2, 0, 0)) == [
        at("UTC", 2026, 6, 1, 3, 30)
    ]


@pytest.mark.parametrize(("month", "day"), [(4, 5), (10, 4)])
def test_adelaide_wildcard_day_has_every_real_quarter_hour(month: int, day: int) -> None:
    rule = CronRule(expr="*/15 * * * *", zone=ADELAIDE)
    low, end = at(ADELAIDE, 2026, month, day, 0, 0), at(ADELAIDE, 2026, month, day + 1, 0, 0)
    dues = slot_dues(rule, low, end)
    assert len(dues) == (end - low) // (15 * MINUTE)  # 100 on the long day, 92 on the short
    assert dues == list(range(low, end, 15 * MINUTE))
