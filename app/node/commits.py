"""When each partition's transaction commits: a quiet partition at once, a busy one at
most every commit interval, one commit in flight per partition and type, in the
background; the runner's claims before their commands leave (`commit_claims`). A failed
commit ends the partition's work (`on_failure`): it is let go and taken afresh."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable

from app.errors import KafkaUnavailable
from app.node.kept import KeptType
from app.node.partition_transaction import Transaction

__all__ = ["Commits", "OnFailure"]

logger = logging.getLogger(__name__)

OnFailure = Callable[[int, str, BaseException], None]
"""Told the partition whose work failed, what failed and why."""

COMMIT_DEADLINE_S = 30.0
"""A commit not done by then is given up: its partition is let go and taken afresh (below
the producers' 60 s transaction timeout, and /healthz's bound on the commit lag)."""

MAX_STAGED = 10_000
"""Records waiting for a partition's transaction of one type beyond which its cycles wait
for the commit in flight: a hung or slow commit holds the poll loop, not memory."""


class Commits:
    def __init__(
        self,
        interval_ms: int,
        locks: defaultdict[int, asyncio.Lock],
        owns: Callable[[int], bool],
        on_failure: OnFailure,
    ) -> None:
        self._interval = interval_ms / 1000
        self._tick = min(interval_ms, 10) / 1000
        # A partition's lock: held by its cycle and around taking its transaction, so that
        # what a cycle writes (events, settles) commits in one transaction.
        self._locks = locks
        self._owns = owns
        self._on_failure = on_failure
        # Per type and partition: when its last commit started, and the one in flight.
        self._started_at: dict[tuple[str, int], float] = {}
        self._in_flight: dict[tuple[str, int], asyncio.Task[bool]] = {}
        # Offsets of batches that wrote nothing: committed by the poll loop, not in a
        # transaction (most of a busy log is not about timers).
        self._offsets: dict[tuple[str, int], int] = {}
        self.deadline_s = COMMIT_DEADLINE_S
        self.max_staged = MAX_STAGED

    def _running(self, key: tuple[str, int]) -> asyncio.Task[bool] | None:
        """The commit of `key` still going: one that ended is not, though its done callback
        (which forgets it) runs an iteration of the loop later. Taken for one in flight,
        it was awaited without yielding, again and again: the loop stood still."""
        task = self._in_flight.get(key)
        return None if task is None or task.done() else task

    def in_flight(self, kept: KeptType, p: int) -> bool:
        return self._running((kept.name, p)) is not None

    def lag(self) -> float:
        """How long the oldest commit in flight has been going, in seconds (0: none): a
        commit that hangs holds every later write of its partition back (readiness)."""
        now = time.monotonic()
        return max((now - self._started_at[key] for key in self._in_flight), default=0.0)

    def pass_over(self, offsets: dict[tuple[str, int], int]) -> None:
        """Offsets read and done with nothing to write: the poll loop commits them."""
        self._offsets.update(offsets)

    def take_offsets(self) -> dict[tuple[str, int], int]:
        done, self._offsets = self._offsets, {}
        return done

    def may_commit(self, kept: KeptType, p: int) -> bool:
        """Whether p may start a commit now: none in flight (the next takes all that waits
        meanwhile), and the last started a commit interval ago."""
        key = (kept.name, p)
        if self._running(key) is not None:
            return False
        return time.monotonic() - self._started_at.get(key, 0.0) >= self._interval

    def start(self, kept: KeptType, p: int) -> asyncio.Task[bool] | None:
        """Takes what waits in p's transaction (under p's lock, so that no cycle is cut in
        two) and commits it in the background; the commit (True: committed). One commit
        in flight at a time: while one is, nothing is taken and that one is returned (what
        waits goes in the next); None: nothing in flight and nothing waits."""
        key = (kept.name, p)
        if (running := self._running(key)) is not None:
            return running
        taken = kept.transactions.take(p)
        if taken is None:
            return None
        self._started_at[key] = time.monotonic()
        task = asyncio.create_task(self._send(p, taken), name=f"commit {key}")
        self._in_flight[key] = task
        task.add_done_callback(
            lambda t: self._in_flight.pop(key, None) if self._in_flight.get(key) is t else None
        )
        return task

    async def room(self, types: Iterable[KeptType], p: int) -> None:
        """Waits while a type's work waiting for p's transaction is over `max_staged` with
        a commit in flight (bounded: each commit has a deadline)."""
        for kept in types:
            while kept.transactions.waiting(p) > self.max_staged:
                commit = self._running((kept.name, p))
                if commit is None:
                    break  # the next cycle's stage starts one
                await asyncio.wait([commit])

    async def _send(self, p: int, taken: Transaction) -> bool:
        try:
            try:
                async with asyncio.timeout(self.deadline_s):
                    await taken.send()
            except TimeoutError as exc:
                # A hung commit holds every later write of p: given up, p taken afresh.
                raise KafkaUnavailable(
                    f"partition {p}: no commit within {self.deadline_s:g} s"
                ) from exc
        except Exception as exc:
            # Kafka's or the local store's (a state write after the commit): either way
            # p's local copy is not what its changelog says, so it is taken afresh.
            if not isinstance(exc, KafkaUnavailable):
                logger.exception("partition %d: a commit failed", p)
            self._on_failure(p, "a commit", exc)
            return False
        return True

    async def run(self, types: Callable[[], Iterable[KeptType]]) -> None:
        """Commits what waits in each partition's transaction as soon as it may: the
        cycles' staged work and the runners' writes."""
        while True:
            await asyncio.sleep(self._tick)
            for kept in types():
                for p in kept.transactions.pending():
                    if not self.may_commit(kept, p):
                        continue
                    if self._locks[p].locked():
                        continue  # a cycle of p: it commits at its end, or a later tick
                    async with self._locks[p]:
                        if self._owns(p) and kept.transactions.owns(p):
                            self.start(kept, p)

    async def commit_claims(self, kept: KeptType, partitions: set[int]) -> None:
        """The runner's `before_send`: its claims commit before their commands leave."""
        for p in sorted(partitions):
            while True:
                async with self._locks[p]:
                    if not self._owns(p) or not kept.transactions.owns(p):
                        raise KafkaUnavailable(f"partition {p} is not owned")
                    earlier = self.in_flight(kept, p)  # then the claims wait for the next
                    commit = self.start(kept, p)
                if commit is None:
                    break
                try:
                    committed = await asyncio.shield(commit)
                except asyncio.CancelledError:
                    current = asyncio.current_task()
                    if current is not None and current.cancelling():
                        raise
                    committed = False  # the partition was let go meanwhile
                if not committed:
                    raise KafkaUnavailable(f"partition {p}: claims not committed")
                if not earlier:
                    break

    async def drop(self, kept: KeptType, p: int, *, clean: bool) -> None:
        """p is let go: its commit in flight is waited for (`clean`: a hand-off) or
        cancelled (what it holds never counts)."""
        commit = self._in_flight.pop((kept.name, p), None)
        if commit is not None:
            if not clean:
                commit.cancel()
            await asyncio.gather(commit, return_exceptions=True)
