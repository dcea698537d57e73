"""TimerRunner: carries out the decisions against a store, a sender and a clock.

The runner holds no rule of its own: `decisions` says what each timer becomes; this
module loads, claims, sends and writes, in rounds. One round is one `due_rows()` query
for every owned partition (when its wheel ran out), one `settle` batch for its claims and
expiries, the sends run concurrently, and one `settle` batch for their outcomes. Time
comes from a `Clock` and commands leave through a `Sender` (`ports`), so tests drive it
all with fakes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence, Set
from dataclasses import dataclass
from typing import Any

from app.timers.runner.decisions import (
    TIMEOUT,
    TRANSPORT_ERROR,
    Action,
    Decision,
    SendResult,
    expire_or_claim,
    guarded,
    on_outcome,
    release,
    retry_parked,
    skip_parked,
    unparked,
)
from app.timers.runner.options import TimerOptions
from app.timers.runner.ports import BeforeSend, Clock, FiringStore, LocalFirer, Sender
from app.timers.runner.wheel import Wheel
from tables.exceptions import StoreError
from tables.ledger import FailureLedger
from tables.refs import AggregateRef
from tables.timer import Timer, TimerChange, TimerStatus

__all__ = ["RoundStats", "TimerRunner"]

logger = logging.getLogger(__name__)


@dataclass
class RoundStats:
    """What one round did; `next_due` and `full` tell the loop when to run the next."""

    loaded: int = 0
    claimed: int = 0
    lost_claims: int = 0
    lapsed: int = 0
    """FIRING rows due again: a claim that lapsed (its send never settled, or a previous
    owner's), claimed again or expired."""
    expired: int = 0
    sent: int = 0
    fired: int = 0
    retried: int = 0
    busy: int = 0
    parked: int = 0
    released: int = 0
    swept: int = 0
    """Finished rows deleted past their retention (`TimerOptions.finished_retention`)."""
    ledger_failures: int = 0
    written: int = 0
    deferred: int = 0
    """Due, but not claimed: as many sends were in flight as may be (`max_in_flight`)."""
    full: bool = False
    next_due: int | None = None
    reload_at: int | None = None
    """When the wheel must be loaded again (it holds the rows due until then)."""

    def due_by(self, t: int) -> None:
        self.next_due = t if self.next_due is None else min(self.next_due, t)


class TimerRunner:
    """Sends the timers of the partitions this node owns (see the TimerRunner seed)."""

    def __init__(
        self,
        store: FiringStore,
        sender: Sender,
        clock: Clock,
        ledger: FailureLedger,
        options: TimerOptions | None = None,
        partitions: Iterable[int] = (),
        *,
        local: LocalFirer | None = None,
        before_send: BeforeSend | None = None,
    ) -> None:
        self._store = store
        self._local = local
        self._before_send = before_send
        # Partitions started since the last round: their FIRING rows are a previous
        # owner's claims (or cut short here), sent again at once rather than at their lapse.
        self._fresh: set[int] = set()
        # Timers handed over to fire in-process (`LocalFirer`), by id: the row as loaded,
        # which their outcome's conditional write is made against.
        self._in_hand: dict[str, Timer] = {}
        self._sender = sender
        self._clock = clock
        self._ledger = ledger
        self._options = options or TimerOptions()
        self._wheel = Wheel(
            lambda partitions, until, limit: store.due_rows(partitions, until=until, limit=limit),
            self._options.poll_interval_ms,
            self._options.batch_limit,
        )
        self._owned: set[int] = set(partitions)
        self._in_flight: dict[int, set[asyncio.Task[Decision]]] = defaultdict(set)
        # Outcomes decided but not written yet, per partition, so that stop_partition can
        # write its partition's share before the hand-off without waiting for the round.
        self._outcomes: dict[int, list[Decision]] = defaultdict(list)
        # BUSY refusals in a row, per partition and timer id: this node's memory only.
        self._busy: dict[int, dict[str, int]] = defaultdict(dict)
        self._gate = asyncio.Semaphore(self._options.max_in_flight)
        # Called when a send's outcome is in, to be written by the next round (the loop
        # sets it to wake itself): a round never waits for its sends.
        self.on_outcome: Callable[[], None] | None = None
        self._round_lock = asyncio.Lock()
        # Serialises the claim batch (and spawning its sends) with every outcome write, so
        # that stop_partition's write comes after anything a round already took of its part.
        self._write_lock = asyncio.Lock()
        self._flush_lock = asyncio.Lock()
        self._sweep_turn = 0

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def options(self) -> TimerOptions:
        return self._options

    @property
    def in_flight(self) -> int:
        """Sends not answered yet (nor timed out)."""
        return sum(len(bucket) for bucket in self._in_flight.values())

    @property
    def partitions(self) -> frozenset[int]:
        """The partitions whose timers this runner sends now."""
        return frozenset(self._owned)

    @property
    def parked_subscription(self) -> str:
        """What the ledger parks this context's targets under."""
        return TimerOptions.PARKED_SUBSCRIPTION

    def start_partition(self, partition: int) -> None:
        """Starts sending the timers of `partition`; nothing when it does already."""
        if partition not in self._owned:
            self._owned.add(partition)
            self._fresh.add(partition)
            self._wheel.invalidate()
            logger.info("timers of partition %d: started", partition)

    async def stop_partition(self, partition: int) -> None:
        """Stops sending `partition`'s timers: sends in progress are cancelled (their claims
        given back), and the outcomes of those that came back are written before it returns."""
        self._owned.discard(partition)
        self._fresh.discard(partition)
        self._in_hand = {k: t for k, t in self._in_hand.items() if t.partition != partition}
        tasks = self._in_flight.pop(partition, set())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        await self._flush({partition}, RoundStats())
        self._busy.pop(partition, None)
        logger.info("timers of partition %d: stopped (%d send(s) cut short)", partition, len(tasks))

    async def stop_all(self) -> None:
        """Stops every partition, as a node does before it shuts down."""
        for partition in sorted(self._owned | set(self._in_flight)):
            await self.stop_partition(partition)

    async def run_round(self, *, wait: bool = True) -> RoundStats:
        """Loads the due timers of all owned partitions, claims, sends and records them.

        `wait`: until the round's sends are answered and their outcomes written (one round
        whole, as a test or a one-off run wants it). The loop does not wait: each send's
        outcome is written by the round after it came back (`on_outcome`), so a slow
        target holds no other timer up.
        """
        async with self._round_lock:
            stats, tasks = await self._round()
            if wait and tasks:
                await asyncio.wait(tasks)
                await self._flush(None, stats)
                self._next_due(stats)
            return stats

    async def _round(self) -> tuple[RoundStats, list[asyncio.Task[Decision]]]:
        stats = RoundStats()
        owned = frozenset(self._owned)
        if not owned:
            return stats, []
        now = self._clock.now()
        loaded = await self._due_now(owned, now, stats)
        # Not a timer of a partition stopped while it was being loaded.
        decided = [
            guarded(functools.partial(expire_or_claim, t, now, self._options), t, now)
            for t in loaded
            if t.partition in self._owned and t.id not in self._in_hand
        ]
        decided += await self._taken_over(now)
        stats.lapsed = sum(
            1
            for d in decided
            if d.change is not None and d.change.loaded.status is TimerStatus.FIRING
        )
        local: list[Timer] = []
        remote: list[Timer] = []
        to_write: list[Decision] = []
        # Sends are not waited for: no more claimed than may be sent at once, the rest
        # loaded again when sends come back (a slow target holds no other timer up).
        room = self._options.max_in_flight - self.in_flight
        for d in decided:
            if d.change is None:
                continue
            local_target = self._local is not None and self._local.accepts(d.change.next)
            if d.send and not local_target:
                if room <= 0:
                    stats.deferred += 1
                    continue
                room -= 1
            if d.send and local_target:
                # Fired in-process: claimed by the partition transaction that decides it and
                # writes its outcome, so nothing is written before (nor can a fenced owner
                # commit either).
                self._in_hand[d.change.next.id] = d.change.loaded
                local.append(d.change.next)
            else:
                to_write.append(d)
        async with self._write_lock:
            written = await self._settle_exactly(to_write)
            for decision in written:
                assert decision.change is not None
                nxt = decision.change.next
                if not decision.send:
                    stats.expired += 1
                    self.offer([nxt])
                    if nxt.status is TimerStatus.PENDING:
                        stats.due_by(nxt.due_at)
                elif nxt.partition not in self._owned:
                    # Handed off while its claim was being written: given back unsent.
                    self._outcomes[nxt.partition].append(release(nxt, now))
                else:
                    remote.append(nxt)
            stats.lost_claims = sum(d.send for d in to_write) - sum(d.send for d in written)
            if stats.lost_claims:
                self.invalidate()  # rows changed behind the wheel's back: a reschedule?
        if local:
            assert self._local is not None
            self._local.fire(local)
        if stats.deferred:
            self.invalidate()  # taken from the wheel, not claimed: loaded again
        tasks = await self._send_remote(remote, stats)
        stats.claimed = len(local) + len(tasks)
        await self._flush(None, stats)
        await self._sweep(owned, now, stats)
        self._next_due(stats)
        return stats, tasks

    async def _sweep(self, owned: frozenset[int], now: int, stats: RoundStats) -> None:
        """One owned partition a round, in turn: at most `sweep_limit` of its finished rows
        past their retention deleted (a range scan of the store's finished index), so the
        sweep never holds a round up for long."""
        ordered = sorted(owned)
        partition = ordered[self._sweep_turn % len(ordered)]
        self._sweep_turn += 1
        async with self._write_lock:  # after a stop's last writes, never among them
            if partition not in self._owned:
                return
            try:
                stats.swept = await self._store.expire(
                    partition, now, self._options.finished_retention, self._options.sweep_limit
                )
            except Exception as exc:
                # Nothing was deleted (the changelog takes the tombstones first): next turn.
                logger.warning("sweeping partition %d's finished timers failed: %s", partition, exc)

    async def _taken_over(self, now: int) -> list[Decision]:
        """Claims again, at once, the FIRING rows of the partitions started since the last
        round: a previous owner's claims, which it can no longer settle (fenced)."""
        fresh, self._fresh = self._fresh & self._owned, set()
        if not fresh:
            return []
        horizon = now + self._options.claim_timeout + 1
        rows = await self._store.due(set(fresh), until=horizon, limit=_TAKE_OVER_LIMIT)
        return [
            guarded(functools.partial(reclaim, t, now, self._options), t, now)
            for t in rows
            if t.status is TimerStatus.FIRING and t.due_at > now
        ]

    async def _send_remote(
        self, claimed: list[Timer], stats: RoundStats
    ) -> list[asyncio.Task[Decision]]:
        """Sends the claimed timers whose targets are elsewhere, once their claims are
        committed: a fenced owner can commit no claim, so it sends nothing."""
        if not claimed:
            return []
        if self._before_send is not None:
            try:
                await self._before_send({t.partition for t in claimed})
            except Exception as exc:
                # Its partition is reset and restored: the claims never counted.
                logger.warning("%d claim(s) not committed, none sent: %s", len(claimed), exc)
                return []
        async with self._write_lock:
            return [self._spawn(t, stats) for t in claimed if t.partition in self._owned]

    async def _due_now(self, owned: frozenset[int], now: int, stats: RoundStats) -> list[Timer]:
        """The rows due now, from the wheel (see `Wheel.take_due`)."""
        taken, stats.full = await self._wheel.take_due(owned, now)
        stats.loaded = len(taken)
        return taken

    def _next_due(self, stats: RoundStats) -> None:
        if (next_due := self._wheel.next_due) is not None:
            stats.due_by(next_due)
        stats.reload_at = self._wheel.until

    def backlog(self, now: int) -> tuple[int, int | None]:
        """Due by `now` and neither sent nor fired yet: the wheel's rows due (not claimed
        yet) and the timers handed over to fire in-process (claimed, their partition's
        cycle not run yet); with the earliest due time among them. For metrics, read at a
        scrape: O(wheel), which holds at most `batch_limit` rows loaded plus the puts
        offered since, so the count is a lower bound when more than a load were due."""
        due = self._wheel.due(now, self._owned)
        due |= {t.id: t.due_at for t in self._in_hand.values()}  # as loaded, before the claim
        return len(due), min(due.values(), default=None)

    def offer(self, timers: Iterable[Timer]) -> None:
        """Puts rows just written (PENDING) in the wheel, when they fall within it."""
        self._wheel.offer(timers, self._owned)

    def invalidate(self) -> None:
        """The wheel is loaded again at the next round (rows changed behind its back)."""
        self._wheel.invalidate()

    async def still_due(self, claimed: Sequence[Timer]) -> list[Timer]:
        """Of the timers handed over to fire in-process, those whose rows are still as they
        were loaded (a cancel or reschedule may have come since): called by the partition's
        transaction just before it decides them."""
        kept: list[Timer] = []
        for t in claimed:
            loaded = self._in_hand.get(t.id)
            row = None if loaded is None else await self._store.find(t.owner, t.key)
            if loaded is not None and row is not None and row.same_as_loaded(loaded):
                kept.append(t)
            else:
                self._in_hand.pop(t.id, None)
        return kept

    async def record_outcomes(self, results: Sequence[tuple[Timer, SendResult]]) -> RoundStats:
        """Writes the outcomes of timers fired in-process (`LocalFirer`): called by the
        partition's transaction before it commits, so that each settle commits with the
        events it records; each a conditional write against the row as it was loaded.
        Raises when the write fails: the transaction must not commit."""
        stats = RoundStats()
        decisions: list[Decision] = []
        for claimed, result in results:
            loaded = self._in_hand.pop(claimed.id, None)
            if loaded is None:
                raise StoreError(f"{claimed.request_id} was fired but not handed over")
            d = self._decide(claimed, result)
            decisions.append(
                dataclasses.replace(
                    d,
                    change=_from_loaded(d.change, loaded),
                    fallback=_from_loaded(d.fallback, loaded),
                )
            )
        if not decisions:
            return stats
        # The ledger first, not under the write lock: its calls may take seconds, and
        # every partition's rounds and settles wait for that lock.
        final = await self._park(decisions, stats)
        async with self._write_lock:
            self._count_busy(final)
            changes = [d.change for d in final if d.change is not None]
            stats.written = await self._store.settle(changes)
        if stats.written != len(changes):
            raise StoreError(f"{len(changes) - stats.written} in-process outcome(s) not written")
        self.offer(c.next for c in changes)
        for change in changes:
            if change.next.status is TimerStatus.PENDING:
                stats.due_by(change.next.due_at)
        _count(stats, final)
        return stats

    def _spawn(self, claimed: Timer, stats: RoundStats) -> asyncio.Task[Decision]:
        task = asyncio.create_task(
            self._send_one(claimed, stats), name=f"send {claimed.request_id}"
        )
        bucket = self._in_flight[claimed.partition]
        bucket.add(task)
        task.add_done_callback(bucket.discard)
        task.add_done_callback(self._sent)
        return task

    def _sent(self, task: asyncio.Task[Decision]) -> None:
        if not task.cancelled() and (exc := task.exception()) is not None:
            # No outcome: its claim lapses and it is sent again, by this node or the next.
            logger.error("deciding the outcome of %s failed", task.get_name(), exc_info=exc)
        if self.on_outcome is not None:
            self.on_outcome()

    async def _send_one(self, claimed: Timer, stats: RoundStats) -> Decision:
        send: asyncio.Future[SendResult] | None = None
        try:
            async with self._gate:
                now = self._clock.now()
                # The send must end inside the claim, or another owner could send it too.
                deadline = min(now + self._options.send_timeout, claimed.due_at)
                if deadline <= now:
                    decision = release(claimed, now)
                else:
                    send = asyncio.ensure_future(self._sender.send(claimed))
                    stats.sent += 1
                    decision = self._decide(claimed, await self._until(claimed, send, deadline))
        except asyncio.CancelledError:
            # Cut short by a hand-off: a result already in is written all the same; without
            # one, the claim is given back so that the next owner need not wait for it.
            if send is not None and send.done() and not send.cancelled():
                decision = self._decide(claimed, _result_of(claimed, send))
            else:
                decision = release(claimed, self._clock.now())
            self._outcomes[claimed.partition].append(decision)
            raise
        self._outcomes[claimed.partition].append(decision)
        return decision

    def _decide(self, claimed: Timer, result: SendResult) -> Decision:
        busy = self._busy[claimed.partition].get(claimed.id, 0)
        now = self._clock.now()
        return guarded(
            functools.partial(on_outcome, claimed, result, now, self._options, busy), claimed, now
        )

    def _count_busy(self, decisions: Iterable[Decision]) -> None:
        # Kept only for a timer still in the wheel: a parked one starts over if retried, and
        # one the ledger refused to park keeps counting, as it was sent.
        for d in decisions:
            if d.change is None:
                continue
            timer = d.change.next
            counts = self._busy[timer.partition]
            if d.busy_in_a_row and timer.status is TimerStatus.PENDING:
                counts[timer.id] = d.busy_in_a_row
            else:
                counts.pop(timer.id, None)

    async def _until(
        self, claimed: Timer, send: asyncio.Future[SendResult], deadline: int
    ) -> SendResult:
        """The send's result by `deadline` on the runner's clock, else TIMEOUT."""
        expiry = asyncio.ensure_future(self._clock.sleep_until(deadline))
        try:
            racing: set[asyncio.Future[Any]] = {send, expiry}
            await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
        finally:
            expiry.cancel()
            if not send.done():
                send.cancel()
                # Waited for, so that no send outlives its claim; `wait` raises nothing of it.
                await asyncio.wait({send})
        if send.cancelled():
            return SendResult(TIMEOUT, f"no result within {self._options.send_timeout} ms")
        return _result_of(claimed, send)

    async def _flush(self, partitions: Set[int] | None, stats: RoundStats) -> None:
        """Writes the outcomes decided for `partitions` (all when None) in one batch, the
        targets of parks recorded in the ledger first."""
        # Flushes one at a time (stop_partition's after any that took its outcomes); the
        # ledger's calls are made outside the write lock, which every partition's rounds
        # and settles wait for.
        async with self._flush_lock:
            async with self._write_lock:
                keys = list(self._outcomes) if partitions is None else list(partitions)
                taken = [d for p in keys for d in self._outcomes.pop(p, [])]
            if not taken:
                return
            final = await self._park(taken, stats)
            async with self._write_lock:
                self._count_busy(final)
                changes = [d.change for d in final if d.change is not None]
                try:
                    stats.written = await self._store.settle(changes)
                except Exception:
                    # Not written: the claims lapse and are sent again; the target
                    # de-duplicates.
                    logger.exception("writing %d timer outcome(s) failed", len(changes))
                    return
        self.offer(c.next for c in changes)
        for change in changes:
            if change.next.status is TimerStatus.PENDING and change.next.partition in self._owned:
                stats.due_by(change.next.due_at)
        _count(stats, final)

    async def _park(self, decisions: list[Decision], stats: RoundStats) -> list[Decision]:
        """The decisions to write: a park once the ledger holds its target, and if the
        ledger refuses it, its fallback (the last attempt sent again after the backoff)."""
        by_target: dict[AggregateRef, list[Timer]] = defaultdict(list)
        for d in decisions:
            if d.park and d.change is not None:
                by_target[d.change.next.target].append(d.change.next)
        refused: set[AggregateRef] = set()
        for target, timers in by_target.items():
            try:
                await self._ledger.record(self.parked_subscription, target, timers)
            except Exception:
                logger.exception("the ledger refused target %s; its timers stay PENDING", target)
                stats.ledger_failures += len(timers)
                refused.add(target)
        return [
            unparked(d) if d.park and d.change and d.change.next.target in refused else d
            for d in decisions
        ]

    async def _settle_exactly(self, decisions: list[Decision]) -> list[Decision]:
        """Settles the decisions' changes in one batch; the decisions that were written."""
        changes = [d.change for d in decisions if d.change is not None]
        if not changes:
            return []
        count = await self._store.settle(changes)
        if count == len(changes):
            return decisions
        if count == 0:
            return []
        # The store says how many, not which: only then ask it which rows now hold our write.
        written = []
        for d in decisions:
            assert d.change is not None
            row = await self._store.find(d.change.next.owner, d.change.next.key)
            if row is not None and row.same_as_loaded(d.change.next):
                written.append(d)
        return written

    async def retry(self, target: AggregateRef, partitions: Iterable[int] | None = None) -> int:
        """An operator's retry: the PARKED timers of `target` due now, attempts reset, and its
        ledger entry resolved. Any node may call it; the partition's owner sends them.

        `partitions`: only the timers of these partitions (a node carrying out an operator's
        request read from one partition of the ops topic); all the store serves when None.
        """
        now = self._clock.now()
        return await self._operate(target, partitions, lambda t: retry_parked(t, now))

    async def skip(self, target: AggregateRef, partitions: Iterable[int] | None = None) -> int:
        """An operator's skip: the PARKED timers of `target` CANCELLED/SKIPPED, entry resolved;
        `partitions` as for `retry`."""
        return await self._operate(target, partitions, skip_parked)

    async def _operate(
        self,
        target: AggregateRef,
        partitions: Iterable[int] | None,
        decide: Callable[[Timer], Decision],
    ) -> int:
        only = None if partitions is None else frozenset(partitions)
        # Under the write lock, so that a park being written (ledger first, then the row)
        # is either all before this or all after it: never an entry resolved between the
        # two, which would leave a PARKED timer that no ledger entry names.
        async with self._write_lock:
            parked = [
                t for t in await self._store.parked(target) if only is None or t.partition in only
            ]
            changes = [d.change for d in map(decide, parked) if d.change is not None]
            written = await self._store.settle(changes) if changes else 0
            self.invalidate()
            # Resolved after the write: should the write fail, the entry stays for another try.
            await self._ledger.resolve(self.parked_subscription, target)
        logger.info(
            "operator on %s%s: %d of %d parked timer(s) changed",
            target,
            "" if only is None else f" in partition(s) {sorted(only)}",
            written,
            len(parked),
        )
        return written


_TAKE_OVER_LIMIT = 100_000


def _from_loaded(change: TimerChange | None, loaded: Timer) -> TimerChange | None:
    """`change` made against the row as loaded rather than the claim (never written)."""
    return None if change is None else TimerChange(loaded=loaded, next=change.next)


def reclaim(timer: Timer, now: int, options: TimerOptions) -> Decision:
    """A claim of a FIRING row as if its claim had lapsed now (the previous owner's, which
    is fenced): written conditionally against the row as it is."""
    decision = expire_or_claim(timer.model_copy(update={"due_at": now}), now, options)
    if decision.change is None:
        return decision
    change = decision.change.model_copy(update={"loaded": timer})
    return Decision(decision.action, change, decision.send, decision.fallback)


def _result_of(claimed: Timer, send: asyncio.Future[SendResult]) -> SendResult:
    """A finished send's result; an exception is a technical failure (no transport)."""
    exc = send.exception()
    if exc is not None:
        logger.warning("send of %s failed: %r", claimed.request_id, exc)
        return SendResult(TRANSPORT_ERROR, repr(exc))
    return send.result()


def _count(stats: RoundStats, decisions: Iterable[Decision]) -> None:
    for d in decisions:
        match d.action:
            case Action.FIRE | Action.NEXT_SLOT:
                stats.fired += 1
            case Action.RETRY:
                stats.retried += 1
            case Action.BUSY:
                stats.busy += 1
            case Action.PARK:
                stats.parked += 1
            case Action.RELEASE:
                stats.released += 1
