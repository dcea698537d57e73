"""`Outcomes`: how the runner writes what its timers came to, each a conditional write: the
outcomes of its sends, in one batch a round (`flush`), and those of the timers its
partitions' cycles fire in-process, in the cycle's transaction (`still_due`, `record`).
The targets of parks are recorded in the ledger first, with no lock held (its calls may
take seconds), and only the partitions that park wait for it: each writes apart once its
own targets are recorded, while the others' outcomes are written at once; a park whose row
is then refused or not written has its name taken out by its partition's next round
(`not_written`: a crash between the two leaves a name, never a PARKED row unnamed). A
cycle calls no ledger (it holds its partition's lock): an in-process fire's park is
written there as its fallback, and parked by its partition's next flush
(`deferred_park`). The rows are
written under the locks of their partitions only, and a store fault in one partition's
rows fails only that partition (`apart`). Each partition's rows are written through its
firing's store (`partition_store.store_of`)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence

from app.timers.runner.claiming import hand_limit
from app.timers.runner.decision_types import Decision
from app.timers.runner.decisions import SendResult, deferred_park, unparked
from app.timers.runner.options import TimerOptions
from app.timers.runner.partition import (
    PartitionFiring,
    begin_write,
    locked,
    offer_to,
    writing,
)
from app.timers.runner.partition_store import PartitionStore, store_of
from app.timers.runner.ports import Clock, FiringStore
from app.timers.runner.settling import apart, from_loaded, holds, park
from app.timers.runner.stats import RoundStats, count
from tables.exceptions import StoreError
from tables.ledger import FailureLedger
from tables.timer import Timer, TimerChange, TimerStatus

__all__ = ["Outcomes"]

logger = logging.getLogger(__name__)


class Outcomes:
    """The runner's outcome writes over its `firings` (the runner's map, read here)."""

    def __init__(
        self,
        store: FiringStore,
        ledger: FailureLedger,
        clock: Clock,
        options: TimerOptions,
        firings: Mapping[int, PartitionFiring],
        answered: asyncio.Event | None = None,
    ) -> None:
        self._store = store
        self._ledger = ledger
        self._clock = clock
        self._options = options
        self._firings = firings
        # The seed's loop's wake-up (its rounds over every partition), beside each
        # partition's own (`PartitionFiring.answered`).
        self._answered = answered

    async def flush(self, firings: Iterable[PartitionFiring] | None, stats: RoundStats) -> None:
        """Writes the outcomes decided in `firings` (all when None): in one batch, but for
        the partitions that park a target, each written apart once the ledger holds its
        targets. A partition whose rows the store cannot write (a corrupt row) fails
        (`PartitionFiring.fail`): its outcomes are not written (their claims lapse)."""
        chosen = list(self._firings.values()) if firings is None else list(firings)
        taken = {f: outcomes for f in chosen if (outcomes := f.take_outcomes())}
        if not taken:
            return
        parking = [{f: o} for f, o in taken.items() if any(d.park for d in o)]
        plain = {f: o for f, o in taken.items() if not any(d.park for d in o)}
        groups = [plain, *parking] if plain else parking
        # Under way from here, each until its own rows are written: a stop waits for its.
        writes = [(group, begin_write(group)) for group in groups]
        if len(writes) == 1:  # the usual: one batch, no task of its own
            group, end = writes[0]
            await self._write(group, stats, end)
        else:
            await asyncio.gather(*(self._write(group, stats, end) for group, end in writes))

    async def _write(
        self,
        taken: dict[PartitionFiring, list[Decision]],
        stats: RoundStats,
        end: Callable[[], None],
    ) -> None:
        """Writes the outcomes `taken` of their partitions, the targets of parks recorded in
        the ledger first; `end` once they are written (or not)."""
        try:
            decisions = [d for outcomes in taken.values() for d in outcomes]
            final = await park(self._ledger, TimerOptions.PARKED_SUBSCRIPTION, decisions, stats)
            # A deferred park the ledger refused: its fallback row stands, due after the
            # backoff, and goes to its wheel now (`record` held it back).
            offer_to(self._firings, refused_fallbacks(decisions, final))
            by_partition = {f.partition: f for f in taken}
            for d in final:
                if d.change is not None and (own := by_partition.get(d.change.next.partition)):
                    own.count_busy((d,))
            changes = [d.change for d in final if d.change is not None]
            parks = [d.change.next for d in final if d.park and d.change is not None]
            store = store_of(taken, self._store)
            try:
                async with locked(taken):
                    counts, faults = await apart(store.settle, changes, _partition)
                    decided = len(changes)
                    if faults:
                        changes = [c for c in changes if _partition(c) not in faults]
                    if sum(counts) < len(changes):
                        # Some refused (their rows changed since loaded): only those written
                        # are counted and offered to their wheels. Rare: asked row by row.
                        changes = await _landed(store, changes)
            except Exception:
                # Not written: the claims lapse and are sent again; the target de-duplicates.
                logger.exception("writing %d timer outcome(s) failed", len(changes))
                stats.write_failures += 1
                # Their parks' names too, taken out unless PARKED when the round looks.
                not_parked(by_partition, parks)
                return
        finally:
            end()
        stats.written += len(changes)
        for p, exc in faults.items():
            by_partition[p].fail(exc)
        if len(changes) < decided:
            written = {id(c) for c in changes}
            refused = [d.change for d in final if d.change and id(d.change) not in written]
            final = [d for d in final if d.change is None or id(d.change) in written]
            not_written(by_partition, refused)
        self._written(changes, stats)
        count(stats, final)

    async def still_due(self, claimed: Sequence[Timer]) -> list[Timer]:
        """Of the timers claimed to fire in-process, those whose rows are still as they were
        loaded (a cancel or reschedule may have come since)."""
        held_up = self._held_up(claimed)
        by_firing: dict[PartitionFiring, list[Timer]] = {}
        for t in claimed:
            firing = self._firings.get(t.partition)
            if firing is not None and (loaded := firing.in_hand.get(t.id)) is not None:
                by_firing.setdefault(firing, []).append(loaded)
        # By partition and id: ids are unique within a partition's hand alone.
        still: set[tuple[int, str]] = set()
        for firing, rows in by_firing.items():
            for loaded, row in zip(rows, await self._rows_now(firing, rows), strict=True):
                if row is not None and row.same_as_loaded(loaded):
                    still.add((firing.partition, loaded.id))
        kept: list[Timer] = []
        for t in claimed:
            if (t.partition, t.id) in still:
                kept.append(t)
            elif (firing := self._firings.get(t.partition)) is not None:
                firing.in_hand.pop(t.id, None)
        self._catching_up(held_up)
        return kept

    async def _rows_now(self, firing: PartitionFiring, loaded: list[Timer]) -> list[Timer | None]:
        """The rows of `loaded` (of `firing`'s partition) as they are now: read at once from
        its partition's own store, where each was loaded (a node's cycle), else each found."""
        if isinstance(store := firing.store, PartitionStore):
            return store.as_loaded(loaded)
        found = store_of((firing,), self._store)
        return [await found.find(t.owner, t.key) for t in loaded]

    def _held_up(self, timers: Iterable[Timer]) -> set[PartitionFiring]:
        """The firings of `timers` that hold `hand_limit` or more in hand: their rounds take
        no more until their cycles catch up (`RoundWork.claim`)."""
        limit = hand_limit(self._options)
        firings = {f for t in timers if (f := self._firings.get(t.partition)) is not None}
        return {f for f in firings if len(f.in_hand) >= limit}

    def _catching_up(self, held_up: set[PartitionFiring]) -> None:
        """Wakes the rounds of the firings `held_up` that hold fewer than `hand_limit` in
        hand now: they take again at once, not at their next poll."""
        limit = hand_limit(self._options)
        for firing in held_up:
            if len(firing.in_hand) < limit:
                firing.answered.set()
                if self._answered is not None:
                    self._answered.set()

    async def record(self, results: Sequence[tuple[Timer, SendResult]]) -> RoundStats:
        """Writes the outcomes of timers fired in-process, each against the row as it was
        loaded; raises when the write fails (the transaction must not commit). A park is
        written as its fallback here (the cycle calls no ledger: it holds its partition's
        lock) and parked by the partition's next outcome write, the ledger first, as a
        sent timer's is (`deferred_park`)."""
        stats = RoundStats()
        decisions: list[Decision] = []
        parks: list[tuple[PartitionFiring, Decision]] = []
        now = self._clock.now()
        held_up = self._held_up(claimed for claimed, _ in results)
        for claimed, result in results:
            firing = self._firings.get(claimed.partition)
            loaded = None if firing is None else firing.in_hand.pop(claimed.id, None)
            if firing is None or loaded is None:
                raise StoreError(f"{claimed.request_id} was fired but not handed over")
            d = firing.decide(claimed, result, now, self._options)
            d = dataclasses.replace(
                d, change=from_loaded(d.change, loaded), fallback=from_loaded(d.fallback, loaded)
            )
            if d.park:
                parks.append((firing, deferred_park(d)))
                d = unparked(d)
            decisions.append(d)
        if not decisions:
            return stats
        firings = {f for claimed, _ in results if (f := self._firings.get(claimed.partition))}
        with writing(firings):
            for d in decisions:
                if d.change is not None and (f := self._firings.get(d.change.next.partition)):
                    f.count_busy((d,))
            changes = [d.change for d in decisions if d.change is not None]
            async with locked(firings):
                stats.written = await store_of(firings, self._store).settle(changes)
        if stats.written != len(changes):
            raise StoreError(f"{len(changes) - stats.written} in-process outcome(s) not written")
        # Not offered to its wheel: its park is written first (the partition's next round
        # begins with it), and a refused park offers it then.
        parking = {d.change.next.id for _, d in parks if d.change is not None}
        self._written([c for c in changes if c.next.id not in parking], stats)
        count(stats, decisions)
        for firing, d in parks:
            firing.outcomes.append(d)
            firing.answered.set()  # its next round writes it, with no wait
        self._catching_up(held_up)
        return stats

    def _written(self, changes: list[TimerChange], stats: RoundStats) -> None:
        """Rows just written: back in their wheels when due again soon."""
        offer_to(self._firings, (c.next for c in changes))
        for change in changes:
            if change.next.status is TimerStatus.PENDING and change.next.partition in self._firings:
                stats.due_by(change.next.due_at)


def not_written(firings: Mapping[int, PartitionFiring], refused: list[TimerChange]) -> None:
    """Outcomes whose rows were not written (changed since loaded, by a cancel or a
    replace, say; or in a partition that failed): a timer's BUSY count goes, and a park's
    name, recorded in the ledger first, is taken out by its partition's next round."""
    for change in refused:
        if (firing := firings.get(change.next.partition)) is not None:
            firing.busy.pop(change.next.id, None)
    not_parked(firings, [c.next for c in refused if c.next.status is TimerStatus.PARKED])


def not_parked(firings: Mapping[int, PartitionFiring], parks: list[Timer]) -> None:
    """Parks the ledger recorded whose PARKED rows were not written (`Unparked.refused`)."""
    for row in parks:
        if (firing := firings.get(row.partition)) is not None:
            firing.unparked.refused((row,))


def refused_fallbacks(decisions: list[Decision], final: list[Decision]) -> list[Timer]:
    """The rows of deferred parks (`deferred_park`) that `park` turned into nothing."""
    return [
        d.change.loaded
        for d, f in zip(decisions, final, strict=True)
        if d.park and d.fallback is None and d.change is not None and f.change is None
    ]


async def _landed(store: FiringStore, changes: list[TimerChange]) -> list[TimerChange]:
    """Of `changes`, those whose rows now hold their writes; all of them when the store
    cannot tell (its faults are the write's to report, not this count's)."""
    try:
        return [c for c in changes if await holds(store, c)]
    except Exception as exc:
        logger.warning("which timer outcomes were written is not known: %r", exc)
        return changes


def _partition(change: TimerChange) -> int:
    return change.loaded.partition
