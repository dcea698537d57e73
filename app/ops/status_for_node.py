"""A running node's cluster status (`for_node`: `ClusterStatus` over its clients, producer
and settings): where the other nodes' pages link to its own (`web_address`), and its
counters on the node's registry (`bad_records_counter`, `report_errors_counter`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter

from app.node.settings import Settings
from app.ops.cluster_status import ClusterStatus
from app.ops.node_report import recent_p99

if TYPE_CHECKING:
    from app.node import Node

__all__ = ["bad_records_counter", "for_node", "report_errors_counter", "web_address"]


def web_address(settings: Settings, port: int) -> str | None:
    """Where the other nodes' pages link to this node's: `TICKWHEEL_WEB_URL`, else its
    host and port unless it listens on every address (no name to give then)."""
    if settings.web_url is not None:
        return settings.web_url.rstrip("/")
    if not port or settings.web_host in ("0.0.0.0", "::", ""):
        return None
    host = f"[{settings.web_host}]" if ":" in settings.web_host else settings.web_host
    return f"http://{host}:{port}"


def bad_records_counter(registry: CollectorRegistry) -> Counter:
    """`tickwheel_cluster_status_bad_records_total`, on the node's registry."""
    return Counter(
        "tickwheel_cluster_status_bad_records",
        "records of the <context>.nodes topics that are no node report (skipped)",
        registry=registry,
    )


def report_errors_counter(registry: CollectorRegistry) -> Counter:
    """`tickwheel_cluster_status_report_errors_total`, on the node's registry."""
    return Counter(
        "tickwheel_cluster_status_report_errors",
        "the node's status reports that could not be made (not published; logged)",
        registry=registry,
    )


def for_node(node: Node, node_id: str, port: int) -> ClusterStatus:
    """The `ClusterStatus` of a running `Node` (its clients and producer, its settings'
    interval, its lateness window, a counter of bad records in its registry)."""
    bad = bad_records_counter(node.metrics.registry)
    errors = report_errors_counter(node.metrics.registry)

    def lateness() -> float | None:
        return recent_p99(node.metrics.recent_lateness, node.clock.now())

    return ClusterStatus(
        node.clients,
        node.producer,
        node,
        node_id,
        web=web_address(node.settings, port),
        interval_ms=node.settings.status_interval_ms,
        lateness=lateness,
        on_bad=bad.inc,
        on_report_error=errors.inc,
    )
