"""Notices that the process was stopped (SIGSTOP, a paused VM) longer than the group's
session timeout: the group may have given its partitions to others meanwhile, so until the
group answers again (its next assignment) the node does not know what it owns. The broker
may also not have expired the member (it checks sessions lazily, and the first heartbeat
after waking renews one it has not expired yet): then no rebalance ever comes. A member
expelled or in a rebalance hears so at its next heartbeat (a quarter of the session
timeout, the answer within the client's request timeout: aiokafka's 40 s, a dead
connection's) and begins to rejoin (its partitions revoked); so `CONFIRM_S` (or three
session timeouts, if longer) after waking with no rebalance begun, the node is still the
member it was, owning what it owned, and ready again."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

__all__ = ["CONFIRM_S", "SuspensionWatch"]

CONFIRM_S = 45.0
"""How long after waking a rebalance may still begin: a heartbeat's request timeout (the
group consumer's, aiokafka's default 40 s) and an interval more."""

logger = logging.getLogger(__name__)


class SuspensionWatch:
    def __init__(
        self,
        session_timeout_ms: int,
        tick_s: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._limit = session_timeout_ms / 1000
        self._confirm = max(3 * self._limit, CONFIRM_S)
        self._tick = tick_s
        self._clock = clock
        # None until `run` starts: a slow start (restores, topic creation) is no stop.
        self._ticked: float | None = None
        self._suspended: float | None = None
        # When the process last woke from such a stop.
        self._woke: float | None = None
        # Whether the group began a rebalance since it woke (then only its answer ends it).
        self._rebalancing = False

    def suspended(self) -> float | None:
        """How long the process was last stopped, while the group has not answered since
        (nor stayed quiet long enough after); read on waking even before the
        watch itself ran."""
        now = self._clock()
        if self._ticked is not None and now - self._ticked > self._limit:
            self._stopped(now)
        elif (
            self._suspended is not None
            and self._woke is not None
            and not self._rebalancing
            and now - self._woke > self._confirm
        ):
            logger.info("no rebalance %.0f s after waking: still the group's member", self._confirm)
            self._suspended = None
        return self._suspended

    def group_rebalancing(self) -> None:
        """The group began a rebalance (took partitions away): wait for its answer."""
        if self._suspended is not None:
            self._rebalancing = True

    def group_answered(self) -> None:
        self._suspended = None
        self._rebalancing = False

    def _stopped(self, now: float) -> None:
        assert self._ticked is not None
        if self._woke is None or self._woke < self._ticked:
            self._rebalancing = False  # a new stop (not this one read again before a tick)
        self._suspended = now - self._ticked
        self._woke = now

    def observe(self) -> None:
        """One tick of the watch: a gap since the last one longer than the session timeout
        was a stop."""
        now = self._clock()
        if self._ticked is not None and now - self._ticked > self._limit:
            self._stopped(now)
            logger.warning(
                "stopped for %.1f s: not ready until the group answers, or a session timeout "
                "passes with no rebalance begun",
                self._suspended,
            )
        self._ticked = now

    async def run(self) -> None:
        self._ticked = self._clock()
        while True:
            await asyncio.sleep(self._tick)
            self.observe()
