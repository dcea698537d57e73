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
from tables.timer import MAX_ERROR_TEXT, Timer

__all__ = ["FailureLedger", "LedgerEntry", "MemoryFailureLedger", "merged"]

logger = logging.getLogger(__name__)


def _absent(value: object) -> bool:
    return value is None


class LedgerEntry(BaseModel):
    """A parked target, and the timers (by request id, `<id>#<slot>`) parked on it.

    `error_code` and `error_text`: why the latest park recorded was made, the parked row's
    last attempt's error (`Timer.error_code`, `Timer.error_text`); left out of the JSON
    while unset, so entries without them read and are written as before they existed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    subscription: str = Field(min_length=1)
    target: AggregateRef
    timers: tuple[str, ...] = ()
    error_code: str | None = Field(default=None, min_length=1, max_length=100, exclude_if=_absent)
    error_text: str | None = Field(
        default=None, min_length=1, max_length=MAX_ERROR_TEXT, exclude_if=_absent
    )


def merged(
    known: LedgerEntry | None, subscription: str, target: AggregateRef, timers: Sequence[Timer]
) -> LedgerEntry:
    """The entry after parking `timers`: the known one's timers, then the new ones, each
    once; the error of the last of them that has one, else the known entry's."""
    ids = list(known.timers) if known is not None else []
    for timer in timers:
        if timer.request_id not in ids:
            ids.append(timer.request_id)
    error: Timer | LedgerEntry | None = next(
        (t for t in reversed(timers) if t.error_code is not None), known
    )
    return LedgerEntry(
        subscription=subscription,
        target=target,
        timers=tuple(ids),
        error_code=None if error is None else error.error_code,
        error_text=None if error is None else error.error_text,
    )


class FailureLedger(Protocol):
    async def record(
        self, subscription: str, target: AggregateRef, timers: Sequence[Timer]
    ) -> None:
        """Adds `timers` to the entry of `(subscription, target)`; raises if not recorded."""
        ...

    async def resolve(self, subscription: str, target: AggregateRef) -> bool:
        """Removes the entry; whether there was one."""
        ...

    async def entry(self, subscription: str, target: AggregateRef) -> LedgerEntry | None:
        """The open entry of `(subscription, target)`, if there is one."""
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
            self._entries[key] = merged(self._entries.get(key), subscription, target, timers)
        logger.warning(
            "parked %d timer(s) of target %s under %s", len(timers), target, subscription
        )

    async def resolve(self, subscription: str, target: AggregateRef) -> bool:
        async with self._lock:
            return self._entries.pop((subscription, target), None) is not None

    async def entry(self, subscription: str, target: AggregateRef) -> LedgerEntry | None:
        async with self._lock:
            return self._entries.get((subscription, target))

    async def entries(self) -> list[LedgerEntry]:
        async with self._lock:
            return list(self._entries.values())
