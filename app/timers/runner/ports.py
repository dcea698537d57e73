"""What the runner talks to: a sender, a clock and the part of the store it uses.

Protocols only (and the wall clock), so that the runner and the loop can be driven by
fakes in tests and by Kafka and RocksDB in a node.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

from app.timers.runner.decisions import SendResult
from tables.census import TimerCensus
from tables.refs import AggregateRef
from tables.store import DueRow
from tables.timer import Timer, TimerChange

__all__ = ["CheckingSender", "Clock", "FiringStore", "Sender", "SystemClock"]

logger = logging.getLogger(__name__)


class Sender(Protocol):
    async def send(self, timer: Timer) -> SendResult:
        """Sends `timer.command` to `timer.target`, request id `timer.request_id`, not before
        `timer.slot_due_at`; the result code, or `SENT` for another context's topic.
        Raises when there is no transport: the runner counts that as a failed attempt."""
        ...


@runtime_checkable
class CheckingSender(Protocol):
    """A `Sender` whose send may wait before it hands its record over (for a listing of
    the cluster's topics, say): it asks `still` at that last moment."""

    async def send_if(self, timer: Timer, still: Callable[[], Awaitable[bool]]) -> SendResult:
        """As `send`, the record handed over only if `still()` (awaited in the step that
        hands it over) says the timer is still as claimed; `WITHDRAWN` otherwise."""
        ...


class Clock(Protocol):
    def now(self) -> int:
        """Epoch milliseconds."""
        ...

    async def sleep_until(self, t: int) -> None:
        """Returns once `now() >= t`; cancellable."""
        ...


class SystemClock:
    """The wall clock, for production wiring; tests hand the runner a fake one."""

    def now(self) -> int:
        return time.time_ns() // 1_000_000

    async def sleep_until(self, t: int) -> None:
        delay = t - self.now()
        if delay > 0:
            await asyncio.sleep(delay / 1000)


class FiringStore(Protocol):
    """The part of the TimerStore the runner uses."""

    async def due(self, partitions: set[int], until: int, limit: int) -> list[Timer]: ...

    async def due_rows(self, partitions: set[int], until: int, limit: int) -> list[DueRow]: ...

    async def firing(self, partitions: set[int], limit: int) -> list[Timer]: ...

    async def settle(self, changes: list[TimerChange]) -> int: ...

    async def find(self, owner: AggregateRef, key: str) -> Timer | None: ...

    async def parked(self, target: AggregateRef) -> list[Timer]: ...

    async def expire(self, partition: int, now: int, retention: int, limit: int) -> int: ...

    async def census(
        self, partition: int, now: int, *, limit: int = 100_000, parked_limit: int = 100
    ) -> TimerCensus: ...
