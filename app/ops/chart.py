"""The operator page's lateness chart: an inline SVG's points (no script), of the
node's timer lateness per second over the last `CHART_SECONDS`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from app.node.lateness import LatenessPoint

__all__ = ["CHART_SECONDS", "Chart", "lateness_chart"]

CHART_SECONDS = 300
"""The lateness chart's span: the last five minutes."""


class Recent(Protocol):
    """The node's recent lateness (`NodeMetrics.recent_lateness`)."""

    def recent(self, seconds: int, now: float) -> Sequence[LatenessPoint]: ...


@dataclass
class Chart:
    width: int = 720
    height: int = 180
    left: int = 64
    bottom: int = 22
    p50: str = ""
    p99: str = ""
    maxes: list[tuple[float, float]] = field(default_factory=list)
    p99s: list[tuple[float, float]] = field(default_factory=list)
    top: str = ""
    points: int = 0
    fired: int = 0
    worst: str = ""


def lateness_chart(window: Recent, now: int) -> Chart:
    chart = Chart()
    points: Sequence[LatenessPoint] = window.recent(CHART_SECONDS, now / 1000)
    if not points:
        return chart
    top = max(max(p.max_ms for p in points), 1.0)
    plot_w = chart.width - chart.left - 8
    plot_h = chart.height - chart.bottom - 8
    start = now // 1000 - CHART_SECONDS + 1

    def x(second: int) -> float:
        return round(chart.left + (second - start) / (CHART_SECONDS - 1) * plot_w, 1)

    def y(ms: float) -> float:
        return round(8 + plot_h - max(ms, 0.0) / top * plot_h, 1)

    chart.p50 = " ".join(f"{x(p.second)},{y(p.p50_ms)}" for p in points)
    chart.p99 = " ".join(f"{x(p.second)},{y(p.p99_ms)}" for p in points)
    chart.maxes = [(x(p.second), y(p.max_ms)) for p in points]
    # Marks as well as lines: a second alone (no neighbour to draw a line to) shows.
    chart.p99s = [(x(p.second), y(p.p99_ms)) for p in points]
    chart.top = _ms(top)
    chart.points = len(points)
    chart.fired = sum(p.count for p in points)
    chart.worst = _ms(max(p.max_ms for p in points))
    return chart


def _ms(ms: float) -> str:
    return f"{ms / 1000:.2f} s" if ms >= 1000 else f"{ms:.1f} ms"
