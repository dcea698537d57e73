"""The operator page's failure ledger (`ledger_rows`): its newest entries, bounded.

Every node follows its contexts' ledgers whole, and an entry names up to `MAX_NAMED`
timers: rendered whole, a ledger of thousands of parked targets made a page of megabytes
on every load. The page shows the `LEDGER_ROWS` entries written last, each with its first
`NAMES_SHOWN` names, and counts the rest. `GET /ledger` lists the newest `limit` whole
(`ledger_json`: 1,000 unless asked, `LEDGER_LIMIT_MAX` at most, a body of tens of MiB
at worst, never the whole of a flooded ledger), with how many it left; `tickwheel timers
ledger` lists them all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol, runtime_checkable

from tables.ledger import FailureLedger, LedgerEntry

__all__ = [
    "LEDGER_LIMIT",
    "LEDGER_LIMIT_MAX",
    "LEDGER_ROWS",
    "NAMES_SHOWN",
    "LedgerRow",
    "LedgerRows",
    "ledger_json",
    "ledger_rows",
]

LEDGER_ROWS: Final = 50
"""Ledger entries the page shows, the newest first."""

NAMES_SHOWN: Final = 10
"""Timer names shown per entry (the others counted)."""

LEDGER_LIMIT: Final = 1_000
"""Entries `GET /ledger` lists unless asked for another number."""

LEDGER_LIMIT_MAX: Final = 10_000
"""Entries `GET /ledger` lists at most."""


@runtime_checkable
class DatedLedger(Protocol):
    """A ledger that tells when each entry was written (`KafkaFailureLedger.dated`), its
    newest `limit` alone when asked, and how many it holds."""

    async def dated(self, limit: int | None = None) -> list[tuple[int, LedgerEntry]]: ...

    @property
    def open_entries(self) -> int: ...


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
    held = 0
    for ledger in ledgers:
        if isinstance(ledger, DatedLedger):
            # Its newest `limit` alone: the newest `limit` of all are among those, and a
            # ledger of every parked target is not sorted whole at each view.
            held += ledger.open_entries
            dated += await ledger.dated(limit)
        else:
            listed = await ledger.entries()
            held += len(listed)
            dated += [(0, e) for e in reversed(listed)]
    dated.sort(key=lambda d: d[0], reverse=True)  # stable: each ledger's order kept in ties
    rows = []
    for _, entry in dated[:limit]:
        name = entry.target.type_name
        # The ledger names the target, not the owner type of the parked timers: the
        # operator picks it (the target's own type first, the usual case).
        default = name if name in types or not types else types[0]
        shown = entry.timers[:names]
        rows.append(LedgerRow(entry, list(types), default, shown, len(entry.timers) - len(shown)))
    return LedgerRows(rows, max(0, held - limit))


async def ledger_json(
    ledgers: Sequence[FailureLedger], params: Mapping[str, str]
) -> tuple[int, dict[str, object]]:
    """`GET /ledger`'s status and body: the newest `limit` open entries, whole (every named
    timer), and how many older ones it left (`more`); 400 naming what is wrong with the
    query (`limit` alone is known)."""
    unknown = sorted(set(params) - {"limit"})
    if unknown:
        why = f"unknown parameter {unknown[0]!r}: only limit is known"
        return 400, {"error": why, "field": unknown[0]}
    limit, text = LEDGER_LIMIT, params.get("limit")
    if text is not None:
        limit = int(text) if text.isascii() and text.isdigit() and len(text) < 7 else 0
        if not 1 <= limit <= LEDGER_LIMIT_MAX:
            why = f"limit: a whole number from 1 to {LEDGER_LIMIT_MAX}"
            return 400, {"error": why, "field": "limit"}
    found = await ledger_rows(ledgers, [], limit=limit, names=0)
    entries = [r.entry.model_dump(mode="json") for r in found.rows]
    return 200, {"entries": entries, "more": found.more}
