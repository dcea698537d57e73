"""What one round of the runner does over a group of partitions' firings (`RoundWork`),
with what a run of rounds keeps from one to the next (`RoundState`).

A round loads the due rows of its group's wheels (one `due_rows()` when one ran out),
takes a slice of them (`slow_start`), decides them, claims them (`claiming`), and, once
its node committed the claims, sends them, writes the outcomes that came back and sweeps
one partition of its group. A node runs one round a partition (`TimerRunner.partition_round`:
a group of one, its `PartitionFiring.rounds` state): its load, slice, burst, sweep and
lock are the partition's own, so a store call of one partition, or a burst in it, holds
no other partition's round up. The seed's round (`TimerRunner.round`, `run_round`) is one
round over every partition the runner fires, with the runner's own state, as one wheel
of them all. Both may run side by side (as two nodes' rounds may): every claim and
outcome is a conditional write, and a timer in hand is never handed over twice. A
firing's store calls go to its own store when it has one (`partition_store.store_of`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping

from app.timers.runner.claiming import hand_limit, hand_over, to_claim, write_claims
from app.timers.runner.decision_types import Decision
from app.timers.runner.options import TimerOptions
from app.timers.runner.outcomes import Outcomes
from app.timers.runner.partition import PartitionFiring
from app.timers.runner.partition_store import store_of
from app.timers.runner.ports import Clock, FiringStore
from app.timers.runner.round_state import RoundState
from app.timers.runner.rounds import Round
from app.timers.runner.sending import Sends
from app.timers.runner.settling import settle_exactly, taken_over
from app.timers.runner.slow_start import (
    STREAM_SPAN_MS,
    burst_after,
    may_begin_burst,
    round_slice,
)
from app.timers.runner.stats import RoundStats
from app.timers.runner.wheel import (
    Load,
    built_apart,
    count_due_of,
    due_step_of,
    load_due_of,
    pop_from,
)
from tables.exceptions import StoreError
from tables.store import DueRow
from tables.timer import Timer, TimerStatus

__all__ = ["RoundWork", "failed"]

logger = logging.getLogger(__name__)


class RoundWork:
    """The round logic over the runner's `firings` (its map, read here), its store, sends
    and outcome writes; `offer` puts rows just written back in their wheels, `decide`
    says what a loaded timer becomes now (`expire_or_claim`, guarded), `settle` writes
    a batch of claims (`settle_exactly`)."""

    def __init__(
        self,
        store: FiringStore,
        clock: Clock,
        options: TimerOptions,
        firings: Mapping[int, PartitionFiring],
        sends: Sends,
        outcomes: Outcomes,
        load: Load,
        offer: Callable[[Iterable[Timer]], None],
        decide: Callable[[Timer, int], Decision],
        settle: Callable[[list[Decision]], Awaitable[list[Decision]]],
    ) -> None:
        self._store = store
        self._clock = clock
        self._options = options
        self._firings = firings
        self._sends = sends
        self._outcomes = outcomes
        self._load = load
        self._offer = offer
        self._decide = decide
        self._settle = settle

    async def claim(
        self,
        group: Mapping[int, PartitionFiring],
        state: RoundState,
        room: int,
        grow: bool = True,
        spread: int = 1,
        stats: RoundStats | None = None,
    ) -> Round:
        """Loads the due timers of `group`, decides them, and claims them: a remote one's
        claim written (in its partition's transaction), an in-process one's kept for its
        cycle; at most `room` sends claimed. The caller holds `state.lock`. `stats`: the
        round's, begun by the caller's writes before it (a new one when None)."""
        now = self._clock.now()
        live = {p: f for p, f in group.items() if f.fault is None}
        r = Round(stats or RoundStats(), now, frozenset(live), firings=dict(group))
        if not r.owned:
            failed(r)
            return r
        stats, o = r.stats, self._options
        # A partition whose cycle is `hand_limit` or more behind its rounds is handed no
        # more until it catches up (its outcomes wake its round): loading and building its
        # rows again meanwhile would take those in hand again, to pass them over.
        taking = {p: f for p, f in live.items() if len(f.in_hand) < hand_limit(o)}
        if not taking:
            await self._claim_taken(r, live, [], room)  # a fresh one's FIRING rows
            return r
        wheels = {p: f.wheel for p, f in taking.items()}
        store = store_of(live.values(), self._store)
        load = self._load if store is self._store else store.due_rows
        held = {p: f.in_hand for p, f in taking.items() if f.in_hand}
        try:
            await load_due_of(wheels, load, now, o.poll_interval_ms, o.batch_limit, held)
        except StoreError as exc:
            f = None if exc.partition is None else live.get(exc.partition)
            if f is None or f.store is None:
                raise
            f.fail(exc)  # its own store refused it (let go since its take): it stops here
            failed(r)
            return r
        # A burst is taken in growing slices (`slow_start`): the first fires at once.
        due = count_due_of(wheels, now, o.batch_limit)
        # A stream's backlog is no burst (`slow_start`): how many rows due make its step.
        # Scanned only where a burst would begin: a scan of the wheels is O(rows loaded).
        begins = state.burst is None and may_begin_burst(
            due, limit=o.batch_limit, spread=spread, before=state.last_due
        )
        step = due_step_of(wheels, now, STREAM_SPAN_MS) if begins else None
        take = round_slice(
            due,
            state.burst,
            limit=o.batch_limit,
            grow=grow,
            spread=spread,
            before=state.last_due,
            step=step,
        )
        state.last_due = due
        rows, took, stats.full = pop_from(wheels, now, take)
        state.burst = burst_after(take, stats.full)
        fresh = [f for f in live.values() if f.fresh]
        try:
            await self._claim_taken(r, live, rows, room)
        except Exception:
            # Taken, not claimed: loaded (and a previous owner's claims taken) again.
            for p in took:
                wheels[p].invalidate()
            for f in fresh:
                f.fresh = True
            raise
        return r

    async def _claim_taken(
        self, r: Round, live: dict[int, PartitionFiring], rows: list[DueRow], room: int
    ) -> None:
        """Decides and claims the `rows` taken from the wheels of the `live` firings, and
        the FIRING rows of those just started."""
        stats, now = r.stats, r.now
        loaded, faults = built_apart(rows)
        for p, exc in faults.items():
            live[p].fail(exc)
        stats.loaded = len(loaded)
        decided = [self._decide(t, now) for t in to_claim(r, self._firings, loaded)]
        decided += await self._taken_over(now, live)
        stats.lapsed = sum(
            1
            for d in decided
            if d.change is not None and d.change.loaded.status is TimerStatus.FIRING
        )
        to_write = hand_over(r, self._firings, decided, room)
        # A part of a batch that failed may have landed: its claims are sent all the same.
        landed = functools.partial(
            settle_exactly, store_of(live.values(), self._store), landed=True
        )
        await write_claims(r, self._firings, to_write, self._settle, self._offer, landed)
        if stats.lost_claims or stats.deferred:
            for f in live.values():
                f.wheel.invalidate()  # rows changed behind the wheels' back, or not claimed

    async def finish(
        self, r: Round, state: RoundState, group: Mapping[int, PartitionFiring] | None
    ) -> None:
        """Sends the claims committed, writes the outcomes of `group` in (every firing of
        the runner's when None: the seed's round), sweeps a partition of the round's."""
        stats = r.stats
        if not r.owned:
            return
        unsent = [t for t in r.remote if t.partition not in r.committed]
        if unsent:
            # Their partitions are reset and restored: the claims never counted.
            logger.warning("%d claim(s) not committed, none sent", len(unsent))
        to_send: dict[int, list[Timer]] = {}
        for t in r.remote:
            if t.partition in r.committed:
                to_send.setdefault(t.partition, []).append(t)
        for p, timers in sorted(to_send.items()):
            firing = r.firings[p]
            async with firing.lock:  # never after its stop began: it cuts what it finds
                if firing.live and self._firings.get(p) is firing:
                    r.tasks += [self._sends.spawn(firing, t, stats) for t in timers]
        stats.claimed = r.handed + len(r.tasks)
        await self._outcomes.flush(None if group is None else group.values(), stats)
        await self._sweep(r, state)
        self.next_due((self._firings if group is None else group).values(), stats)
        if stats.deferred:
            # Rows due it had no room to send: the next round waits for an answer
            # (`answered`: room), a wake-up or the poll interval, never goes again at once
            # to reload rows it cannot send.
            stats.full = False
            if stats.next_due is not None and stats.next_due <= r.now:
                stats.next_due = None  # a timer due later (in-process, say) still wakes it
        failed(r)

    async def _sweep(self, r: Round, state: RoundState) -> None:
        """One partition of the round a round, in turn: at most `sweep_limit` of its
        finished rows past their retention deleted (a range scan of the store's finished
        index), so the sweep never holds a round up for long; and its BUSY counts of rows
        gone dropped, `BUSY_LOOKS` looked at (`PartitionFiring.prune_busy`)."""
        ordered = sorted(r.owned)
        partition = ordered[state.sweep_turn % len(ordered)]
        state.sweep_turn += 1
        firing = r.firings.get(partition)
        if firing is None or self._firings.get(partition) is not firing:
            return  # stopped since the round began (a newer firing sweeps its own)
        async with firing.lock:  # after a stop's last writes, never among them
            if not firing.live:
                return
            try:
                r.stats.swept = await store_of((firing,), self._store).expire(
                    partition, r.now, self._options.finished_retention, self._options.sweep_limit
                )
            except StoreError as exc:
                firing.fail(exc)  # a corrupt finished row, say: restored
            except Exception as exc:
                # Nothing was deleted (the changelog takes the tombstones first): next turn.
                logger.warning("sweeping partition %d's finished timers failed: %s", partition, exc)
        if firing.busy and firing.live:
            # Reads only: no lock. A count whose row left by another hand goes.
            await firing.prune_busy(store_of((firing,), self._store), r.now)

    async def _taken_over(self, now: int, live: dict[int, PartitionFiring]) -> list[Decision]:
        """The FIRING rows of the partitions started since the last round, claimed again."""
        fresh = {p for p, f in live.items() if f.fresh and f.live}
        for p in fresh:
            live[p].fresh = False
        store = store_of((live[p] for p in fresh), self._store)
        decided, faults = await taken_over(store, fresh, now, self._options)
        for p, exc in faults.items():
            live[p].fail(exc)
        return decided

    def next_due(self, firings: Iterable[PartitionFiring], stats: RoundStats) -> None:
        """When the next round of `firings` is due: their wheels' next row, their reload."""
        untils = []
        held_up = hand_limit(self._options)
        for f in firings:
            if f.fault is not None or len(f.in_hand) >= held_up:
                # Nothing of it is taken (failed; or its cycle behind, which wakes it as
                # it catches up): its rows due must not spin the loop.
                continue
            stats.due_by(f.wheel.next_due)
            if f.wheel.until is not None:
                untils.append(f.wheel.until)
        stats.reload_at = min(untils, default=None)


def failed(r: Round) -> None:
    """The partitions the store failed in, as the round ends."""
    r.failed = {p: (f, f.fault) for p, f in r.firings.items() if f.fault is not None}
