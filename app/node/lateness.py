"""Timer lateness over the last minutes, second by second, for the operator page's chart.

Prometheus keeps the long history (`tickwheel_timer_lateness_seconds`); this window answers
"how late were timers in each of the last N seconds" from the node itself, with no Prometheus
in the way. It is pure: the caller passes `now` (seconds since the epoch, any clock) to every
call, so tests drive it with a fake clock and nothing here reads the time or does I/O.

Memory is bounded twice: only the last `window_seconds` seconds are kept (older buckets are
dropped as newer ones open), and each second's values go into a DDSketch with a fixed bin
limit instead of a list, so a second in which a million timers fire costs what a second with a
hundred does. The price is precision: p50 and p99 are within `RELATIVE_ACCURACY` of the exact
value (the sketch's guarantee, checked by the tests); count and max are exact.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from ddsketch import LogCollapsingLowestDenseDDSketch

__all__ = ["BIN_LIMIT", "RELATIVE_ACCURACY", "LatenessPoint", "LatenessWindow"]

RELATIVE_ACCURACY = 0.01
"""A reported percentile is within 1% of the exact one (DDSketch's relative-error guarantee)."""

BIN_LIMIT = 2048
"""Bins per second's sketch: at 1% accuracy 2048 bins span a factor of ~10^17 between the
smallest and largest value kept apart (1 µs to beyond a year); past that the lowest bins are
merged, which only blurs the smallest latenesses, never p50/p99 of a late second."""

DEFAULT_WINDOW_SECONDS = 600


@dataclass(frozen=True, slots=True)
class LatenessPoint:
    """One second of fired timers: how many, and how late (applied - due) in milliseconds."""

    second: int
    count: int
    p50_ms: float
    p99_ms: float
    max_ms: float


class _Second:
    __slots__ = ("max_ms", "min_ms", "sketch")

    def __init__(self) -> None:
        self.sketch = LogCollapsingLowestDenseDDSketch(RELATIVE_ACCURACY, bin_limit=BIN_LIMIT)
        self.min_ms = math.inf
        self.max_ms = -math.inf


class LatenessWindow:
    """Per-second lateness of the last `window_seconds` seconds.

    `observe` is O(1) (one sketch insert); `observe_many` takes a whole batch of timers
    decided at the same moment, so the firing path looks its second up once per batch.
    """

    def __init__(self, window_seconds: int = DEFAULT_WINDOW_SECONDS) -> None:
        if window_seconds < 1:
            raise ValueError(f"window_seconds must be at least 1, not {window_seconds}")
        self.window_seconds = window_seconds
        self._seconds: dict[int, _Second] = {}
        self._newest: int | None = None

    def observe(self, lateness_seconds: float, now: float) -> None:
        """Records one timer applied `lateness_seconds` after its due time, at time `now`."""
        self.observe_many((lateness_seconds,), now)

    def observe_many(self, latenesses_seconds: Iterable[float], now: float) -> None:
        """Records timers applied at `now`, each `lateness_seconds` after its due time.

        A non-finite lateness or `now` is a caller's bug: ValueError, and nothing of the call
        is recorded. A negative lateness is kept as it is (a remote target's clock behind the
        deciding node's). A `now` older than the window (its newest second less
        `window_seconds`, or earlier) is a clock stepped back: the window restarts from it.
        """
        values = [float(v) for v in latenesses_seconds]
        _check_finite("now", now)
        for v in values:
            _check_finite("lateness_seconds", v)
        if not values:
            return
        second = math.floor(now)
        bucket = self._bucket(second)
        add = bucket.sketch.add
        low, top = bucket.min_ms, bucket.max_ms
        for v in values:
            ms = v * 1000.0
            add(ms)
            if ms > top:
                top = ms
            if ms < low:
                low = ms
        bucket.min_ms, bucket.max_ms = low, top

    def recent(self, seconds: int, now: float) -> list[LatenessPoint]:
        """The seconds in (now - seconds, now] in which timers fired, oldest first.

        Seconds in which no timer fired are absent (there is no lateness to report).
        """
        if not 1 <= seconds <= self.window_seconds:
            raise ValueError(f"seconds must be within 1..{self.window_seconds}, not {seconds}")
        _check_finite("now", now)
        last = math.floor(now)
        first = last - seconds + 1
        points: list[LatenessPoint] = []
        for second in sorted(s for s in self._seconds if first <= s <= last):
            bucket = self._seconds[second]
            points.append(
                LatenessPoint(
                    second=second,
                    count=int(bucket.sketch.count),
                    p50_ms=_quantile(bucket, 0.50),
                    p99_ms=_quantile(bucket, 0.99),
                    max_ms=bucket.max_ms,
                )
            )
        return points

    def _bucket(self, second: int) -> _Second:
        bucket = self._seconds.get(second)
        if bucket is not None:
            return bucket
        if self._newest is not None and second <= self._newest - self.window_seconds:
            # Older than the window: no observation comes that late (each is measured at
            # its commit, on the clock read then), the wall clock stepped back (after a step
            # forward). The window restarts: kept, the future seconds would drop every
            # observation until the clock passed them again, the chart blank meanwhile.
            self._seconds.clear()
            self._newest = None
        if self._newest is None or second > self._newest:
            self._newest = second
            # A new second opened: drop those that left the window. At most one scan of
            # `window_seconds` keys per second, not per timer.
            oldest_kept = second - self.window_seconds + 1
            for old in [s for s in self._seconds if s < oldest_kept]:
                del self._seconds[old]
        bucket = _Second()
        self._seconds[second] = bucket
        return bucket

    def __len__(self) -> int:
        """Seconds currently kept (at most `window_seconds`)."""
        return len(self._seconds)


def _quantile(bucket: _Second, q: float) -> float:
    value = bucket.sketch.get_quantile_value(q)
    # Never None here: only seconds with at least one value have a bucket.
    assert value is not None
    # The sketch answers within 1% either way; the exact percentile lies within [min, max],
    # so clamping can only bring the answer closer (and p99 never shows above max).
    return min(max(float(value), bucket.min_ms), bucket.max_ms)


def _check_finite(name: str, value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, not {value!r}")
