"""A partition task's timer loop (`PartitionTimerLoop`, of the task's type): its own rounds
(`TimerRunner.partition_round`), so that no partition's timers wait on another's store
calls, burst or commits. It wakes at its firing's next due time, when a send of it is
answered (`PartitionFiring.answered`), when puts are offered to its wheel, or when the
task's cycle asks (`wake`); each round, its partition's cycle is woken when timers are
claimed to fire in-process there (it asks the runner for them, and decides them with its
commands in its transaction), and the claims of remote timers are committed in the
partition's own transaction (`Commits.commit_claims`) before the runner is told it may
send them (`Round.claims_committed`). In a burst, its rounds take no slice while the
burst's first commit is in flight (`_hold_for_first_commit`). A fault of the store in
its partition (`Round.failed`: a corrupt row) fails its task alone, which closes dirty
and is revived; so do rounds that raise `FAILED_ROUNDS` times in a row.

It runs from its task's `start_firing` until its firing is no longer the runner's, is
stopped (its task's close), or failed (the store failed in it: its task is told, even
when the round that failed it raised before it could say so): then it ends by itself,
never holding a lock of another partition. Rows due that its share of the sends has no
room for wait for an answer, a wake-up or the poll interval: never a round at once."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from app.node.commits import Commits
from app.node.cycles import PartitionCycles
from app.node.kept import KeptType
from app.node.task_id import TaskId
from app.timers.runner import PartitionFiring, Round, RoundStats, TimerLoop, TimerRunner
from app.timers.runner.slow_start import HELD_AT_MOST_MS

__all__ = ["FAILED_ROUNDS", "FiringTask", "PartitionTimerLoop", "TypeLoops"]

logger = logging.getLogger(__name__)

FAILED_ROUNDS = 5
"""How many rounds of a partition may fail in a row before its task is closed and taken
afresh (a round that raises; a `StoreError` fails it at once, `Round.failed`): more than
the loop's own `failing` count, so that `/healthz` says so meanwhile."""


class FiringTask(Protocol):
    """The task running a type's partition, as its timer loop sees it (`PartitionTask`)."""

    @property
    def firing(self) -> PartitionFiring | None:
        """Its partition's firing (held from its start to its close)."""
        ...

    def failed(self, what: str, exc: BaseException) -> None:
        """Its work failed: it is closed dirty and taken afresh."""
        ...

    def worked(self, what: str) -> None:
        """Its `what` worked: a failure of it before counts no more."""
        ...


@dataclass(frozen=True, slots=True)
class TypeLoops:
    """What every timer loop of a type works with, the node's (`NodeTimerLoop`) and each
    partition's: the type's runner, its name (its `KeptType` found in `types` once kept),
    the node's commits and cycles, `running` (the task running each type's partition), and
    what is told each round's stats."""

    runner: TimerRunner
    type_name: str
    types: Mapping[str, KeptType]
    commits: Commits
    cycles: PartitionCycles
    running: Mapping[TaskId, object]
    on_round: Callable[[RoundStats], None] | None = None


class PartitionTimerLoop(TimerLoop):
    """The rounds of `firing` (its partition's, of the type of `shared`), driven for
    `task`."""

    def __init__(self, shared: TypeLoops, firing: PartitionFiring, task: FiringTask) -> None:
        super().__init__(shared.runner, shared.on_round)
        self.firing = firing
        self.p = firing.partition
        # Its task (`_task` is the loop's own asyncio task).
        self._owner = task
        self._type_name = shared.type_name
        # What its task is told failed, and worked once a round passes.
        self._rounds = f"the timer rounds of {shared.type_name}"
        self._store = f"the timer store of {shared.type_name}"
        # Apart from the rounds: the claim and send rounds between two failed outcome
        # writes pass, and a take's first rounds too, so a fault that never passes would
        # be forgotten each time and retaken at once, again and again (no backoff).
        self._writes = f"the timer outcome writes of {shared.type_name}"
        self._types = shared.types
        self._commits = shared.commits
        self._cycles = shared.cycles
        self._running = shared.running
        # Its own wake-up on answers: another partition's sends never wake it.
        self._answered = firing.answered
        # A burst under way in it (`PartitionFiring.rounds`): its commits landed when the
        # burst began (None: it fires nothing in-process in this burst yet), and whether
        # one has landed since.
        self._landed_before: int | None = None
        self._landed = False
        self._began = 0
        # Set by `end()` and `stop()`: a hold in progress ends at once (not on `_wake`,
        # which every put or answer of a burst sets).
        self._ended = asyncio.Event()

    def wake(self, *, reload: bool = True) -> None:
        """Runs its next round now; `reload`: its wheel is loaded again first."""
        if reload:
            self.firing.wheel.invalidate()
        self._wake.set()

    def end(self) -> None:
        """Ends it after the round in progress, not waited for (its task's close)."""
        self._stopping = True
        self._ended.set()
        self._wake.set()

    def start(self) -> None:
        if not self.running:
            self._ended.clear()  # a loop started again holds as a new one
        was = self._task
        super().start()
        if self._task is not None and self._task is not was:
            self._task.add_done_callback(self._run_ended)

    def _run_ended(self, run: asyncio.Task[None]) -> None:
        """A run that ended other than by `end()` or `stop()` (a BaseException out of a
        round, such as a cancel leaking from a client call; a cancel from elsewhere) fails
        its task, closed dirty and taken afresh: never a partition whose timers no longer
        fire while its commands are decided and `/healthz` says ready."""
        if self._stopping or not self._current():
            return
        exc = None if run.cancelled() else run.exception()
        self._owner.failed(self._rounds, exc or RuntimeError("its timer loop was cancelled"))

    async def stop(self) -> None:
        """Ends it after the round in progress, cutting a hold short (the node's stop)."""
        self._ended.set()
        await super().stop()

    def when_done(self, callback: Callable[[object], None]) -> None:
        """`callback` once its run is over (now, when it does not run)."""
        if self._task is None:
            callback(None)
        else:
            self._task.add_done_callback(callback)

    def _current(self) -> bool:
        """Whether its firing is still its partition's in the runner, and not stopped (a
        faulted one is: its fault is for its task to hear, `round`)."""
        return not self.firing.stopped and self._runner.firing_of(self.p) is self.firing

    def _burst_may_grow(self) -> bool:
        """Whether its burst's slice may double (`slow_start`): once the first of its
        commits landed (its first timers fired), not before, so that the round trips of
        those commits never wait behind a turn of the loop grown large; or once it was
        held `HELD_AT_MOST_MS` (a slow broker). Claims of timers sent, not fired here,
        commit within the round: nothing to wait for."""
        if not self.firing.rounds.bursting:
            self._landed_before = None
            self._landed = False
            self._began = self._clock.now()  # a burst that begins at this round, if one
            return True
        return self._awaiting_first_commit() is None or self._held_left_ms() == 0

    def _awaiting_first_commit(self) -> KeptType | None:
        """The type, while its burst's first commit of p has not landed (None: no burst
        under way fires here, or it landed: noted in `_landed` once seen)."""
        if not self.firing.rounds.bursting or self._landed or self._landed_before is None:
            return None
        kept = self._types.get(self._type_name)
        if kept is None:
            return None
        self._landed = self._commits.landed(kept, self.p) > self._landed_before
        return None if self._landed else kept

    def _held_left_ms(self) -> int:
        """What is left of `HELD_AT_MOST_MS` since the burst began: 0 once up, and when the
        wall clock stepped back since (never a hold until it catches up)."""
        held_ms = self._clock.now() - self._began
        return HELD_AT_MOST_MS - held_ms if 0 <= held_ms < HELD_AT_MOST_MS else 0

    async def round(self) -> RoundStats:
        try:
            stats = await self._round()
        except Exception as exc:
            # A store call that raised something other than `StoreError` (a bug: RocksDB's
            # own read errors are `StoreError`s of their partition now): tried again,
            # and after `FAILED_ROUNDS` in a row its task is closed dirty and taken afresh
            # (its local copy restored), never a partition that stops firing while the rest
            # of the node goes on.
            self._round_failed(exc, self.failures_in_a_row, self._rounds)
            raise
        if stats.write_failures:  # not written, its claims sent again: as a round that raised
            self._round_failed(
                RuntimeError(f"{stats.write_failures} outcome write(s) failed"),
                self.write_failures_in_a_row,
                self._writes,
            )
        elif self.writes_passed(stats):
            self._owner.worked(self._writes)
        return stats

    def _round_failed(self, exc: Exception, in_a_row: int, what: str) -> None:
        """A failed round (`in_a_row` before it, of `what`): after `FAILED_ROUNDS` in a row
        its task is told (`what` failed) and the loop stops."""
        if in_a_row + 1 >= FAILED_ROUNDS and self._current():
            self._stopping = True
            self._owner.failed(what, exc)

    async def _round(self) -> RoundStats:
        await self._hold_for_first_commit()  # before the checks: its task may close meanwhile
        if self._stopping or not self._current():
            self._stopping = True  # stopped: its task's next firing has a loop
            return RoundStats()
        if (fault := self.firing.fault) is not None:
            # Failed in a round that raised before it could say so: its task hears it now
            # (closed dirty, revived with a firing and a loop of its own), never nothing.
            self._stopping = True
            self._owner.failed(self._store, fault)
            return RoundStats()
        p = self.p
        kept = self._types.get(self._type_name)
        # A commit of p in flight before this round's claims: earlier work, none of them.
        before = None if kept is None else self._commits.running(kept, p)
        async with self._runner.partition_round(
            p, grow=self._burst_may_grow(), of=self.firing
        ) as r:
            if p in r.in_process:
                self._cycles.fire_local(self._type_name, p)
                if self.firing.rounds.bursting and kept and self._landed_before is None:
                    # A commit of p that lands from now on is one of the burst's, but for
                    # the one in flight since before the claims, if it still is.
                    earlier = before is not None and self._commits.running(kept, p) is before
                    self._landed_before = self._commits.landed(kept, p) + earlier
            if p in r.to_commit:
                await self._commit_claims(r)
        self._fail_task(r)
        if not r.failed:
            self._owner.worked(self._rounds)
            self._owner.worked(self._store)
        return r.stats

    async def _hold_for_first_commit(self) -> None:
        """In a burst, no further slice is taken while the burst's first commit of its
        partition is in flight (the one firing its first timers), for `HELD_AT_MOST_MS`
        at most from the burst's start: the next slices' rounds and cycles would take the
        turns of the loop that its requests and their answers wait for (10,000 due at
        once, aiokafka's producers on the node's loop: first fire ~130 -> ~40 ms after
        due, docs/performance.md). A commit of earlier work still in flight is waited
        for, then the burst's own if it follows at once; its round goes on when none is in
        flight, or the time is up; `end()` or `stop()` ends it at once."""
        loop = asyncio.get_running_loop()
        until = loop.time() + self._held_left_ms() / 1000  # then timed by the loop
        ended: asyncio.Task[bool] | None = None
        try:
            while not self._stopping and (kept := self._awaiting_first_commit()) is not None:
                commit = self._commits.running(kept, self.p)
                if (left := until - loop.time()) <= 0 or commit is None:
                    return
                ended = ended or asyncio.create_task(self._ended.wait())
                await asyncio.wait(
                    [commit, ended], timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
        finally:
            if ended is not None:
                ended.cancel()

    async def _commit_claims(self, r: Round) -> None:
        """Commits the round's claims in p's transaction (its task's, only while it runs
        p): a fenced owner commits none, so it sends nothing."""
        if self._running.get(TaskId(self._type_name, self.p)) is not self._owner:
            logger.warning("partition %d: its task runs no more, claims not sent", self.p)
            return
        try:
            await self._commits.commit_claims(self._types[self._type_name], {self.p})
        except Exception as exc:
            logger.warning("partition %d: claims not committed, none sent: %s", self.p, exc)
        else:
            r.claims_committed({self.p})

    def _fail_task(self, r: Round) -> None:
        """Its task, when the store failed in its firing: closed dirty and revived, its
        local copy dropped and restored from its changelog; no other task is touched."""
        for firing, exc in r.failed.values():
            if self._owner.firing is firing:
                self._owner.failed(self._store, exc)
