"""What a node runs, as its `tickwheel_build_info` metric says it (`app.node.metrics`):
Tickwheel's version, Python's, aiokafka's, how the client picks the Kafka protocol's API
versions, and the IANA release of the zones rules are stepped in (`tables.zones`); the
labels of this process (`build_info`) and the gauge, always 1, that carries them
(`build_info_gauge`). May import `prometheus_client`, the package's version
(`app.__version__`) and `tables.zones`."""

from __future__ import annotations

import platform
from importlib import metadata
from typing import Final

from prometheus_client import CollectorRegistry, Gauge

from app import __version__
from tables.zones import IANA_VERSION

__all__ = ["BUILD_LABELS", "KAFKA_CLIENT_API", "build_info", "build_info_gauge"]

BUILD_LABELS: Final = ("version", "python", "aiokafka", "kafka_client_api", "tzdata")

KAFKA_CLIENT_API: Final = "auto"
"""How the Kafka clients pick each request's API version: negotiated, as aiokafka's old
`api_version="auto"` named it. Since aiokafka 0.13 there is no such setting: each
connection asks its broker (ApiVersions) and sends each request at the highest version both
sides know."""


def build_info() -> dict[str, str]:
    """The `tickwheel_build_info` labels of this process."""
    return {
        "version": __version__,
        "python": platform.python_version(),
        "aiokafka": metadata.version("aiokafka"),
        "kafka_client_api": KAFKA_CLIENT_API,
        "tzdata": IANA_VERSION,
    }


def build_info_gauge(registry: CollectorRegistry) -> Gauge:
    """`tickwheel_build_info` in `registry`, its one series (this process's labels) set to 1."""
    # A gauge, not an Info: its family and its sample are both `tickwheel_build_info`.
    gauge = Gauge(
        "tickwheel_build_info",
        "What this node runs: Tickwheel's version, Python's, aiokafka's, the Kafka "
        "client's API version choice and the time zones' IANA release; always 1",
        list(BUILD_LABELS),
        registry=registry,
    )
    gauge.labels(**build_info()).set(1)
    return gauge
