"""When each partition task's transaction commits: a quiet partition at once, a busy one
at most every commit interval, one commit in flight per task (a type's partition), in the
background; the runner's claims before their commands leave (`commit_claims`). A failed
commit ends the work of its task (`PartitionCommits.on_failure`): it is let go and taken
afresh, no other type's task of the partition touched.

Each partition task keeps its own scheduling (`app.node.partition_commits`: when its last
commit started, the one in flight, its offsets passed over); `Commits` is the node-wide
piece, which finds the task that runs a type's partition and goes over the running tasks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from app.errors import KafkaUnavailable
from app.node.kept import KeptType
from app.node.partition_commits import PartitionCommits, commit_lags
from app.node.task_id import TaskId
from app.task_ends import cancelled_here

__all__ = ["COMMIT_DEADLINE_S", "Commits", "Committing"]

COMMIT_DEADLINE_S = 30.0
"""A commit not done by then is given up: its partition is let go and taken afresh (below
the producers' 60 s transaction timeout; /healthz's bound on the commit lag is half of it,
so that a commit stuck shows before its partition is let go)."""

MAX_STAGED = 10_000
"""Records waiting for a partition's transaction of one type beyond which its cycles wait
for the commit in flight: a hung or slow commit holds the poll loop, not memory."""


class Committing(Protocol):
    """A running partition task (a type's partition), as the node-wide commits see it."""

    @property
    def commits(self) -> PartitionCommits: ...

    @property
    def lock(self) -> asyncio.Lock:
        """Held by its cycle and around taking its transaction, so that what a cycle
        writes (events, settles) commits in one transaction (its input's)."""
        ...

    @property
    def cut_short(self) -> bool:
        """Whether its input is stopped or a cycle of it was cut short: what its
        transaction held was thrown away, and nothing of it may count as committed."""
        ...


class Commits:
    """The node's commits: each call goes to the commits of the task that runs the type's
    partition (none: nothing is started, nothing waited for); `run` goes over them all.
    `running` is the node's map of the task running each type's partition; `clock`, the
    monotonic clock the lags are read by (as its tasks' commits' own)."""

    def __init__(
        self,
        interval_ms: int,
        running: Mapping[TaskId, Committing],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._interval = interval_ms / 1000
        self._tick = min(interval_ms, 10) / 1000
        self._running = running
        self._clock = clock
        self.deadline_s = COMMIT_DEADLINE_S
        self.max_staged = MAX_STAGED
        # Since when each partition's offsets taken by the poll loop wait for the group's
        # commit (`take_offsets`, `offsets_landed`).
        self._unlanded: dict[int, float] = {}
        # The tasks' commits whose offsets the poll loop's commit in flight holds.
        self._plain: list[PartitionCommits] = []

    def _of(self, kept: KeptType, p: int) -> PartitionCommits | None:
        task = self._running.get(TaskId(kept.name, p))
        return None if task is None else task.commits

    def in_flight(self, kept: KeptType, p: int) -> bool:
        return self.running(kept, p) is not None

    def running(self, kept: KeptType, p: int) -> asyncio.Task[bool] | None:
        """p's commit of `kept` in flight, if any (a burst's timer loop waits for its first)."""
        return None if (own := self._of(kept, p)) is None else own.running()

    def landed(self, kept: KeptType, p: int) -> int:
        """How many of p's commits of `kept` committed since its task took p (a burst's
        timer loop watches them land)."""
        return 0 if (own := self._of(kept, p)) is None else own.landed

    def lag(self) -> float:
        """How long the oldest commit not landed has been going, in seconds (0: none)."""
        return max(self.lags().values(), default=0.0)

    def lags(self) -> dict[int, float]:
        """Per partition with a commit not landed, how long its oldest has been going, in
        seconds: a transaction's in flight (one that hangs holds every later write of its
        partition back) or the group's commit of its offsets passed over (one that hangs
        holds the poll loop, every partition's reading). Readiness."""
        now = self._clock()
        lags = commit_lags([task.commits for task in list(self._running.values())], now)
        for p, since in self._unlanded.items():
            lags[p] = max(lags.get(p, 0.0), now - since)
        return lags

    def pass_over(self, kept: KeptType, offsets: dict[tuple[str, int], int]) -> None:
        """Offsets of `kept`'s topics read and done with nothing to write: the poll loop
        commits them."""
        for key, offset in offsets.items():
            if (own := self._of(kept, key[1])) is not None:
                own.pass_over(key, offset)

    def take_offsets(self) -> dict[tuple[str, int], int]:
        """The offsets passed over, for the poll loop to commit to the group (then
        `offsets_landed`). A partition's wait counts from the first of its offsets taken
        and not landed since: those of a commit that failed are given up, and the next
        of it wait on (a coordinator away fails each commit after up to 30 s, the poll
        loop passing between them)."""
        done: dict[tuple[str, int], int] = {}
        self._plain = []
        for task in list(self._running.values()):
            if taken := task.commits.offsets_to_commit():
                done |= taken
                self._plain.append(task.commits)
        now = self._clock()
        self._unlanded = {p: self._unlanded.get(p, now) for _, p in done}
        return done

    def offsets_landed(self) -> None:
        """The group committed the offsets last taken."""
        self._unlanded = {}

    def offsets_ended(self) -> None:
        """The poll loop's commit of the offsets last taken ended, landed or not: the
        transactions that waited for it may go."""
        plain, self._plain = self._plain, []
        for own in plain:
            own.offsets_ended()

    def may_commit(self, kept: KeptType, p: int) -> bool:
        """Whether p of `kept` may start a commit now: none in flight (the next takes all
        that waits meanwhile), and the last started a commit interval ago."""
        own = self._of(kept, p)
        return own is not None and own.may_commit(self._interval)

    def start(self, kept: KeptType, p: int) -> asyncio.Task[bool] | None:
        """Takes what waits in p's transaction of `kept` (under its task's lock, so that no
        cycle is cut in two) and commits it in the background; the commit (True:
        committed). One commit in flight at a time: while one is, nothing is taken and that
        one is returned (what waits goes in the next); None: nothing in flight and nothing
        waits, or no task runs p of `kept` (what waits is its close's)."""
        own = self._of(kept, p)
        return None if own is None else own.start(self.deadline_s)

    async def room(self, kept: KeptType, p: int) -> None:
        """Waits while the work waiting for p's transaction of `kept` is over `max_staged`
        with a commit in flight (bounded: each commit has a deadline)."""
        if (own := self._of(kept, p)) is not None:
            await own.room(self.max_staged)

    async def run(self, types: Mapping[str, KeptType]) -> None:
        """Commits what waits in each running task's transaction as soon as it may: the
        cycles' staged work and the runners' writes."""
        while True:
            await asyncio.sleep(self._tick)
            for key, task in list(self._running.items()):
                kept = types.get(key.type_name)
                if kept is None or not task.commits.waits() or not self.may_commit(kept, key.p):
                    continue
                if task.lock.locked():
                    continue  # a cycle of it: it commits at its end, or a later tick
                async with task.lock:
                    # Not after a revoke cut its cycle short (as `commit_claims`): the
                    # half cycle was thrown away, p is being let go.
                    mine = self._running.get(key) is task and task.commits.owns()
                    if mine and not task.cut_short:
                        self.start(kept, key.p)

    async def commit_claims(self, kept: KeptType, partitions: set[int]) -> None:
        """Commits the claims of a partition's timer round (`PartitionTimerLoop`) before
        their commands leave: each partition's in its own transaction, taken under its task's
        lock (never in the middle of a cycle)."""
        for p in sorted(partitions):
            key = TaskId(kept.name, p)
            while True:
                if (task := self._running.get(key)) is None:
                    raise KafkaUnavailable(f"partition {p} is not owned")
                async with task.lock:
                    if self._running.get(key) is not task or not task.commits.owns():
                        raise KafkaUnavailable(f"partition {p} is not owned")
                    if task.cut_short:
                        # A revoke cut p's cycle short while the claims waited for the
                        # lock: its discard threw their rows away with the half cycle.
                        raise KafkaUnavailable(f"partition {p} is being let go")
                    earlier = self.in_flight(kept, p)  # then the claims wait for the next
                    commit = self.start(kept, p)
                if commit is None:
                    break
                try:
                    committed = await asyncio.shield(commit)
                except asyncio.CancelledError:
                    if cancelled_here():
                        raise
                    committed = False  # the partition was let go meanwhile
                if not committed:
                    raise KafkaUnavailable(f"partition {p}: claims not committed")
                if not earlier:
                    break
