"""Notices that the process was stopped (SIGSTOP, a paused VM) longer than the group's
session timeout: the group has given its partitions to others meanwhile, so until the
group answers again (its next assignment) the node does not know what it owns."""

from __future__ import annotations

import asyncio
import logging
import time

__all__ = ["SuspensionWatch"]

logger = logging.getLogger(__name__)


class SuspensionWatch:
    def __init__(self, session_timeout_ms: int, tick_s: float = 0.1) -> None:
        self._limit = session_timeout_ms / 1000
        self._tick = tick_s
        # None until `run` starts: a slow start (restores, topic creation) is no stop.
        self._ticked: float | None = None
        self._suspended: float | None = None

    def suspended(self) -> float | None:
        """How long the process was last stopped, while the group has not answered since;
        read on waking even before the watch itself ran."""
        if self._ticked is not None and (gap := time.monotonic() - self._ticked) > self._limit:
            self._suspended = gap
        return self._suspended

    def group_answered(self) -> None:
        self._suspended = None

    async def run(self) -> None:
        self._ticked = time.monotonic()
        while True:
            await asyncio.sleep(self._tick)
            gap = time.monotonic() - self._ticked
            if gap > self._limit:
                self._suspended = gap
                logger.warning("stopped for %.1f s: not ready until the group answers", gap)
            self._ticked = time.monotonic()
