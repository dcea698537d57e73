"""Counting cron matches without stepping (tables.cron_matches): the counts are the steps'
on small cases, and a catch-up under a count reaches its slot in one call of bounded work."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from datetime import UTC, date, datetime
from importlib import resources
from itertools import islice, pairwise, takewhile
from typing import Any
from unittest.mock import patch

import pytest
import tzdata
from cronsim import CronSim
from hypothesis import given, settings
from hypothesis import strategies as st

from tables import cron_matches, slots
from tables.bounds import MAX_INT64
from tables.cron_matches import SCAN_SECONDS, count_matches, cron_after, nth_match_after
from tables.rules import CronRule
from tables.slots import MAX_CRON_STEPS, Slot, first_slot, latest_due, next_slot
from tables.zones import zone_names

HOUR = 3_600_000
DAY = 24 * HOUR
Y2026 = 1_767_225_600_000

EXPRESSIONS = [
    "* * * * *",
    "*/7 * * * *",
    "15 * * * *",
    "30 2 * * *",
    "0,30 2 * * *",
    "0 1-3 * * *",
    "*/13 2 * * *",
    "0 9 * * MON-FRI",
    "0 3 L * *",
    "0 0 LW * *",
    "15 10 1,15 * FRI",
    "0 30 2 * * *",
    "*/20 * * * * *",
]
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Pacific/Chatham"]
# 2026's clock changes of Berlin, New York, Lord Howe and Chatham (UTC)
CHANGES = [
    1_774_746_000_000,
    1_792_890_000_000,
    1_772_953_200_000,
    1_793_512_800_000,
    1_775_314_800_000,
    1_791_041_400_000,
    1_775_311_200_000,
    1_790_431_200_000,
]
starts = st.builds(
    int.__add__, st.sampled_from(CHANGES), st.integers(min_value=-2 * DAY, max_value=DAY)
)
rules = st.builds(CronRule, expr=st.sampled_from(EXPRESSIONS), zone=st.sampled_from(ZONES))
CASES = settings(max_examples=60, deadline=None)


def stepped(rule: CronRule, after: int, until: int) -> list[int]:
    """The brute force: every match in (after, until], one step at a time."""
    return list(takewhile(lambda due: due <= until, cron_after(rule, after)))


@CASES
@given(rules, starts, st.integers(min_value=0, max_value=3 * DAY))
def test_a_count_is_the_number_of_steps(rule: CronRule, after: int, span: int) -> None:
    counted, _ = count_matches(rule, after, after + span, 10_000)
    assert counted == len(stepped(rule, after, after + span))


@CASES
@given(rules, starts, st.integers(min_value=0, max_value=3 * DAY), st.integers(1, 10**6))
def test_the_nth_match_is_the_nth_step(rule: CronRule, after: int, span: int, pick: int) -> None:
    dues = stepped(rule, after, after + span)
    if dues:
        n = pick % len(dues) + 1
        assert nth_match_after(rule, after, n, dues[-1], 10_000) == dues[n - 1]


@pytest.mark.parametrize("zone", ["Europe/Berlin", "America/New_York"])
@pytest.mark.parametrize("expr", ["*/20 * * * * *", "*/3 * * * *"])
def test_dense_jobs_counted_on_the_wall_clock_match_the_steps(zone: str, expr: str) -> None:
    # too dense to step through a clock change: the wall clock's count, still exact
    rule = CronRule(expr=expr, zone=zone)
    for change in CHANGES[:4]:
        with patch.object(cron_matches, "WINDOW_MATCHES", -1):
            counted, steps = count_matches(rule, change - DAY, change + DAY, 10_000)
        assert steps == 10_000
        assert counted == len(stepped(rule, change - DAY, change + DAY))


@CASES
@given(
    rules,
    starts,
    st.integers(min_value=1, max_value=300),
    st.integers(min_value=0, max_value=2 * DAY),
)
def test_a_catch_up_under_a_count_equals_stepping_one_slot_at_a_time(
    rule: CronRule, start: int, count: int, behind: int
) -> None:
    rule = rule.model_copy(update={"start": start, "count": count})
    first = first_slot(rule, start)
    assert first is not None
    now = first.due_at + behind
    brute = first
    while (after := next_slot(rule, brute)) is not None and after.due_at <= now:
        brute = after
    with patch.object(slots, "MAX_CRON_STEPS", 2):  # counted past the second step
        assert latest_due(rule, first, now) == brute


class _Counted(CronSim):
    """CronSim, counting its evaluations: matches searched for and days matched."""

    calls = 0

    def __next__(self) -> Any:
        _Counted.calls += 1
        return super().__next__()

    def match_day(self, d: date) -> bool:
        _Counted.calls += 1
        return bool(super().match_day(d))


@pytest.fixture
def evaluations() -> Iterator[type[_Counted]]:
    _Counted.calls = 0
    cron_matches._shape.cache_clear()
    with patch.object(cron_matches, "CronSim", _Counted):
        yield _Counted
    cron_matches._shape.cache_clear()


@pytest.mark.parametrize(("count", "last"), [(MAX_INT64, 1_780_000_000), (10**6, 999_999)])
@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin"])
def test_a_per_second_rule_from_1970_catches_up_in_one_bounded_call(
    evaluations: type[_Counted], zone: str, count: int, last: int
) -> None:
    """The review's input: created at 0, every second, a count: one call reaches the slot
    due at `now` (or the last one), where stepping took 178,000 calls of 10,000 steps."""
    now = 1_780_000_000_000
    rule = CronRule(expr="* * * * * *", zone=zone, count=count)
    first = first_slot(rule, 0)
    assert first == Slot(0, 0)
    evaluations.calls = 0
    assert latest_due(rule, first, now) == Slot(last, last * 1000)
    # the first MAX_CRON_STEPS stepped (exact, as before: ~2 evaluations a step, measured
    # 22,000-28,000 in all), then a few thousand (cached months, the days of a clock
    # change's months, the bisection's searches), not the 1.78 billion matches in between
    assert evaluations.calls < 3 * MAX_CRON_STEPS + 10_000


def test_the_zone_scan_cannot_step_over_two_changes() -> None:
    # _pieces reads the offset SCAN_SECONDS apart: two changes closer could hide each other.
    # The pure-Python zoneinfo lists a zone's changes (the C one does not); tests only.
    pure_zoneinfo: Any = importlib.import_module("zoneinfo._zoneinfo")

    def changes(key: str) -> list[int]:
        # The package's file, as rules step in (`tables.zones`), not the system's.
        with resources.files(tzdata).joinpath("zoneinfo", *key.split("/")).open("rb") as data:
            return [t for t in pure_zoneinfo.ZoneInfo.from_file(data, key=key)._trans_utc if t >= 0]

    closest = min(
        later - earlier for key in zone_names() for earlier, later in pairwise(changes(key))
    )
    assert closest > SCAN_SECONDS


def test_a_rule_matching_only_skipped_local_times_has_no_match_within_cronsims_horizon(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """2:30:30 on the second Sunday of March never exists in New York (its clocks skip from
    2:00 to 3:00 then), and a six-field rule is not moved by Debian cron's policy: no
    match ever. The stretches are walked as far as cronsim's own 50 years, not to year
    9999 (~16,000 stretches, seconds of the event loop's time a search, found by a hunt
    for hostile input: one such ScheduleSet held a node's loop for 12.6 s)."""
    rule = CronRule(expr="30 30 2 * 3 0#2", zone="America/New_York")
    walked = 0
    stretch = cron_matches._stretch_matches

    def counted(*args: Any) -> Iterator[int]:
        nonlocal walked
        walked += 1
        return stretch(*args)

    monkeypatch.setattr(cron_matches, "_stretch_matches", counted)
    start = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000)
    assert next(cron_after(rule, start), None) is None
    assert walked <= 2 * 51  # two stretches a year (standard and daylight time)
    # A rule that does match in both stretches is walked on as before.
    daily = CronRule(expr="30 30 2 * * *", zone="America/New_York")
    assert len(list(islice(cron_after(daily, start), 400))) == 400
