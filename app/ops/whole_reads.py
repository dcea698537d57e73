"""Reads of schedule logs whole on a node: a `GET /jobs?state=true` list's fold and a
backfill's plan, each seconds of CPU for a long log (kept for good) or a long range.

- One at a time (`Turns`), and a waiting backfill goes before any state fold not begun:
  the list needs no token, and a queue of lists had turned operators' backfills away
  (a 503 after their wait).
- State lists share folds (`StateFolds`): lists of the same contexts asked while one is
  folded are answered by it, and for `STATE_FRESH_MS` after it ended by its result, so
  any number of lists cost one fold every `STATE_FRESH_MS` at most. A write through the
  node's job routes forgets the kept results (`forget`): its own list reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

__all__ = ["STATE_FRESH_MS", "StateFolds", "Turns"]

T = TypeVar("T")

STATE_FRESH_MS = 2_000
"""How long after a state fold ended its result answers a list of the same contexts."""


class Turns:
    """One whole read at a time; the turn goes to a waiting backfill before a fold."""

    def __init__(self) -> None:
        self._busy = False
        self._backfills: deque[asyncio.Future[None]] = deque()
        self._folds: deque[asyncio.Future[None]] = deque()

    @property
    def backfill_waiting(self) -> bool:
        return bool(self._backfills)

    async def take(self, *, backfill: bool, wait_s: float) -> bool:
        """Whether the turn came within `wait_s` (then call `release` after the read)."""
        if not self._busy and not self._backfills and (backfill or not self._folds):
            self._busy = True
            return True
        queue = self._backfills if backfill else self._folds
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue.append(waiter)
        try:
            async with asyncio.timeout(wait_s):
                await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed the turn as it gave up: the next one's
            else:
                waiter.cancel()
                with contextlib.suppress(ValueError):
                    queue.remove(waiter)
            if isinstance(exc, TimeoutError):
                return False
            raise
        return True

    def release(self) -> None:
        for queue in (self._backfills, self._folds):
            while queue:
                waiter = queue.popleft()
                if not waiter.done():
                    waiter.set_result(None)  # handed over: still busy
                    return
        self._busy = False


class StateFolds(Generic[T]):
    """State folds by the contexts they read, shared, their results kept for
    `STATE_FRESH_MS` by `clock` (ms)."""

    def __init__(self, turns: Turns, clock: Callable[[], int]) -> None:
        self._turns = turns
        self._clock = clock
        self._running: dict[tuple[str, ...], asyncio.Task[T | None]] = {}
        self._kept: dict[tuple[str, ...], tuple[int, T]] = {}
        self._generation = 0

    def forget(self) -> None:
        """A write changed the logs: later lists fold them again (none joins a fold
        begun before, nor is answered by a kept result)."""
        self._generation += 1
        self._kept.clear()
        self._running.clear()

    async def get(
        self, contexts: tuple[str, ...], fold: Callable[[], Awaitable[T]], wait_s: float
    ) -> T | None:
        """The states of `contexts` by `fold`, or another list's; None when the fold's turn
        did not come within `wait_s`."""
        if (kept := self._kept.get(contexts)) is not None:
            ended, value = kept
            if 0 <= self._clock() - ended <= STATE_FRESH_MS:
                return value
        task = self._running.get(contexts)
        if task is None:
            task = asyncio.create_task(self._fold(contexts, fold, wait_s))
            # Every list asking may be gone (clients away): its failure is still retrieved.
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            self._running[contexts] = task
        # Shielded: a list whose client went away leaves the fold to the others.
        return await asyncio.shield(task)

    async def _fold(
        self, contexts: tuple[str, ...], fold: Callable[[], Awaitable[T]], wait_s: float
    ) -> T | None:
        generation = self._generation
        try:
            if not await self._turns.take(backfill=False, wait_s=wait_s):
                return None
            try:
                value = await fold()
            finally:
                self._turns.release()
            if generation == self._generation:
                self._kept[contexts] = (self._clock(), value)
            return value
        finally:
            if self._running.get(contexts) is asyncio.current_task():
                del self._running[contexts]
