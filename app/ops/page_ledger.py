"""The operator page's failure ledger (`ledger_rows`): its newest entries, bounded.

Every node follows its contexts' ledgers whole, and an entry names up to `MAX_NAMED`
timers: rendered whole, a ledger of thousands of parked targets made a page of megabytes
on every load. The page shows the `LEDGER_ROWS` entries written last, each with its first
`NAMES_SHOWN` names, and counts the rest; `tickwheel timers ledger` and `GET /ledger` list
them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Protocol, runtime_checkable

from tables.ledger import FailureLedger, LedgerEntry

__all__ = ["LEDGER_ROWS", "NAMES_SHOWN", "LedgerRow", "LedgerRows", "ledger_rows"]

LEDGER_ROWS: Final = 50
"""Ledger entries the page shows, the newest first."""

NAMES_SHOWN: Final = 10
"""Timer names shown per entry (the others counted)."""


@runtime_checkable
class DatedLedger(Protocol):
    """A ledger that tells when each entry was written (`KafkaFailureLedger.dated`)."""

    async def dated(self) -> list[tuple[int, LedgerEntry]]: ...


@dataclass(frozen=True)
class LedgerRow:
    entry: LedgerEntry
    types: list[str]
    default_type: str
    names: tuple[str, ...]
    """The first `NAMES_SHOWN` of the entry's timers."""
    more_names: int
    """How many of its named timers are not shown."""


@dataclass(frozen=True)
class LedgerRows:
    rows: list[LedgerRow]
    more: int
    """How many open entries are not shown (older than those shown)."""


async def ledger_rows(
    ledgers: Sequence[FailureLedger],
    types: Sequence[str],
    *,
    limit: int = LEDGER_ROWS,
    names: int = NAMES_SHOWN,
) -> LedgerRows:
    """The newest `limit` open entries of `ledgers` (a ledger that does not tell when its
    entries were written lists its own newest last, as the memory one does), each with
    the owner types to pick for its Retry and Skip."""
    dated: list[tuple[int, LedgerEntry]] = []
    for ledger in ledgers:
        if isinstance(ledger, DatedLedger):
            dated += await ledger.dated()
        else:
            dated += [(0, e) for e in reversed(await ledger.entries())]
    dated.sort(key=lambda d: d[0], reverse=True)  # stable: each ledger's order kept in ties
    rows = []
    for _, entry in dated[:limit]:
        name = entry.target.type_name
        # The ledger names the target, not the owner type of the parked timers: the
        # operator picks it (the target's own type first, the usual case).
        default = name if name in types or not types else types[0]
        shown = entry.timers[:names]
        rows.append(LedgerRow(entry, list(types), default, shown, len(entry.timers) - len(shown)))
    return LedgerRows(rows, max(0, len(dated) - limit))
