"""The lateness window across a wall clock stepped forward then back (a VM resumed, NTP
correcting it): it restarts rather than drop every observation until the clock catches up."""

from __future__ import annotations

import math
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from app.node.lateness import LatenessWindow
from app.ops.node_report import recent_p99

T0 = 1_800_000_000.0


def test_the_window_restarts_after_the_clock_stepped_back() -> None:
    w = LatenessWindow(window_seconds=60)
    w.observe(0.010, T0 + 3_600)  # committed while the clock read an hour ahead
    for i in range(30):
        w.observe(0.050, T0 + i)
    assert len(w) == 30, "the future second is dropped"
    assert [p.count for p in w.recent(60, T0 + 30)] == [1] * 30
    assert recent_p99(w, int((T0 + 30) * 1000)) == 50.0


def test_an_observation_just_older_than_the_window_is_dropped_as_before() -> None:
    w = LatenessWindow(window_seconds=60)
    w.observe(0.010, T0)
    w.observe(0.020, T0 - 100)  # older than the window by less than its span
    assert [p.second for p in w.recent(60, T0)] == [int(T0)]
    w.observe(0.020, T0 - 119)  # by 60 seconds: still dropped
    assert len(w) == 1
    w.observe(0.030, T0 - 120)  # by more than its span: the clock stepped back
    assert [p.second for p in w.recent(60, T0 - 120)] == [int(T0) - 120]


@settings(max_examples=150, deadline=None)
@given(
    window_seconds=st.integers(1, 30),
    offsets=st.lists(st.floats(0.0, 120.0), min_size=1, max_size=200),
)
def test_the_window_keeps_the_last_seconds_since_its_last_restart(
    window_seconds: int, offsets: list[float]
) -> None:
    """Time may go back and forth: kept is every second within the window of the newest seen
    since the clock last stepped back by more than twice the window (the window restarted)."""
    window = LatenessWindow(window_seconds)
    newest: int | None = None
    model: Counter[int] = Counter()
    for offset in offsets:
        window.observe(0.001, T0 + offset)
        assert len(window) <= window_seconds
        second = math.floor(T0 + offset)
        if newest is not None and newest - second >= 2 * window_seconds:
            newest, model = None, Counter()
        newest = second if newest is None else max(newest, second)
        if second > newest - window_seconds:
            model[second] += 1
    assert newest is not None
    kept = {s: n for s, n in model.items() if s > newest - window_seconds}
    points = window.recent(window_seconds, newest + 0.5)
    assert {p.second: p.count for p in points} == kept
