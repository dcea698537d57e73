"""The ledger entries changed by another's hand and not looked at yet (`LedgerChanges`):
`KafkaFailureLedger.changed`, which `app.node.parked_names` answers."""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from app.timers.ledger_view import LedgerKey

__all__ = ["LedgerChanges"]


class LedgerChanges:
    """The pairs whose entries changed, each once, with when its first change not looked
    at yet was taken (the loop's clock), the oldest first.

    A queue of every change held one item per record another node wrote (tens of
    thousands in a burst of parks elsewhere) while its reader looked at one target at a
    time; the look at a target answers every change of it taken before, so the changes of
    a pair wait as one: what is held is bounded by the ledger's pairs, not its records.
    """

    def __init__(self) -> None:
        self._pending: OrderedDict[LedgerKey, float] = OrderedDict()
        self._some = asyncio.Event()

    def put(self, key: LedgerKey, taken: float) -> None:
        """A change of `key` taken at `taken`: held behind the others, unless one of it
        waits already (its place and time kept: the look it waits for answers this too)."""
        self._pending.setdefault(key, taken)
        self._some.set()

    async def first(self) -> tuple[LedgerKey, float]:
        """The oldest pair waiting and when its first change was taken, once there is one;
        it stays until `take`n, and changes of it taken meanwhile join it."""
        while not self._pending:
            self._some.clear()
            await self._some.wait()
        return next(iter(self._pending.items()))

    def take(self, key: LedgerKey) -> None:
        """`key`'s changes so far are being answered: the next one waits anew."""
        self._pending.pop(key, None)

    def qsize(self) -> int:
        """How many pairs wait."""
        return len(self._pending)
