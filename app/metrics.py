"""A node's Prometheus metrics: one registry per node, so tests can run several nodes."""

from __future__ import annotations

from dataclasses import fields

from prometheus_client import CollectorRegistry, Counter, Gauge

from app.lateness import LatenessWindow
from app.runner import RoundStats

__all__ = ["NodeMetrics"]

_ROUND_FIELDS = [
    f.name
    for f in fields(RoundStats)
    if f.name not in ("full", "next_due", "reload_at", "loaded", "written")
]


class NodeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.commands = Counter(
            "tickwheel_commands",
            "Commands decided, by aggregate type and result code",
            ["type", "code"],
            registry=self.registry,
        )
        self.dead_letters = Counter(
            "tickwheel_dead_letters",
            "Records skipped as unreadable, by topic",
            ["topic"],
            registry=self.registry,
        )
        self.timers = Counter(
            "tickwheel_timer_actions",
            "What the firing loop did, by aggregate type and action (sent, fired, parked, …)",
            ["type", "action"],
            registry=self.registry,
        )
        self.followed = Counter(
            "tickwheel_followed_events",
            "Events another writer appended to a log this node decides, folded into its "
            "aggregates (ahead of their versions), by aggregate type",
            ["type"],
            registry=self.registry,
        )
        self.owned = Gauge(
            "tickwheel_owned_partitions", "Partitions this node owns", registry=self.registry
        )
        # Per-second lateness of the last minutes, read by the operator page's chart.
        self.recent_lateness = LatenessWindow()

    def round(self, type_name: str, stats: RoundStats) -> None:
        for name in _ROUND_FIELDS:
            value = getattr(stats, name)
            if value:
                self.timers.labels(type_name, name).inc(value)
