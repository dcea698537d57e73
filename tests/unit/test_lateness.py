"""LatenessWindow: exact counts and max, percentiles within the sketch's relative accuracy,
memory bounded to the window, and bad input refused without recording anything.

`now` is always passed in (a fake clock): nothing here reads the time.
"""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.node.lateness import RELATIVE_ACCURACY, LatenessPoint, LatenessWindow

T0 = 1_800_000_000.0

# Lateness as a timer service sees it: early by up to a minute (another node's clock), late by up
# to a day, and never closer to zero than a microsecond unless exactly zero: the domain on which
# the sketch's bins keep every value apart (see BIN_LIMIT).
_magnitudes = st.floats(min_value=1e-6, max_value=86_400.0, allow_nan=False)
latenesses = st.one_of(
    st.just(0.0),
    _magnitudes,
    _magnitudes.filter(lambda v: v <= 60.0).map(lambda v: -v),
)


def _exact(values_ms: list[float], q: float) -> float:
    """The percentile DDSketch approximates: the value of rank floor(q·(n-1)) in sorted order."""
    ordered = sorted(values_ms)
    return ordered[math.floor(q * (len(ordered) - 1))]


def _close(reported: float, exact: float) -> bool:
    return abs(reported - exact) <= RELATIVE_ACCURACY * abs(exact) + 1e-9


@settings(max_examples=200, deadline=None)
@given(values=st.lists(latenesses, min_size=1, max_size=400), frac=st.floats(0.0, 0.999))
def test_one_second_count_and_max_are_exact_percentiles_within_accuracy(
    values: list[float], frac: float
) -> None:
    window = LatenessWindow()
    now = T0 + frac
    half = len(values) // 2
    window.observe_many(values[:half], now)
    for v in values[half:]:
        window.observe(v, now)

    [point] = window.recent(1, now)
    values_ms = [v * 1000.0 for v in values]
    assert point.second == math.floor(now)
    assert point.count == len(values)
    assert point.max_ms == max(values_ms)
    assert _close(point.p50_ms, _exact(values_ms, 0.50))
    assert _close(point.p99_ms, _exact(values_ms, 0.99))
    assert min(values_ms) <= point.p50_ms <= point.p99_ms <= point.max_ms


@settings(max_examples=150, deadline=None)
@given(
    window_seconds=st.integers(1, 30),
    observations=st.lists(st.tuples(st.floats(0.0, 120.0), latenesses), min_size=1, max_size=200),
)
def test_memory_is_bounded_and_the_window_keeps_exactly_its_last_seconds(
    window_seconds: int, observations: list[tuple[float, float]]
) -> None:
    """Time may go back and forth (observations out of order): what is kept after all of them
    is every observation whose second is within the window of the newest second seen since
    the clock last stepped back past the window (the window restarted then)."""
    window = LatenessWindow(window_seconds)
    newest: int | None = None
    model: dict[int, list[float]] = defaultdict(list)
    for offset, lateness in observations:
        window.observe(lateness, T0 + offset)
        assert len(window) <= window_seconds
        second = math.floor(T0 + offset)
        if newest is not None and newest - second >= window_seconds:
            newest, model = None, defaultdict(list)
        newest = second if newest is None else max(newest, second)
        if second > newest - window_seconds:
            model[second].append(lateness * 1000.0)
    assert newest is not None
    model = defaultdict(list, {s: v for s, v in model.items() if s > newest - window_seconds})

    points = window.recent(window_seconds, newest + 0.5)
    assert [p.second for p in points] == sorted(model)
    for p in points:
        assert p.count == len(model[p.second])
        assert p.max_ms == max(model[p.second])
        assert _close(p.p99_ms, _exact(model[p.second], 0.99))


def test_recent_covers_the_seconds_ending_at_now_oldest_first() -> None:
    window = LatenessWindow(window_seconds=60)
    for i in range(10):
        window.observe(0.001 * (i + 1), T0 + i + 0.25)

    points = window.recent(3, T0 + 8.9)
    assert [p.second for p in points] == [int(T0) + 6, int(T0) + 7, int(T0) + 8]
    assert [p.max_ms for p in points] == pytest.approx([7.0, 8.0, 9.0])
    assert all(p.count == 1 for p in points)
    # Seconds in which nothing fired are absent, not zero points.
    assert window.recent(5, T0 + 30.0) == []


def test_a_second_observed_after_it_left_the_window_restarts_it() -> None:
    """Each observation is measured at its commit, on the clock read then: one older than
    the window is the clock stepped back, and the window starts again from it."""
    window = LatenessWindow(window_seconds=10)
    window.observe(0.5, T0 + 100)
    window.observe(0.7, T0 + 85)  # 15 s before the newest second: outside the window

    assert len(window) == 1
    assert window.recent(10, T0 + 85) == [
        LatenessPoint(second=int(T0) + 85, count=1, p50_ms=700.0, p99_ms=700.0, max_ms=700.0)
    ]


def test_a_busy_second_costs_a_bounded_sketch_not_a_list() -> None:
    """A hundred thousand timers in one second: the count is exact and the percentiles close,
    with memory bounded by the sketch's bins rather than the number of timers."""
    window = LatenessWindow()
    n = 100_000
    values = [(i % 1000) / 1000.0 for i in range(n)]  # 0 ms .. 999 ms, uniformly
    window.observe_many(values, T0)

    [point] = window.recent(1, T0)
    values_ms = [v * 1000.0 for v in values]
    assert point.count == n
    assert point.max_ms == pytest.approx(999.0)
    assert _close(point.p50_ms, _exact(values_ms, 0.50))
    assert _close(point.p99_ms, _exact(values_ms, 0.99))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_lateness_is_refused_and_nothing_of_its_batch_is_recorded(
    bad: float,
) -> None:
    window = LatenessWindow()
    with pytest.raises(ValueError, match="lateness_seconds must be a finite number"):
        window.observe_many([0.1, bad, 0.2], T0)
    with pytest.raises(ValueError, match="now must be a finite number"):
        window.observe(0.1, bad)
    assert len(window) == 0
    assert window.recent(1, T0) == []


def test_bad_window_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="window_seconds must be at least 1"):
        LatenessWindow(window_seconds=0)
    window = LatenessWindow(window_seconds=60)
    with pytest.raises(ValueError, match=r"seconds must be within 1\.\.60"):
        window.recent(0, T0)
    with pytest.raises(ValueError, match=r"seconds must be within 1\.\.60"):
        window.recent(61, T0)
    with pytest.raises(ValueError, match="now must be a finite number"):
        window.recent(10, math.nan)
