"""Takes the client library's retry flood out of the log while a `BrokerWatch` listens:
connection errors (always; summed up once a minute while the broker answers) and the
retries that follow an outage (while it is away and shortly after), handed to the watch
as hints; everything else passes untouched (see `app.kafka.broker_watch`), but one
record, bounded whether a watch listens or not: aiokafka's "Unexpected error while
fetching data" (a fetch answered with an error it has no branch for, fetched again at
once, a line each time, naming no partition) passes once a minute per error, saying what
it means and how many were not logged (`app.kafka.fetch_stalls` stops the node when a
partition's fetches all fail so)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from typing import Final, Literal, Protocol

from aiokafka.errors import (
    KafkaConnectionError,
    KafkaTimeoutError,
    NodeNotReadyError,
    RequestTimedOutError,
)

from app.kafka.fetch_stalls import STALL_S
from app.log_limit import LogLimit

__all__ = [
    "AIOKAFKA_LOGGERS",
    "FETCH_ERROR_EVERY_S",
    "BrokerLogFilter",
    "Kind",
    "classify",
    "install_log_filter",
    "log_filter",
]

logger = logging.getLogger(__name__)

Kind = Literal["connection", "recovery"]


class Listener(Protocol):
    """What hears the muted records (a `BrokerWatch`)."""

    def heard(self, kind: Kind, message: str, template: str = "") -> bool:
        """Whether the record stays in the log (`template`: its format string)."""
        ...


AIOKAFKA_LOGGERS = (
    "aiokafka",
    "aiokafka.admin.client",
    "aiokafka.cluster",
    "aiokafka.conn",
    "aiokafka.consumer.consumer",
    "aiokafka.consumer.fetcher",
    "aiokafka.consumer.group_coordinator",
    "aiokafka.consumer.subscription_state",
    "aiokafka.coordinator.assignors.abstract",
    "aiokafka.coordinator.assignors.range",
    "aiokafka.coordinator.assignors.roundrobin",
    "aiokafka.coordinator.assignors.sticky.partition_movements",
    "aiokafka.coordinator.assignors.sticky.sticky_assignor",
    "aiokafka.helpers",
    "aiokafka.producer.producer",
    "aiokafka.producer.sender",
)
"""The loggers aiokafka logs on (a logger's filters see only its own records, not its
children's, so each one gets the filter)."""

_CLIENT = "aiokafka"
_COORDINATOR = "aiokafka.consumer.group_coordinator"
_FETCHER = "aiokafka.consumer.fetcher"
_SENDER = "aiokafka.producer.sender"
_CLUSTER = "aiokafka.cluster"

# The records of a broker that cannot be reached, by logger and format string.
_CONNECTION: frozenset[tuple[str, str]] = frozenset(
    {
        (_CLIENT, 'Unable connect to "%s:%s": %s'),
        (_CLIENT, "Unable connect to node with id %s: %s"),
        (_CLIENT, "Unable to update metadata from %s"),
        (_CLIENT, 'Unable to request metadata from "%s:%s": %s'),
        (_CLIENT, "Unable to request metadata from node with id %s: %r"),
        (_COORDINATOR, "Heartbeat session expired - marking coordinator dead"),
    }
)
# Records about a failed request: the broker's absence if the error is a connection's,
# else the broker recovering (a coordinator or leader not ready yet).
_BY_ERROR: frozenset[tuple[str, str]] = frozenset(
    {
        (_FETCHER, "Failed fetch messages from %s: %s"),
        (_FETCHER, "Failed fetch offsets from %s: %s"),
        (_COORDINATOR, "Group Coordinator Request failed: %s"),
        (_COORDINATOR, "Error sending %s to node %s [%s] -- marking coordinator dead"),
        (_COORDINATOR, "Heartbeat send request failed: %s. Will retry."),
        (_SENDER, "Cannot send %r to %s: %r"),
        (_SENDER, "Could not send %r: %r"),
        (_SENDER, "Got error produce response: %s"),
        (_SENDER, "FindCoordinator Request failed: %s"),
    }
)
# What follows an outage: retries while leaders are elected and coordinators load, and
# the group membership the outage cost.
_RECOVERY: frozenset[tuple[str, str]] = frozenset(
    {
        (_SENDER, "Got error produce response on topic-partition %s, retrying. Error: %s"),
        (_COORDINATOR, "Marking the coordinator dead (node %s)for group %s."),
        (
            _COORDINATOR,
            "Heartbeat failed for group %s: coordinator (node %s)"
            " is either not started or not valid",
        ),
        (_COORDINATOR, "Heartbeat failed for group %s because it is rebalancing"),
        (_COORDINATOR, "Heartbeat failed for group %s: generation id is not  current."),
        (
            _COORDINATOR,
            "Heartbeat failed: local member_id was not recognized; resetting and re-joining group",
        ),
        (_COORDINATOR, "OffsetCommit failed for group %s due to group error (%s), will rejoin"),
        (_FETCHER, "Attempt to fetch offsets for partition %s failed due to: %s"),
        (_CLUSTER, "Topic %s is not available during auto-create initialization"),
        (_CLUSTER, "Error fetching metadata for topic %s: %s"),
    }
)
# A fetch answered with an error aiokafka has no branch for (CORRUPT_MESSAGE,
# KAFKA_STORAGE_ERROR, UNKNOWN_SERVER_ERROR): logged at each of its many refetches a second.
_UNEXPECTED: Final = (_FETCHER, "Unexpected error while fetching data: %s")
FETCH_ERROR_EVERY_S: Final = 60.0
"""aiokafka's "Unexpected error while fetching data" passes at most this often per error."""
_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    NodeNotReadyError,
    KafkaConnectionError,
    RequestTimedOutError,
    KafkaTimeoutError,
    OSError,
    TimeoutError,
)
_CONNECTION_WORDS = ("NodeNotReadyError", "KafkaConnectionError", "Connect call failed")


def classify(record: logging.LogRecord) -> Kind | None:
    """What an aiokafka record says about the broker: "connection" (it cannot be
    reached), "recovery" (a retry of the kind that follows an outage), or None."""
    key = (record.name, str(record.msg))
    if key in _CONNECTION:
        return "connection"
    if key in _BY_ERROR:
        args = record.args if isinstance(record.args, tuple) else ()
        for arg in args:
            if isinstance(arg, _CONNECTION_ERRORS) or (
                isinstance(arg, str) and any(w in arg for w in _CONNECTION_WORDS)
            ):
                return "connection"
        return "recovery"
    if key in _RECOVERY:
        return "recovery"
    return None


class BrokerLogFilter(logging.Filter):
    """Takes the aiokafka records about an absent or recovering broker out of the log
    and tells the attached watches; passes everything while no watch is attached, but
    aiokafka's unexpected fetch errors, which it bounds (`FETCH_ERROR_EVERY_S`) always.
    `clock`: seconds, only compared."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._watches: list[Listener] = []
        self._installed: list[logging.Logger] = []
        self._fetch_errors = LogLimit(FETCH_ERROR_EVERY_S, clock)

    def attach(self, watch: Listener) -> None:
        if watch not in self._watches:
            self._watches.append(watch)

    def detach(self, watch: Listener) -> None:
        with contextlib.suppress(ValueError):
            self._watches.remove(watch)

    def install(self, names: Iterable[str] = AIOKAFKA_LOGGERS) -> None:
        """On the named loggers and every aiokafka logger that exists; idempotent."""
        existing = [n for n in list(logging.Logger.manager.loggerDict) if n.startswith("aiokafka.")]
        for name in dict.fromkeys([*names, *existing]):
            log = logging.getLogger(name)
            if self not in log.filters:
                log.addFilter(self)
                self._installed.append(log)

    def uninstall(self) -> None:
        for log in self._installed:
            log.removeFilter(self)
        self._installed.clear()

    def filter(self, record: logging.LogRecord) -> bool:
        if (record.name, str(record.msg)) == _UNEXPECTED:
            return self._fetch_error(record)
        if not self._watches:
            return True
        kind = classify(record)
        if kind is None:
            return True
        try:
            message = record.getMessage()
        except Exception:
            message = str(record.msg)
        keep = True
        for watch in list(self._watches):
            if not watch.heard(kind, message, str(record.msg)):
                keep = False
        return keep

    def _fetch_error(self, record: logging.LogRecord) -> bool:
        """Whether aiokafka's record of a fetch answered with an error it has no branch
        for passes (the first of its error, then one a minute), made to say what it means."""
        args = record.args if isinstance(record.args, tuple) else ()
        error = str(args[0]) if args else "?"
        more = self._fetch_errors.check(error)
        if more is None:
            return False
        record.msg = (
            "Unexpected error while fetching data: %s: the broker answered a partition's "
            "fetch with it (aiokafka names none, and fetches it again at once). A partition "
            "whose fetches all fail so stops the node after %.0f s, naming it; look at the "
            "partition leader's log%s"
        )
        record.args = (error, STALL_S, more)
        return True


_FILTER = BrokerLogFilter()


def log_filter() -> BrokerLogFilter:
    """The process's filter (the one `BrokerWatch` attaches to by default)."""
    return _FILTER


def install_log_filter() -> BrokerLogFilter:
    """Puts the process's filter on the aiokafka loggers (the worker's logging setup does,
    before any client starts): until a watch is attached it mutes nothing but the
    repeats of aiokafka's "Unexpected error while fetching data" (one a minute)."""
    _FILTER.install()
    return _FILTER


# --------------------------------------------------------------------------- probe
