"""TimerLoop: runs a TimerRunner's rounds, each at the time the last one said is next."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from app.log_limit import LogLimit
from app.timers.runner.ports import Clock
from app.timers.runner.runner import RoundStats, TimerRunner

__all__ = ["FAILED_ROUND_RETRY_MS", "Clock", "TimerLoop"]

logger = logging.getLogger(__name__)


_FAILING_AFTER = 3

FAILED_ROUND_RETRY_MS = 1_000
"""The longest wait for the next round after a failed one."""


class TimerLoop:
    """Runs the runner's rounds until stopped: the next one at the next known due time, the
    poll interval at the latest, or at once after `wake()` (a put made a timer due sooner)."""

    def __init__(
        self,
        runner: TimerRunner,
        on_round: Callable[[RoundStats], None] | None = None,
        *,
        log_limit: LogLimit | None = None,
    ) -> None:
        self._runner = runner
        self._clock = runner.clock
        self._options = runner.options
        self._wake = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self.rounds = 0
        self.failures_in_a_row = 0
        # Outcome batches that failed to write, in a row (`RoundStats.write_failures`):
        # counted apart, since the rounds between (a lapsed claim sent again) write none.
        self.write_failures_in_a_row = 0
        # Until when a round that writes nothing does not say the writes passed
        # (`writes_passed`): a claim's and a send's timeouts after the last that failed,
        # or after the loop began (a retake's first rounds, the fault perhaps still there).
        self.writes_unsure_until = self._clock.now() + self._writes_unsure_ms()
        self._on_round = on_round
        # A round failing for as long as its store does: a traceback a second, otherwise.
        # Per exception type, so that another fault meanwhile is logged in full at once.
        self._failure_log = log_limit or LogLimit()
        # Set by the runner when a send's outcome is in: written by the next round, at once.
        self._answered = runner.answered

    @property
    def failing(self) -> bool:
        """Whether its last rounds all failed, or its last outcome writes: the timers it
        serves do not fire, or fire and never settle."""
        return max(self.failures_in_a_row, self.write_failures_in_a_row) >= _FAILING_AFTER

    def writes_passed(self, stats: RoundStats) -> bool:
        """Whether a round with no outcome write failing (`stats`) says the outcome writes
        pass: it wrote one, or a claim's and a send's timeouts went by since the last failed
        (every claim that write left lapsed since, was sent again and its outcome written,
        or it failed again; a partition whose timers were cancelled since writes none, and
        is not left failing for good)."""
        return stats.written > 0 or self._clock.now() >= self.writes_unsure_until

    def _writes_unsure_ms(self) -> int:
        return self._options.claim_timeout + self._options.send_timeout

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def wake(self, *, reload: bool = True) -> None:
        """Runs the next round now rather than at its planned time; `reload`: the store
        changed in ways the runner was not told (`TimerRunner.offer`), so it loads again."""
        if reload:
            self._runner.invalidate()
        self._wake.set()

    def start(self) -> None:
        if self.running:
            return
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name="timer loop")

    async def stop(self) -> None:
        """Ends the loop after the round in progress. To cut its sends short, stop the
        runner's partitions first (`TimerRunner.stop_all`), as a hand-off does."""
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            await self._task
            self._task = None

    async def round(self) -> RoundStats:
        """One round, its sends not waited for. A node's loop runs the runner's `round()`
        instead, committing its claims before their commands leave."""
        return await self._runner.run_round(wait=False)

    async def _run(self) -> None:
        while not self._stopping:
            # Cleared before the round, so that a wake-up during it is not lost.
            self._wake.clear()
            self._answered.clear()
            stats: RoundStats | None
            try:
                stats = await self.round()
                self.failures_in_a_row = 0
                if stats.write_failures:
                    self.write_failures_in_a_row += 1
                    self.writes_unsure_until = self._clock.now() + self._writes_unsure_ms()
                elif self.writes_passed(stats):
                    self.write_failures_in_a_row = 0
            except Exception as exc:
                self.failures_in_a_row += 1
                if (more := self._failure_log.check(type(exc))) is not None:
                    logger.exception(
                        "timer round failed; trying again after the poll interval%s", more
                    )
                stats = None
            self.rounds += 1
            if stats is not None and self._on_round is not None:
                try:
                    self._on_round(stats)
                except Exception:  # an observer's fault (its metrics) never stops firing
                    logger.exception("a timer round's observer failed")
            if not self._stopping:
                await self._wait(self._next_round_at(stats))

    def _next_round_at(self, stats: RoundStats | None) -> int:
        now = self._clock.now()
        if stats is not None and stats.full:
            return now
        # After a failed round (no stats), within a second: however long the poll, a fault
        # that passed holds no timer longer.
        poll = self._options.poll_interval_ms
        at = now + (poll if stats is not None else min(poll, FAILED_ROUND_RETRY_MS))
        if stats is not None:
            for t in (stats.next_due, stats.reload_at):
                if t is not None:
                    at = min(at, t)
        return at

    async def _wait(self, until: int) -> None:
        if until <= self._clock.now() or self._wake.is_set() or self._answered.is_set():
            await asyncio.sleep(0)  # let other tasks run between back-to-back rounds
            return
        waiting = {
            asyncio.ensure_future(self._clock.sleep_until(until)),
            asyncio.ensure_future(self._wake.wait()),
            asyncio.ensure_future(self._answered.wait()),
        }
        try:
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiting:
                waiter.cancel()
