"""`PartitionFiring`: one partition's timer firing, from `start_partition` to
`stop_partition`: its wheel, which of its timers fire in-process (`InProcessTargets`) and
those claimed to, waiting for its cycle to ask for them, its sends in flight and their
outcomes not written yet, whether it was just started (a previous owner's claims taken
over), its BUSY counts, its own rounds' state (`rounds`: lock, burst, sweep) and whether
a send of it was answered since, its write lock and the fault that stopped it, and the
store its calls reach (`store`: a node's task gives its partition's own handle, so a
firing whose partition was let go writes nothing; None: the runner's). A node's partition
task holds it (the runner keeps a reference for its rounds); nothing in it is shared with
another partition: a partition's stop drops it whole.

Its lock (`locked`) is held across a store call only, never across a ledger or Kafka call:
its claims, outcome writes, sweep and stop wait on no other partition's. Whoever holds
the locks of several partitions takes them in partition order, so none waits in a cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final, NamedTuple

from app.timers.runner.decision_types import Decision
from app.timers.runner.decisions import SendResult, guarded, on_outcome
from app.timers.runner.options import TimerOptions
from app.timers.runner.ports import FiringStore
from app.timers.runner.round_state import RoundState
from app.timers.runner.wheel import Wheel
from app.timers.unparked import Unparked
from tables.partitioner import partition_of
from tables.refs import AggregateRef
from tables.timer import Timer, TimerStatus

__all__ = [
    "BUSY_LOOKS",
    "BUSY_LOOK_EVERY_MS",
    "BusyCount",
    "InProcessTargets",
    "PartitionFiring",
    "backlog_of",
    "begin_write",
    "locked",
    "offer_to",
    "writing",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class InProcessTargets:
    """The targets a node decides itself in a partition whose commands it decides: the
    aggregates of this type (`context`, `aggregate`) that live in the timer's own partition
    (its owner, by default). Their timers fire in the partition's own cycle, in its
    transaction, rather than round trip through the command topic."""

    context: str
    aggregate: str
    partitions: int

    def accepts(self, timer: Timer) -> bool:
        target = timer.target
        if target.context != self.context or target.aggregate != self.aggregate:
            return False
        # Identity first: a row whose target is its owner holds one object for both (rowload).
        owner = timer.owner
        return (
            target is owner
            or target == owner
            or partition_of(target.id, self.partitions) == timer.partition
        )


class BusyCount(NamedTuple):
    """A timer's BUSY refusals in a row (`PartitionFiring.busy`), with its row's key."""

    in_a_row: int
    owner: AggregateRef
    key: str


BUSY_LOOKS: Final = 100
"""How many BUSY counts a partition's round looks up in the store at most (`prune_busy`):
point reads, ~1 ms at most on RocksDB."""

BUSY_LOOK_EVERY_MS: Final = 1_000
"""How long a partition's look at its BUSY counts that dropped none waits for the next
(`prune_busy`): a backlog's rounds, which may run every few ms, whose counts are all of
live timers, do not read `BUSY_LOOKS` rows each."""

_LIVE: Final = frozenset({TimerStatus.PENDING, TimerStatus.FIRING})


class PartitionFiring:
    """One partition's firing state (the runner's, per partition it fires)."""

    def __init__(
        self,
        partition: int,
        wheel: Wheel,
        in_process: InProcessTargets | None = None,
        store: FiringStore | None = None,
    ) -> None:
        self.partition = partition
        self.wheel = wheel
        # The store its calls reach (`partition_store`): its partition's own (a node's
        # task's handle, refused once the partition is let go), or None: the runner's.
        self.store = store
        # None: every timer of it is sent (its commands are not decided here).
        self.in_process = in_process
        # Started since the last round: its FIRING rows are a previous owner's claims (or
        # cut short here), sent again at once rather than at their lapse.
        self.fresh = True
        # Timers handed over to fire in-process, by id: the row as loaded, which their
        # outcome's conditional write is made against.
        self.in_hand: dict[str, Timer] = {}
        # Of those, the claims its cycle has not asked for yet (`take_handed`).
        self.handed: list[Timer] = []
        self.in_flight: set[asyncio.Task[Decision]] = set()
        # The ids of its timers whose send runs: a claim of one that lapsed meanwhile (the
        # clock jumped forward past its deadline) is neither claimed again under it (two
        # sends of one claim at once) nor expired (a command the target may have applied).
        self.sending: set[str] = set()
        # Outcomes decided but not written yet, so that its stop can write them before the
        # hand-off without waiting for the round.
        self.outcomes: list[Decision] = []
        # BUSY refusals in a row, by timer id: this node's memory only. An entry whose row
        # left by another hand (cancelled, replaced, deleted with its owner, paused) is
        # dropped by a later round's look (`prune_busy`), a bounded number a round.
        self.busy: dict[str, BusyCount] = {}
        # Not looked at again before (runner's clock, ms).
        self.busy_look_at = 0
        # Its own rounds' state (`TimerRunner.partition_round`): their lock, burst, sweep.
        self.rounds = RoundState()
        # Set when a send of it is answered: its next round writes the outcome at once.
        self.answered = asyncio.Event()
        # Its write lock (see the module): a claim batch, an outcome write, a sweep, a stop.
        self.lock = asyncio.Lock()
        # Set by its stop, under its lock: nothing of it is claimed, sent or swept after.
        self.stopped = False
        # The store failed in it (a corrupt row): nothing of it is loaded, claimed or swept
        # any more; its owner lets it go and restores it (a task closes dirty, is revived).
        self.fault: BaseException | None = None
        # Its outcome writes under way, each from taking its outcomes (a park's ledger
        # record first) to their rows written: its stop, and an operator's request on its
        # parked timers, wait for them (`written`), not for a lock.
        self.writing: set[asyncio.Future[None]] = set()
        # Targets whose PARKED rows an operator's request settled in its cycle (which calls
        # no ledger): their entries resolved by its next round (`operating.resolve_pending`).
        self.resolving: list[AggregateRef] = []
        # Of those, the ones whose PARKED rows it settled, with the tries left when the
        # ledger holds no entry of them (one should be open: another node's park, perhaps
        # not followed here yet): asked again after the wait, then let be.
        self.expecting: dict[AggregateRef, int] = {}
        # Not tried again before (runner's clock, ms): the last try failed, or found no
        # entry where one was expected.
        self.resolve_after = 0
        # Its rows that left PARKED by any write (a cancel, a replace, an owner deleted),
        # noted by its changelog sink: its next round takes their names out of the ledger
        # (`app.timers.unparked`; `operating.tend_ledger`).
        self.unparked = Unparked(partition)
        # When its PARKED timers are next checked for an open ledger entry
        # (`operating.name_unnamed`; runner's clock, ms): at its first round when its
        # owner asks, None once done.
        self.naming_at: int | None = None

    def __repr__(self) -> str:
        return f"PartitionFiring({self.partition})"

    @property
    def live(self) -> bool:
        """Whether its timers are claimed (neither stopped nor failed)."""
        return not self.stopped and self.fault is None

    def fail(self, exc: BaseException) -> None:
        """The store failed in it: its firing stops here (`fault`), for its owner to see."""
        if self.fault is None:
            self.fault = exc
            logger.error(
                "timers of partition %d: the store failed, stopped: %s", self.partition, exc
            )

    async def written(self) -> None:
        """Returns once the outcome writes under way now are done."""
        if self.writing:
            await asyncio.wait(list(self.writing))

    def fires_in_process(self, timer: Timer) -> bool:
        return self.in_process is not None and self.in_process.accepts(timer)

    def hand(self, loaded: Timer, claimed: Timer) -> None:
        """Keeps `claimed` (the claim of `loaded`, not written) for its cycle to fire."""
        self.in_hand[claimed.id] = loaded
        self.handed.append(claimed)

    def take_handed(self) -> list[Timer]:
        taken, self.handed = self.handed, []
        return taken

    def offer(self, timers: Iterable[Timer]) -> None:
        """Puts its rows just written (PENDING) in its wheel, when they fall within it."""
        self.wheel.offer(timers, {self.partition})

    def backlog(self, now: int) -> dict[str, int]:
        """Due by `now` and neither sent nor fired yet, by id: its wheel's rows due and its
        timers handed over to fire in-process (as loaded, before the claim)."""
        due = self.wheel.due(now, {self.partition})
        due |= {t.id: t.due_at for t in self.in_hand.values()}
        return due

    def take_outcomes(self) -> list[Decision]:
        taken, self.outcomes = self.outcomes, []
        return taken

    def decide(
        self, claimed: Timer, result: SendResult, now: int, options: TimerOptions
    ) -> Decision:
        """What `claimed` becomes on `result`, its BUSY refusals in a row counted."""
        busy = counted.in_a_row if (counted := self.busy.get(claimed.id)) else 0
        return guarded(
            functools.partial(on_outcome, claimed, result, now, options, busy), claimed, now
        )

    def count_busy(self, decisions: Iterable[Decision]) -> None:
        # Kept only for a timer still in the wheel: a parked one starts over if retried, and
        # one the ledger refused to park keeps counting, as it was sent.
        for d in decisions:
            if d.change is None:
                continue
            timer = d.change.next
            if d.busy_in_a_row and timer.status is TimerStatus.PENDING:
                self.busy[timer.id] = BusyCount(d.busy_in_a_row, timer.owner, timer.key)
            else:
                self.busy.pop(timer.id, None)

    async def prune_busy(self, store: FiringStore, now: int, limit: int = BUSY_LOOKS) -> int:
        """Looks up the rows of the `limit` BUSY counts looked at least lately, and drops
        those whose rows left PENDING and FIRING by another hand (their next outcome,
        which would pop them, never comes); how many it dropped. The ones kept go last
        in turn: every count is looked at within `len(busy) / limit` looks. A look that
        dropped none waits `BUSY_LOOK_EVERY_MS` (`now`: the runner's clock) for the next;
        one that dropped some looks again at the next round."""
        if now < self.busy_look_at:
            return 0
        self.busy_look_at = now + BUSY_LOOK_EVERY_MS
        looked = list(itertools.islice(self.busy.items(), limit))
        gone: set[str] = set()
        try:
            for timer_id, counted in looked:
                row = await store.find(counted.owner, counted.key)
                if row is None or row.id != timer_id or row.status not in _LIVE:
                    gone.add(timer_id)
        except Exception as exc:
            # Only memory at stake: looked at again on a later turn.
            logger.warning("partition %d: BUSY counts not looked at: %r", self.partition, exc)
        for timer_id, counted in looked:
            if self.busy.get(timer_id) is not counted:
                continue  # its own outcome counted it meanwhile: as it says
            del self.busy[timer_id]
            if timer_id not in gone:
                self.busy[timer_id] = counted  # last in turn
        if gone:
            self.busy_look_at = now  # perhaps more of them: not held back
        return len(gone)

    async def cut_short(self) -> int:
        """Cancels its sends in flight (their claims given back, or results already in
        kept) and waits for them; how many there were."""
        tasks = list(self.in_flight)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        return len(tasks)


def backlog_of(firings: Iterable[PartitionFiring], now: int) -> tuple[int, int | None]:
    """Due by `now` and neither sent nor fired yet: the wheels' rows due (not claimed yet)
    and the timers handed over to fire in-process (claimed, their partition's cycle not run
    yet); with the earliest due time among them. O(wheel), which holds at most
    `batch_limit` rows loaded plus the puts offered since, so the count is a lower bound
    when more than a load were due."""
    due: dict[str, int] = {}
    for f in firings:
        due |= f.backlog(now)
    return len(due), min(due.values(), default=None)


def offer_to(firings: Mapping[int, PartitionFiring], timers: Iterable[Timer]) -> None:
    """Puts rows just written (PENDING) in their partitions' wheels, when they fall within
    them (a partition not fired here: nowhere)."""
    for t in timers:
        if (f := firings.get(t.partition)) is not None:
            f.offer((t,))


@contextlib.asynccontextmanager
async def locked(firings: Iterable[PartitionFiring]) -> AsyncIterator[None]:
    """Holds the write locks of `firings`, taken in partition order (see the module)."""
    async with contextlib.AsyncExitStack() as stack:
        for f in sorted(set(firings), key=lambda f: f.partition):
            await stack.enter_async_context(f.lock)
        yield


def begin_write(firings: Iterable[PartitionFiring]) -> Callable[[], None]:
    """An outcome write of `firings` under way (`PartitionFiring.writing`) from now until
    the function returned is called."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    held = list(firings)
    for f in held:
        f.writing.add(done)

    def end() -> None:
        for f in held:
            f.writing.discard(done)
        if not done.done():
            done.set_result(None)

    return end


@contextlib.contextmanager
def writing(firings: Iterable[PartitionFiring]) -> Iterator[None]:
    """An outcome write of `firings` under way while it runs (`begin_write`)."""
    end = begin_write(firings)
    try:
        yield
    finally:
        end()
