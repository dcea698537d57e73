"""Whether the broker answers: one clear line when it stops, one when it is back.

While the broker is away the client library (aiokafka) retries, and logs every retry:
hundreds of `Unable connect to node with id 1` and `Unable to update metadata` lines a
second, at ERROR. A `BrokerWatch` turns that into what an operator needs:

- a `logging.Filter` on the aiokafka loggers (`BrokerLogFilter`) takes those records out
  of the log and hands them to the watch as a hint that the broker may be gone;
- a probe, every `interval` s (every `down_interval` s while the broker is away or a hint
  came in), sends an ApiVersions request to each bootstrap address and waits `timeout` s
  for the answer: a refused connection, or one that is accepted but never answered (a
  frozen or wedged broker: the kernel accepts for it), is a failure;
- the broker is *unreachable* after `failures_to_down` failed probes in a row, or after
  one when the client library's errors agree; it is *reachable* again as soon as a probe
  is answered. Each change is logged once: a WARNING with the address and the reason
  when it goes, an INFO with how long it was gone (and how many client library lines
  were muted meanwhile) when it is back.

Client library records are muted only while some watch listens (`BrokerWatch.start`):
connection errors always (while the broker answers they are summed up in one WARNING a
minute, so a client that cannot talk to a broker that answers probes is never silent);
the retries that follow an outage (`NotLeaderForPartitionError`, `NotEnoughReplicas`,
coordinator moves, a lost group membership) only while the broker is away and for
`settle` s after it is back; while it answers, one line of each kind every
`retry_line_every` s (a partition short of in-sync replicas for minutes is retried ~100
times a second), with how many like it were muted. Everything else passes untouched.

`status()` is for `/healthz`; `tickwheel_broker_reachable`, `tickwheel_broker_outages_total`
and `tickwheel_broker_outage_seconds_total` are on the registry given.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from app.kafka.connection import Connectable, connection
from app.kafka.log_filter import (
    AIOKAFKA_LOGGERS,
    BrokerLogFilter,
    Kind,
    classify,
    install_log_filter,
)
from app.kafka.log_filter import log_filter as shared_filter
from app.kafka.probe import Probe, api_versions_probe

__all__ = [
    "AIOKAFKA_LOGGERS",
    "BrokerLogFilter",
    "BrokerWatch",
    "Probe",
    "api_versions_probe",
    "classify",
    "install_log_filter",
]

logger = logging.getLogger(__name__)


class BrokerWatch:
    """Whether the broker at `bootstrap` answers; see the module's doc.

    `probe` (by default `api_versions_probe`) and `clock` (monotonic seconds) are
    replaceable for tests; `check()` runs one probe and applies its verdict.
    """

    def __init__(
        self,
        bootstrap: Connectable,
        *,
        registry: CollectorRegistry | None = None,
        probe: Probe | None = None,
        clock: Callable[[], float] = time.monotonic,
        interval: float = 5.0,
        down_interval: float = 1.0,
        timeout: float = 2.0,
        failures_to_down: int = 2,
        settle: float = 30.0,
        summary_every: float = 60.0,
        log_filter: BrokerLogFilter | None = None,
        retry_line_every: float = 10.0,
        probe_within: float = 10.0,
    ) -> None:
        self.bootstrap = connection(bootstrap).bootstrap_servers  # said in logs and /healthz
        self._probe: Probe = probe or (lambda: api_versions_probe(bootstrap, timeout))
        # A probe bounded here too (`probe_within` s, at least its own `timeout` for each
        # address it tries in turn): one that never answered froze the verdict for good.
        addresses = len(self.bootstrap.split(","))
        self._probe_within = max(probe_within, timeout * addresses + 1.0)
        self._clock = clock
        self.interval = interval
        self.down_interval = down_interval
        self.failures_to_down = max(1, failures_to_down)
        self.settle = settle
        self.summary_every = summary_every
        self.retry_line_every = retry_line_every
        # Per retry record's format string: when one last passed, and how many since not.
        self._retries: dict[str, tuple[float, int]] = {}
        self._filter = log_filter if log_filter is not None else shared_filter()
        self.reachable = True
        self.down_since: float | None = None
        self.reason: str | None = None
        self.outages = 0
        self.muted = 0
        """Client library records muted in the current (or last) outage."""
        self._failures = 0
        self._failing_since = 0.0  # when the first failed probe of the streak began
        self._settle_until = float("-inf")
        # Connection errors heard while the broker was believed reachable, not yet told.
        self._heard: str | None = None
        self._heard_count = 0
        self._heard_at = 0.0
        self._summarized_at = float("-inf")
        self._accounted = 0.0
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.RLock()
        registry = registry if registry is not None else CollectorRegistry()
        self._up_gauge = Gauge(
            "tickwheel_broker_reachable",
            "1 while the broker answers this node's probes, 0 while it does not",
            registry=registry,
        )
        self._outage_counter = Counter(
            "tickwheel_broker_outages",
            "Times the broker stopped answering this node",
            registry=registry,
        )
        self._outage_seconds = Counter(
            "tickwheel_broker_outage_seconds",
            "Seconds the broker did not answer this node, in all",
            registry=registry,
        )
        self._up_gauge.set(1)

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Attaches to the log filter (installing it) and starts probing."""
        if self._task is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._filter.install()
        self._filter.attach(self)
        self._task = asyncio.create_task(self._run(), name="broker watch")

    @property
    def task(self) -> asyncio.Task[None] | None:
        """Its probing, from `start` to `stop` (ends only with `stop`, or by a bug)."""
        return self._task

    async def stop(self) -> None:
        self._filter.detach(self)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        assert self._wake is not None and self._loop is not None
        while True:
            began = self._loop.time()  # pacing in real time, whatever the state's clock
            self._wake.clear()
            try:
                await self.check()
            except Exception:  # a probe must never end the watch
                logger.exception("broker probe failed")
            quick = not self.reachable or self._failures > 0
            wait = self.down_interval if quick else self.interval
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()
            # Woken by a hint: probe now, but not more often than every down_interval.
            rest = self.down_interval - (self._loop.time() - began)
            if rest > 0:
                await asyncio.sleep(rest)

    # ----------------------------------------------------------------- state

    async def check(self) -> bool:
        """Probes once and applies the verdict; whether the broker is reachable now."""
        started = self._clock()
        try:
            async with asyncio.timeout(self._probe_within):
                failure = await self._probe()
        except TimeoutError:
            failure = f"the probe did not answer within {self._probe_within:.0f} s"
        with self._lock:
            if failure is None:
                self._answered(self._clock(), started)
            else:
                self._failed(self._clock(), started, failure)
            return self.reachable

    def _failed(self, now: float, started: float, failure: str) -> None:
        self._failures += 1
        if self._failures == 1:
            self._failing_since = started
        if not self.reachable:
            self._account(now)
            self.reason = failure
            return
        if self._failures < self.failures_to_down and self._heard is None:
            return
        self.reachable = False
        # Gone since the first probe it did not answer.
        self.down_since = self._accounted = min(self._failing_since, now)
        self._account(now)
        self.reason = failure
        self.outages += 1
        self.muted = self._heard_count
        self._up_gauge.set(0)
        self._outage_counter.inc()
        client = f" (client library: {self._heard})" if self._heard else ""
        self._heard, self._heard_count = None, 0
        logger.warning(
            "broker %s unreachable: %s%s; no answer for %.1f s; its client library errors "
            "are muted until it answers again (probing every %g s)",
            self.bootstrap,
            failure,
            client,
            now - self.down_since,
            self.down_interval,
        )

    def _answered(self, now: float, started: float) -> None:
        self._failures = 0
        if not self.reachable:
            assert self.down_since is not None
            self._account(now)
            gone = now - self.down_since
            self.reachable = True
            self.down_since = None
            self.reason = None
            self._settle_until = now + self.settle
            self._up_gauge.set(1)
            logger.info(
                "broker %s answers again, after %.1f s unreachable (%d client library "
                "line(s) muted)",
                self.bootstrap,
                gone,
                self.muted,
            )
            self._heard, self._heard_count = None, 0
            return
        if self._heard is None or self._heard_at > started:
            return
        if now < self._settle_until:  # the tail of an outage: part of it
            self.muted += self._heard_count
            self._heard, self._heard_count = None, 0
            return
        if now - self._summarized_at >= self.summary_every:
            self._summarized_at = now
            logger.warning(
                "broker %s answers, but its client library reported %d connection error(s) "
                "meanwhile, e.g. %s",
                self.bootstrap,
                self._heard_count,
                self._heard,
            )
            self._heard, self._heard_count = None, 0

    def _account(self, now: float) -> None:
        if now > self._accounted:
            self._outage_seconds.inc(now - self._accounted)
            self._accounted = now

    def heard(self, kind: Kind, message: str, template: str = "") -> bool:
        """The log filter's report of a client library record; whether it stays in the log."""
        with self._lock:
            now = self._clock()
            if not self.reachable:
                self.muted += 1
                return False
            if kind == "recovery":
                if now < self._settle_until:
                    self.muted += 1
                    return False
                return self._retry_passes(template or message, now)
            if self._heard is None:
                self._heard, self._heard_at = message, now
            self._heard_count += 1
        self._poke()
        return False

    def _retry_passes(self, template: str, now: float) -> bool:
        """One retry line of each kind every `retry_line_every` s, the first after muted
        ones preceded by how many were."""
        passed_at, muted = self._retries.get(template, (float("-inf"), 0))
        if now - passed_at < self.retry_line_every:
            self._retries[template] = (passed_at, muted + 1)
            return False
        if len(self._retries) > 256:  # format strings are few: a bound all the same
            self._retries.clear()
        self._retries[template] = (now, 0)
        if muted:
            logger.warning(
                "%d client library retry line(s) like the next one muted in the last %.0f s",
                muted,
                now - passed_at,
            )
        return True

    def _poke(self) -> None:
        """Probe soon: the client library says the broker may be gone."""
        loop, wake = self._loop, self._wake
        if loop is None or wake is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            wake.set()
        else:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(wake.set)

    def status(self) -> dict[str, Any]:
        """For `/healthz`: reachable, and while not, since when (s ago) and why."""
        body: dict[str, Any] = {
            "address": self.bootstrap,
            "reachable": self.reachable,
            "outages": self.outages,
        }
        if self.down_since is not None:
            body["down_for_s"] = round(max(0.0, self._clock() - self.down_since), 1)
            body["reason"] = self.reason
        return body
