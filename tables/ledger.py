"""The failure ledger: parked targets awaiting an operator's retry or skip.

One entry per `(subscription, target)`: the timers runner parks its timers under
`TimerOptions.PARKED_SUBSCRIPTION`, subscriptions under their own names. The Kafka-backed
ledger (a compacted topic keyed the same way) implements the same protocol.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Iterable, Sequence
from typing import Final, Protocol, runtime_checkable

import orjson
from pydantic import BaseModel, ConfigDict, Field

from tables.refs import AggregateRef
from tables.timer import MAX_ERROR_TEXT, Timer

__all__ = [
    "MAX_NAMED",
    "MAX_NAMED_BYTES",
    "CountedLedger",
    "FailureLedger",
    "LedgerEntry",
    "MemoryFailureLedger",
    "first_named",
    "merged",
]

logger = logging.getLogger(__name__)


MAX_NAMED: Final = 1_000
"""An entry names at most this many timers, in at most `MAX_NAMED_BYTES` of JSON: it stays
well under a Kafka record's 1 MB default however many timers its target parks (past it, a
park's write would fail, and with it every later park of the target)."""

MAX_NAMED_BYTES: Final = 256 * 1024
"""The JSON of an entry's names, at most (a name is ~230 bytes, more if not ASCII)."""


def _absent(value: object) -> bool:
    return value is None


def _false(value: object) -> bool:
    return value is False


class LedgerEntry(BaseModel):
    """A parked target, and the timers (by request id, `<id>#<slot>`) parked on it.

    `error_code` and `error_text`: why the latest park recorded was made, the parked row's
    last attempt's error (`Timer.error_code`, `Timer.error_text`); left out of the JSON
    while unset, so entries without them read and are written as before they existed.

    `truncated`: the target has more PARKED timers than the entry names (the first parked,
    `MAX_NAMED` and `MAX_NAMED_BYTES` at most); left out of the JSON while false. Retry
    and skip act on the store's PARKED rows, so they reach the timers not named too."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    subscription: str = Field(min_length=1)
    target: AggregateRef
    timers: tuple[str, ...] = ()
    error_code: str | None = Field(default=None, min_length=1, max_length=100, exclude_if=_absent)
    error_text: str | None = Field(
        default=None, min_length=1, max_length=MAX_ERROR_TEXT, exclude_if=_absent
    )
    truncated: bool = Field(default=False, exclude_if=_false)


def merged(
    known: LedgerEntry | None, subscription: str, target: AggregateRef, timers: Sequence[Timer]
) -> LedgerEntry:
    """The entry after parking `timers`: the known one's timers, then the new ones, each
    once, the first that fit (`MAX_NAMED`, `MAX_NAMED_BYTES`; `truncated` past them, and
    once it was); the error of the last of them that has one, else the known entry's."""
    # The known names within the bounds too: another writer's entry may name more (up to
    # what a record holds), and written back whole with ours it would outgrow the record.
    names = itertools.chain(
        known.timers if known is not None else (), (t.request_id for t in timers)
    )
    ids, cut = first_named(names)
    truncated = cut or (known is not None and known.truncated)
    error: Timer | LedgerEntry | None = next(
        (t for t in reversed(timers) if t.error_code is not None), known
    )
    return LedgerEntry(
        subscription=subscription,
        target=target,
        timers=ids,
        error_code=None if error is None else error.error_code,
        error_text=None if error is None else error.error_text,
        truncated=truncated,
    )


def first_named(
    names: Iterable[str], room: int | None = None, cost: int = 0
) -> tuple[tuple[str, ...], bool]:
    """The first of `names` that fit, each once: `MAX_NAMED` of them, their JSON within
    `MAX_NAMED_BYTES`, and, when `room` is given, within `room` counting each name as its
    JSON and `cost` (a reader's bound on what it holds in all); and whether any was left
    out."""
    ids: dict[str, None] = {}
    size = used = 0
    for name in names:
        if name in ids:
            continue
        json = _json_size(name)
        size += json
        if len(ids) >= MAX_NAMED or size > MAX_NAMED_BYTES:
            return tuple(ids), True
        if room is not None and used + json + cost > room:
            return tuple(ids), True
        used += json + cost
        ids[name] = None
    return tuple(ids), False


def _json_size(name: str) -> int:
    return len(orjson.dumps(name)) + 1  # and its comma


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


@runtime_checkable
class CountedLedger(Protocol):
    """A ledger that counts its open entries without listing them (a scrape reads it)."""

    @property
    def open_entries(self) -> int: ...


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

    @property
    def open_entries(self) -> int:
        return len(self._entries)
