"""The failure ledger: parked targets awaiting an operator's retry or skip.

One entry per `(subscription, target)`: the timers runner parks its timers under
`TimerOptions.PARKED_SUBSCRIPTION`, subscriptions under their own names. The Kafka-backed
ledger (a compacted topic keyed the same way) implements the same protocol.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from tables.refs import AggregateRef
from tables.timer import Timer

__all__ = ["FailureLedger", "LedgerEntry", "MemoryFailureLedger"]

logger = logging.getLogger(__name__)


class LedgerEntry(BaseModel):
    """A parked target, and the timers (by request id, `<id>#<slot>`) parked on it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    subscription: str = Field(min_length=1)
    target: AggregateRef
    timers: tuple[str, ...] = ()


class FailureLedger(Protocol):
    async def record(
        self, subscription: str, target: AggregateRef, timers: Sequence[Timer]
    ) -> None:
        """Adds `timers` to the entry of `(subscription, target)`; raises if not recorded."""
        ...

    async def resolve(self, subscription: str, target: AggregateRef) -> bool:
        """Removes the entry; whether there was one."""
        ...

    async def entries(self) -> list[LedgerEntry]:
        """Every open entry."""
        ...


class MemoryFailureLedger:
    """The ledger in a dict: for tests and for a single node that keeps nothing."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, AggregateRef], LedgerEntry] = {}
        # The protocol is async because real ledgers do I/O; a lock keeps the
        # read-modify-write of an entry whole should an implementation ever await inside it.
        self._lock = asyncio.Lock()

    async def record(
        self, subscription: str, target: AggregateRef, timers: Sequence[Timer]
    ) -> None:
        async with self._lock:
            key = (subscription, target)
            known = self._entries.get(key)
            ids = list(known.timers) if known else []
            ids.extend(t.request_id for t in timers if t.request_id not in ids)
            self._entries[key] = LedgerEntry(
                subscription=subscription, target=target, timers=tuple(ids)
            )
        logger.warning(
            "parked %d timer(s) of target %s under %s", len(timers), target, subscription
        )

    async def resolve(self, subscription: str, target: AggregateRef) -> bool:
        async with self._lock:
            return self._entries.pop((subscription, target), None) is not None

    async def entries(self) -> list[LedgerEntry]:
        async with self._lock:
            return list(self._entries.values())
