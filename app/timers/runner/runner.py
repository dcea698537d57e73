"""TimerRunner: carries out the decisions against a store, a sender and a clock.

The runner holds no rule of its own: `decisions` says what each timer becomes; this
module loads, claims, sends and writes, in rounds (`round_work`), over one
`PartitionFiring` per partition it fires (its wheel, sends, outcomes, rounds' state,
write lock). A node runs each partition's rounds apart (`partition_round`: its own load,
burst slice, share of the sends, claim and outcome batches and sweep), so nothing of one
waits on another's round; the seed's round (`round`, `run_round`) does the same over
every partition at once. No lock is held across a ledger or a Kafka call, and a
partition's write lock only across a store call of it. Time comes from a `Clock` and
commands leave through a `Sender` (`ports`), so tests drive it all with fakes.

A firing started with a store of its own (`start_partition`'s `store`: a node's task's
handle of its partition) makes all its store calls through it (`partition_store`). A
store fault in a partition (`StoreError`) stops that partition's firing alone
(`PartitionFiring.fault`, `Round.failed`): its owner lets it go and restores it.

In a node the runner calls nothing of the node: the node drives it. A partition's round
hands the node the claims that must commit before their commands leave; the timers fired
in-process wait in the `PartitionFiring` (which the node's partition task holds from
`start_partition` to its stop) until the partition's cycle takes them (`in_process_due`),
decides them with its commands and settles them in its transaction (`record_outcomes`).

The runner inherits the operator's actions on PARKED timers (`retry`, `skip`,
`name_parked`) from `parked_actions.ParkedActions`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Iterable, Sequence

from app.timers.runner.decision_types import Decision
from app.timers.runner.decisions import SendResult, expire_or_claim, guarded
from app.timers.runner.operating import Unresolved, resolve_at_stop, tend_ledger
from app.timers.runner.options import REQUEST_ID_WINDOW_MS, TimerOptions
from app.timers.runner.outcomes import Outcomes
from app.timers.runner.parked_actions import ParkedActions
from app.timers.runner.partition import (
    InProcessTargets,
    PartitionFiring,
    backlog_of,
    offer_to,
)
from app.timers.runner.partition_store import store_of
from app.timers.runner.ports import Clock, FiringStore, Sender
from app.timers.runner.round_state import RoundState
from app.timers.runner.round_work import RoundWork, failed
from app.timers.runner.rounds import Round
from app.timers.runner.sending import Sends
from app.timers.runner.settling import settle_exactly
from app.timers.runner.stats import RoundStats
from app.timers.runner.wheel import Wheel
from tables.ledger import FailureLedger
from tables.store import DueRow
from tables.timer import Timer

__all__ = ["RoundStats", "TimerRunner"]

logger = logging.getLogger(__name__)


class TimerRunner(ParkedActions):
    """Sends the timers of the partitions this node owns (see the TimerRunner seed): a thin
    driver over one `PartitionFiring` per partition. `partitions`: those it fires from the
    start, `in_process` the targets it fires in-process there (`start_partition`). The
    operator's actions on PARKED timers are `ParkedActions`'; `request_id_window` (ms) is
    how long the timers' targets keep a request id they applied (the node's
    `TICKWHEEL_REQUEST_ID_WINDOW_MS`), which bounds an operator's retry (`retry_parked`)."""

    def __init__(
        self,
        store: FiringStore,
        sender: Sender,
        clock: Clock,
        ledger: FailureLedger,
        options: TimerOptions | None = None,
        partitions: Iterable[int] = (),
        *,
        in_process: InProcessTargets | None = None,
        request_id_window: int = REQUEST_ID_WINDOW_MS,
    ) -> None:
        self._store = store
        self._window = request_id_window
        self._clock = clock
        self._ledger = ledger
        self._options = options or TimerOptions()
        self._sends = Sends(store, sender, clock, self._options)
        # A reference to each partition's firing, from its start to its stop (its owner,
        # a node's partition task, holds it too).
        self._firings: dict[int, PartitionFiring] = {}
        # Entries a cycle's request settled in a partition not fired here: its next firing's.
        self._unresolved: dict[int, Unresolved] = {}
        for p in partitions:
            self._firings[p] = firing = self._new_firing(p, in_process)
            firing.fresh = False  # given at the start: nobody else's claims to take over
        # The seed's rounds over every partition (`round`): their lock, burst and sweep.
        self._rounds = RoundState()
        self._outcomes = Outcomes(
            store, ledger, clock, self._options, self._firings, self._sends.answered
        )
        self._work = RoundWork(
            store,
            clock,
            self._options,
            self._firings,
            self._sends,
            self._outcomes,
            self._load,
            self.offer,
            self._expire_or_claim,
            self._settle_exactly,
        )

    def _new_firing(
        self,
        partition: int,
        in_process: InProcessTargets | None = None,
        store: FiringStore | None = None,
    ) -> PartitionFiring:
        load = self._load if store is None else store.due_rows
        wheel = Wheel(load, self._options.poll_interval_ms, self._options.batch_limit)
        return PartitionFiring(partition, wheel, in_process, store)

    def _expire_or_claim(self, timer: Timer, now: int) -> Decision:
        """What a loaded timer becomes now; a rule that raises parks it alone (`guarded`)."""
        return guarded(functools.partial(expire_or_claim, timer, now, self._options), timer, now)

    async def _load(self, partitions: set[int], until: int, limit: int) -> list[DueRow]:
        return await self._store.due_rows(partitions, until=until, limit=limit)

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def options(self) -> TimerOptions:
        return self._options

    @property
    def answered(self) -> asyncio.Event:
        """Set when a send's outcome is in: the next round writes it (the loop waits on it
        as on its wake-up), so a round never waits for its sends."""
        return self._sends.answered

    @property
    def in_flight(self) -> int:
        """Sends not answered yet (nor timed out)."""
        return sum(len(f.in_flight) for f in self._firings.values())

    @property
    def partitions(self) -> frozenset[int]:
        """The partitions whose timers this runner sends now."""
        return frozenset(self._firings)

    @property
    def parked_subscription(self) -> str:
        """What the ledger parks this context's targets under."""
        return TimerOptions.PARKED_SUBSCRIPTION

    def start_partition(
        self,
        partition: int,
        *,
        in_process: InProcessTargets | None = None,
        store: FiringStore | None = None,
        check_named: bool = False,
    ) -> PartitionFiring:
        """Starts sending the timers of `partition`; nothing when it does already. Its
        firing, for its owner to hold (a node's partition task) until it stops it.
        `in_process`: the targets its node decides in the partition itself, whose timers
        are claimed for its cycle to fire (`in_process_due`) rather than sent. `store`:
        the partition's own (`partition_store.PartitionStore`), which every store call of
        the firing goes through (None: the runner's). `check_named`: its first round
        records its PARKED timers that no open ledger entry names (`name_unnamed`)."""
        firing = self._firings.get(partition)
        if firing is None:
            firing = self._new_firing(partition, in_process, store)
            if check_named:
                firing.naming_at = 0
            if (unresolved := self._unresolved.pop(partition, None)) is not None:
                unresolved.hand_to(firing)
            self._firings[partition] = firing
            logger.info("timers of partition %d: started", partition)
        elif store is not None and firing.store is not store:
            # An earlier take's firing never stopped: its store (that take's handle) would
            # refuse all; the take fails, loudly, rather than fire through it.
            raise RuntimeError(f"timers of partition {partition}: still fired by an earlier take")
        return firing

    async def stop_partition(self, partition: int) -> RoundStats:
        """Stops sending `partition`'s timers: sends in progress are cancelled (their claims
        given back), and the outcomes of those that came back are written before it returns;
        what those writes did (a round's figures, for its metrics). The ledger entries its
        rounds had not resolved yet (`resolve_later`, also of a partition never fired since)
        are tried once more, within `STOP_RESOLVE_S`."""
        stats = RoundStats()
        firing = self._firings.pop(partition, None)
        if firing is None:
            if (unresolved := self._unresolved.pop(partition, None)) is not None:
                # Never fired here since a cycle's request settled its rows (held): its
                # entries are tried once more now, as a firing's are at its stop.
                holder = self._new_firing(partition)
                unresolved.hand_to(holder)
                await resolve_at_stop(self._store, self._ledger, holder, self._clock.now())
            return stats
        async with firing.lock:  # after a claim write or a sweep of it under way
            firing.stopped = True
        cut = await firing.cut_short()
        await firing.written()  # the writes that took its outcomes before, then the rest
        await self._outcomes.flush([firing], stats)
        await resolve_at_stop(self._store, self._ledger, firing, self._clock.now())
        logger.info("timers of partition %d: stopped (%d send(s) cut short)", partition, cut)
        return stats

    async def stop_all(self) -> None:
        """Stops every partition, as a node does before it shuts down."""
        for partition in sorted(self._firings):
            await self.stop_partition(partition)

    async def run_round(self, *, wait: bool = True) -> RoundStats:
        """Loads the due timers of all owned partitions, claims, sends and records them
        (their claims written are all it takes: nothing to commit before they leave).

        `wait`: until the round's sends are answered and their outcomes written (one round
        whole, as a test or a one-off run wants it). The loop does not wait: each send's
        outcome is written by the round after it came back (`answered`), so a slow target
        holds no other timer up.
        """
        async with self._rounds.lock:
            r = await self._claim()
        r.claims_committed(r.to_commit)
        await self._finish(r)
        if wait and r.tasks:
            await asyncio.wait(r.tasks)
            await self._outcomes.flush(None, r.stats)
            self._work.next_due(self._firings.values(), r.stats)
            failed(r)
        return r.stats

    @property
    def bursting(self) -> bool:
        """Whether a burst is under way in the seed's rounds (`round`): the last left rows
        due (`slow_start`). A partition's own: `PartitionFiring.rounds`."""
        return self._rounds.bursting

    @contextlib.asynccontextmanager
    async def round(self, *, grow: bool = True) -> AsyncIterator[Round]:
        """The seed's round over every partition fired here (a node runs each partition's
        apart: `partition_round`): the due timers claimed on entering, and on leaving the
        claims its node committed (`Round.claims_committed`) sent, never the others (they lapse
        and are claimed again), and the outcomes that came back written. In between, the
        node commits the claims of `Round.to_commit` and has the partitions of
        `Round.in_process` fire theirs. Its sends are not waited for (`answered`).
        `grow`: a burst's slice may double (`slow_start`), else it is taken again.
        `Round.failed`: the partitions the store failed in, for the node to restore."""
        async with self._rounds.lock:
            r = await self._claim(grow)
        yield r
        await self._finish(r)

    @contextlib.asynccontextmanager
    async def partition_round(
        self, partition: int, *, grow: bool = True, of: PartitionFiring | None = None
    ) -> AsyncIterator[Round]:
        """A round of `partition` alone, as `round` is of them all, with the partition's
        own lock, burst and sweep (`PartitionFiring.rounds`) and its share of the sends
        (`share`): a node's partition runs its own, and nothing of another partition's
        (its store calls, its burst, its commits) holds it up. Nothing (an empty round)
        when the partition is not fired here, or (`of`) no longer by that firing."""
        firing = self._firings.get(partition)
        if firing is None or (of is not None and firing is not of):
            yield Round(RoundStats(), self._clock.now(), frozenset())
            return
        async with firing.rounds.lock:
            r = await self._claim(grow, firing)
        yield r
        await self._finish(r, firing)

    def firing_of(self, partition: int) -> PartitionFiring | None:
        """The firing of `partition` from its start to its stop (None: not fired here)."""
        return self._firings.get(partition)

    @property
    def share(self) -> int:
        """How many sends a partition's rounds keep in flight at most: `max_in_flight`
        shared evenly among the partitions fired here (one at least). The shares add up to
        no more than `max_in_flight` (as many partitions as sends, at most); the send gate
        (`Sends`) bounds the total whatever they add up to."""
        return max(1, self._options.max_in_flight // max(1, len(self._firings)))

    async def _claim(self, grow: bool = True, firing: PartitionFiring | None = None) -> Round:
        """A round's claims (`RoundWork.claim`): of `firing`'s partition alone, within its
        share of the sends; of every partition when None (the seed's round). In-process
        fires' parks (`Outcomes.record`) are written first: their fallback rows are not
        fired again before, however short the backoff and slow the ledger."""
        chosen = list(self._firings.values()) if firing is None else [firing]
        parking = [f for f in chosen if any(d.park for d in f.outcomes)]
        stats = RoundStats()
        if parking:
            await self._outcomes.flush(parking, stats)
        # After those parks: an entry they recorded in stays.
        await tend_ledger(self._store, self._ledger, chosen, self._clock)
        if firing is None:
            room = self._options.max_in_flight - self.in_flight
            return await self._work.claim(self._firings, self._rounds, room, grow, stats=stats)
        room = self.share - len(firing.in_flight)
        # Its burst's slices are its share of a round's (`round_slice`): the partitions'
        # rounds run side by side on one loop.
        spread = len(self._firings)
        return await self._work.claim(
            {firing.partition: firing}, firing.rounds, room, grow, spread, stats
        )

    async def _finish(self, r: Round, firing: PartitionFiring | None = None) -> None:
        """A round's sends, outcome writes and sweep (`RoundWork.finish`), as `_claim`."""
        if firing is None:
            await self._work.finish(r, self._rounds, None)
        else:
            await self._work.finish(r, firing.rounds, {firing.partition: firing})

    async def _settle_exactly(self, decisions: list[Decision]) -> list[Decision]:
        """Settles the decisions' changes in one batch (each partition's through its
        firing's store); the decisions that were written."""
        touched = {d.change.next.partition for d in decisions if d.change is not None}
        firings = [f for p, f in self._firings.items() if p in touched]
        return await settle_exactly(store_of(firings, self._store), decisions)

    def in_process_due(self, partition: int) -> list[Timer]:
        """The timers of `partition` claimed to fire in-process since its cycle last asked:
        the cycle checks them (`still_due`), decides them with its commands, and settles
        them in its transaction (`record_outcomes`)."""
        firing = self._firings.get(partition)
        return [] if firing is None else firing.take_handed()

    def backlog(self, now: int) -> tuple[int, int | None]:
        """Due by `now` and neither sent nor fired yet, with the earliest due time among
        them (`partition.backlog_of`): for metrics, read at a scrape."""
        return backlog_of(self._firings.values(), now)

    def offer(self, timers: Iterable[Timer]) -> None:
        """Puts rows just written (PENDING) in their partitions' wheels, when they fall
        within them."""
        offer_to(self._firings, timers)

    async def still_due(self, claimed: Sequence[Timer]) -> list[Timer]:
        """Of the timers claimed to fire in-process, those whose rows are still as they were
        loaded (a cancel or reschedule may have come since): called by the partition's
        cycle just before it decides them."""
        return await self._outcomes.still_due(claimed)

    async def record_outcomes(self, results: Sequence[tuple[Timer, SendResult]]) -> RoundStats:
        """Writes the outcomes of timers fired in-process: called by the partition's cycle
        before its transaction commits, so that each settle commits with the events it
        records; each a conditional write against the row as it was loaded. Raises when
        the write fails: the transaction must not commit."""
        return await self._outcomes.record(results)
