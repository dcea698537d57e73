"""The gauges a scrape sets from the timer stores, the runners and the ledgers
(`refresh_gauges`, run by `NodeMetrics.refresh` before each scrape): the timers of each
partition shown (fired, or taken here and restored), each type's backlog and its oldest,
and the open ledger entries of each context."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Final, Protocol

from app.node.metric_parts import RestoreGauges
from tables import StoreClosed, StoreError, TimerStatus
from tables.ledger import CountedLedger, FailureLedger
from tables.store import DueRow

if TYPE_CHECKING:
    from app.node.metrics import NodeMetrics

__all__ = ["HELD_BACKLOG_LIMIT", "TimerSource", "refresh_gauges"]

logger = logging.getLogger("app.node.metrics")

_STATUSES = (TimerStatus.PENDING, TimerStatus.FIRING, TimerStatus.PARKED, TimerStatus.PAUSED)

HELD_BACKLOG_LIMIT: Final = 1_000
"""Due rows a scrape reads of a type's held partitions (one scan): a lower bound past it, as
a wheel's load is for the fired ones."""


class _Store(Protocol):
    @property
    def assigned(self) -> frozenset[int]: ...

    def status_counts(self, partition: int) -> dict[TimerStatus, int]: ...

    async def due_rows(self, partitions: set[int], until: int, limit: int) -> list[DueRow]: ...


class _Runner(Protocol):
    @property
    def partitions(self) -> frozenset[int]: ...

    def backlog(self, now: int) -> tuple[int, int | None]: ...


TimerSource = tuple[str, _Store, _Runner]
"""What a scrape reads of one aggregate type: its name, timer store and runner."""


def _shown(
    taken_here: Mapping[tuple[str, int], RestoreGauges], name: str, store: _Store, runner: _Runner
) -> frozenset[int]:
    """The partitions of `name` whose timers a scrape shows: those fired, and those
    taken here whose restore is done (a held one: not fired, its timers still due);
    `taken_here`: the restore gauges of the partitions taken here (`NodeMetrics`')."""
    taken = {p for (t, p), gauges in taken_here.items() if t == name and gauges.done}
    return (runner.partitions | taken) & store.assigned


async def refresh_gauges(
    metrics: NodeMetrics,
    taken_here: Mapping[tuple[str, int], RestoreGauges],
    now_ms: int,
    sources: Iterable[TimerSource],
    ledgers: Mapping[str, FailureLedger],
) -> None:
    """Sets the gauges read from the stores, runners and ledgers: O(owned partitions)
    plus each runner's wheel, and one due scan of a type's held partitions, bounded
    (`HELD_BACKLOG_LIMIT`)."""
    # Counted, not listed: sorting every parked target held the loop at each scrape.
    open_entries = {
        context: c.open_entries if isinstance(c, CountedLedger) else len(await c.entries())
        for context, c in ledgers.items()
    }
    sources = list(sources)
    held_due: dict[str, list[DueRow]] = {}
    for name, store, runner in sources:
        held = set(_shown(taken_here, name, store, runner) - runner.partitions)
        try:
            # Overdue timers of a partition not fired (held after a failed cycle, behind
            # its log's end) are backlog too: exactly then it grows.
            rows = await store.due_rows(held, now_ms, HELD_BACKLOG_LIMIT) if held else []
        except StoreClosed:  # let go meanwhile
            rows = []
        except StoreError as exc:  # a damaged block: told, not a failed scrape
            logger.warning("the held partitions of %s were not read: %s", name, exc)
            rows = []
        held_due[name] = rows
    # No await from here on: the gauges are cleared and set as one step, so that a
    # partition let go since the last scrape leaves no stale series behind.
    metrics.active.clear()
    metrics.backlog.clear()
    metrics.backlog_oldest.clear()
    for name, store, runner in sources:
        shown = _shown(taken_here, name, store, runner)
        for p in sorted(shown):
            counts = store.status_counts(p)
            for status in _STATUSES:
                metrics.active.labels(name, str(p), status.value.lower()).set(counts[status])
        count, oldest = runner.backlog(now_ms)
        # Of the partitions still held (not let go nor fired since the scan).
        still = shown - runner.partitions
        overdue = [r.due_at for r in held_due[name] if r.partition in still]
        count += len(overdue)
        if overdue:
            oldest = min(overdue) if oldest is None else min(oldest, *overdue)
        metrics.backlog.labels(name).set(count)
        waited = 0.0 if oldest is None else max(now_ms - oldest, 0) / 1000
        metrics.backlog_oldest.labels(name).set(waited)
    metrics.ledger_entries.clear()
    for context, n in open_entries.items():
        metrics.ledger_entries.labels(context).set(n)
