"""The lateness window across a wall clock stepped forward then back (a VM resumed, NTP
correcting it): it restarts rather than drop every observation until the clock catches up,
once an observation is older than the window."""

from __future__ import annotations

import math
from collections import Counter

from fakes_node import FakeClock
from hypothesis import given, settings
from hypothesis import strategies as st

from app.node.lateness import LatenessWindow
from app.node.metrics import NodeMetrics
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


def test_an_observation_older_than_the_window_restarts_it() -> None:
    w = LatenessWindow(window_seconds=60)
    w.observe(0.010, T0)
    w.observe(0.020, T0 - 59)  # within the window: kept beside the newest
    assert [p.second for p in w.recent(60, T0)] == [int(T0) - 59, int(T0)]
    w.observe(0.030, T0 - 100)  # older than the window by less than its span: stepped back
    assert [p.second for p in w.recent(60, T0 - 100)] == [int(T0) - 100]
    assert len(w) == 1


def test_the_chart_is_not_blank_after_the_clock_stepped_back_ten_minutes_or_more() -> None:
    """The node's own window (600 s) after the wall clock stepped back 700 s: the seconds
    of the timers fired since are charted (they were dropped until the clock climbed back,
    the chart and the page's p99 blank up to ten minutes)."""
    metrics = NodeMetrics()
    ahead = int((T0 + 700) * 1000)
    metrics.fired("order", [ahead - 50], ahead)
    clock = FakeClock(int(T0 * 1000))  # stepped back 700 s
    for _ in range(30):
        clock.advance(1_000)
        now = clock.now()
        metrics.fired("order", [now - 40], now)
    points = metrics.recent_lateness.recent(60, clock.now() / 1000)
    assert [p.count for p in points] == [1] * 30
    assert recent_p99(metrics.recent_lateness, clock.now()) == 40.0


@settings(max_examples=150, deadline=None)
@given(
    window_seconds=st.integers(1, 30),
    offsets=st.lists(st.floats(0.0, 120.0), min_size=1, max_size=200),
)
def test_the_window_keeps_the_last_seconds_since_its_last_restart(
    window_seconds: int, offsets: list[float]
) -> None:
    """Time may go back and forth: kept is every second within the window of the newest seen
    since the clock last stepped back past the window (the window restarted)."""
    window = LatenessWindow(window_seconds)
    newest: int | None = None
    model: Counter[int] = Counter()
    for offset in offsets:
        window.observe(0.001, T0 + offset)
        assert len(window) <= window_seconds
        second = math.floor(T0 + offset)
        if newest is not None and newest - second >= window_seconds:
            newest, model = None, Counter()
        newest = second if newest is None else max(newest, second)
        if second > newest - window_seconds:
            model[second] += 1
    assert newest is not None
    kept = {s: n for s, n in model.items() if s > newest - window_seconds}
    points = window.recent(window_seconds, newest + 0.5)
    assert {p.second: p.count for p in points} == kept
