"""`Outcomes`: how the runner writes what its timers came to, each a conditional write: the
outcomes of its sends, in one batch a round (`flush`), and those of the timers its
partitions' cycles fire in-process, in the cycle's transaction (`still_due`, `record`).
The targets of parks are recorded in the ledger first, outside the write lock (its calls
may take seconds, and every partition's rounds and settles wait for that lock)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence

from app.timers.runner.decisions import Decision, SendResult
from app.timers.runner.options import TimerOptions
from app.timers.runner.partition import PartitionFiring, offer_to
from app.timers.runner.ports import Clock, FiringStore
from app.timers.runner.settling import from_loaded, park
from app.timers.runner.stats import RoundStats, count
from tables.exceptions import StoreError
from tables.ledger import FailureLedger
from tables.timer import Timer, TimerChange, TimerStatus

__all__ = ["Outcomes"]

logger = logging.getLogger(__name__)


class Outcomes:
    """The runner's outcome writes over its `firings` (the runner's map, read here), under
    its `write_lock`."""

    def __init__(
        self,
        store: FiringStore,
        ledger: FailureLedger,
        clock: Clock,
        options: TimerOptions,
        firings: Mapping[int, PartitionFiring],
        write_lock: asyncio.Lock,
    ) -> None:
        self._store = store
        self._ledger = ledger
        self._clock = clock
        self._options = options
        self._firings = firings
        self._write_lock = write_lock
        self._flush_lock = asyncio.Lock()
        # Claims given back as their partition was stopped (its firing gone): written by
        # the next flush.
        self.orphans: list[Decision] = []

    async def flush(self, firings: Iterable[PartitionFiring] | None, stats: RoundStats) -> None:
        """Writes the outcomes decided in `firings` (all when None) in one batch, with the
        claims given back meanwhile, the targets of parks recorded in the ledger first."""
        # One at a time (stop_partition's after any that took its outcomes).
        async with self._flush_lock:
            async with self._write_lock:
                chosen = list(self._firings.values()) if firings is None else list(firings)
                taken, self.orphans = self.orphans, []
                for f in chosen:
                    taken += f.take_outcomes()
            if not taken:
                return
            final = await park(self._ledger, TimerOptions.PARKED_SUBSCRIPTION, taken, stats)
            async with self._write_lock:
                by_partition = {f.partition: f for f in chosen}
                for d in final:
                    if d.change is not None and (own := by_partition.get(d.change.next.partition)):
                        own.count_busy((d,))
                changes = [d.change for d in final if d.change is not None]
                try:
                    stats.written = await self._store.settle(changes)
                except Exception:
                    # Not written: the claims lapse and are sent again; the target
                    # de-duplicates.
                    logger.exception("writing %d timer outcome(s) failed", len(changes))
                    return
        self._written(changes, stats)
        count(stats, final)

    async def still_due(self, claimed: Sequence[Timer]) -> list[Timer]:
        """Of the timers claimed to fire in-process, those whose rows are still as they were
        loaded (a cancel or reschedule may have come since)."""
        kept: list[Timer] = []
        for t in claimed:
            firing = self._firings.get(t.partition)
            loaded = None if firing is None else firing.in_hand.get(t.id)
            row = None if loaded is None else await self._store.find(t.owner, t.key)
            if loaded is not None and row is not None and row.same_as_loaded(loaded):
                kept.append(t)
            elif firing is not None:
                firing.in_hand.pop(t.id, None)
        return kept

    async def record(self, results: Sequence[tuple[Timer, SendResult]]) -> RoundStats:
        """Writes the outcomes of timers fired in-process, each against the row as it was
        loaded; raises when the write fails (the transaction must not commit)."""
        stats = RoundStats()
        decisions: list[Decision] = []
        now = self._clock.now()
        for claimed, result in results:
            firing = self._firings.get(claimed.partition)
            loaded = None if firing is None else firing.in_hand.pop(claimed.id, None)
            if firing is None or loaded is None:
                raise StoreError(f"{claimed.request_id} was fired but not handed over")
            d = firing.decide(claimed, result, now, self._options)
            decisions.append(
                dataclasses.replace(
                    d,
                    change=from_loaded(d.change, loaded),
                    fallback=from_loaded(d.fallback, loaded),
                )
            )
        if not decisions:
            return stats
        final = await park(self._ledger, TimerOptions.PARKED_SUBSCRIPTION, decisions, stats)
        async with self._write_lock:
            for d in final:
                if d.change is not None and (f := self._firings.get(d.change.next.partition)):
                    f.count_busy((d,))
            changes = [d.change for d in final if d.change is not None]
            stats.written = await self._store.settle(changes)
        if stats.written != len(changes):
            raise StoreError(f"{len(changes) - stats.written} in-process outcome(s) not written")
        self._written(changes, stats)
        count(stats, final)
        return stats

    def _written(self, changes: list[TimerChange], stats: RoundStats) -> None:
        """Rows just written: back in their wheels when due again soon."""
        offer_to(self._firings, (c.next for c in changes))
        for change in changes:
            if change.next.status is TimerStatus.PENDING and change.next.partition in self._firings:
                stats.due_by(change.next.due_at)
