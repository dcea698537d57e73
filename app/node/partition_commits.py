"""One partition task's commits (`PartitionCommits`: its type's partition): when its last
commit started, the one in flight, its offsets passed over, and its close's settling; a
failed commit ends the work of its task (`on_failure`): it is let go and taken afresh, no
other type's task of the partition touched. `commit_lags` reads how long theirs have been
going, per partition. The node-wide scheduling over them is `app.node.commits`."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

from app.errors import KafkaUnavailable
from app.node.failing import A_COMMIT
from app.node.partition_transaction import PartitionTransaction, Transaction
from app.node.task_id import TaskId
from app.task_ends import cancelled_here

__all__ = ["PartitionCommits", "commit_lags"]

# The commits' own logger, as before a task's commits had a module of their own: operators
# filter its records by that name.
logger = logging.getLogger("app.node.commits")


class PartitionCommits:
    """One partition task's commits (its type's partition): when its last one started and
    the one in flight; and the offsets of its work done with nothing to write.
    `on_failure` is told what failed and why when a commit fails (the task's own
    `failed`), `landed` when one landed; `transaction` gives the task's transaction
    (None: it holds none open)."""

    def __init__(
        self,
        key: TaskId,
        on_failure: Callable[[str, BaseException], None],
        transaction: Callable[[], PartitionTransaction | None],
        *,
        landed: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.key = key
        self._clock = clock
        self.p = key.p
        self._on_failure = on_failure
        self._on_landed = landed
        self._transaction_of = transaction
        self._started_at = 0.0
        self._in_flight: asyncio.Task[bool] | None = None
        # What its commit in flight sends (its offsets, read by `offsets_to_commit`).
        self._sending: Transaction | None = None
        # Its commits that committed (a burst's timer loop watches them land).
        self.landed = 0
        # A commit of it failed: its transaction's work since is not whole (never marked).
        self._failed = False
        # Offsets of batches that wrote nothing: committed by the poll loop, not in a
        # transaction (most of a busy log is not about timers).
        self._offsets: dict[tuple[str, int], int] = {}
        # Those of them in the poll loop's commit to the group: no transaction of its
        # carrying one of their partitions is sent until that commit ended.
        self._plain: dict[tuple[str, int], int] = {}
        self._plain_ended = asyncio.Event()
        self._plain_ended.set()

    def owns(self) -> bool:
        """Whether its task holds its transaction open."""
        txn = self._transaction_of()
        return txn is not None and not txn.abandoned

    def waits(self) -> bool:
        """Whether rows or staged work wait in its transaction."""
        txn = self._transaction_of()
        return txn is not None and txn.waits()

    def _transaction(self) -> PartitionTransaction:
        txn = self._transaction_of()
        if txn is None:
            raise KafkaUnavailable(f"{self.key} is not owned by this node")
        return txn

    def running(self) -> asyncio.Task[bool] | None:
        """Its commit still going: one that ended is not, though its done callback (which
        forgets it) runs an iteration of the loop later. Taken for one in flight, it was
        awaited without yielding, again and again: the loop stood still."""
        task = self._in_flight
        return None if task is None or task.done() else task

    def lag(self, now: float) -> float:
        """How long its commit in flight has been going at `now` (0: none)."""
        return 0.0 if self._in_flight is None else now - self._started_at

    def pass_over(self, key: tuple[str, int], offset: int) -> None:
        self._offsets[key] = max(offset, self._offsets.get(key, offset))

    def take_offsets(self) -> dict[tuple[str, int], int]:
        """The offsets passed over, for the poll loop to commit outside any transaction;
        never one at or below what its transaction carries (`PartitionTransaction.carried`).
        The group's committed offsets never move back: a cycle that passed over a, then a
        later one that staged b > a in a transaction before the poll loop took a, would
        have a committed after b (a hand-off reading and applying b's records again)."""
        done, self._offsets = self._offsets, {}
        if (txn := self._transaction_of()) is not None:
            done = {key: o for key, o in done.items() if o > txn.carried.get(key, -1)}
        return done

    def offsets_to_commit(self) -> dict[tuple[str, int], int]:
        """The offsets passed over (`take_offsets`) that the poll loop commits to the group
        now, outside any transaction, marked in flight until `offsets_ended`. Its
        transactions' offsets land at their end, so a commit of the group landing between
        would be moved back by them: an offset of a partition whose staged work carries
        one too rides in that work's transaction instead, and one of a partition whose
        transaction is in flight waits for it to land (kept for a later call)."""
        done = self.take_offsets()
        txn = self._transaction_of()
        if not done or txn is None or txn.abandoned:
            return self._mark_plain(done)
        sending = self._sending.offsets if self._sending is not None else {}
        staged = txn.staged_offsets()
        ride = {key: o for key, o in done.items() if key in staged and key not in sending}
        if ride:
            txn.stage([], ride)
        for key, offset in done.items():
            if key in sending:
                self.pass_over(key, offset)  # after its transaction landed
        return self._mark_plain(
            {key: o for key, o in done.items() if key not in ride and key not in sending}
        )

    def _mark_plain(self, offsets: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        if offsets:
            self._plain = offsets
            self._plain_ended.clear()
        return offsets

    def offsets_ended(self) -> None:
        """The poll loop's commit of the offsets it took ended, landed or not."""
        self._plain = {}
        self._plain_ended.set()

    def may_commit(self, interval: float) -> bool:
        """Whether it may start a commit now: none in flight (the next takes all that
        waits meanwhile), and the last started `interval` seconds ago."""
        if self.running() is not None:
            return False
        return self._clock() - self._started_at >= interval

    def start(self, deadline_s: float) -> asyncio.Task[bool] | None:
        """Takes what waits in its transaction and commits it in the background (see
        `Commits.start`)."""
        if (running := self.running()) is not None:
            return running
        taken = self._transaction().take()
        if taken is None:
            return None
        self._started_at = self._clock()
        task = asyncio.create_task(self._send(taken, deadline_s), name=f"commit {tuple(self.key)}")
        self._in_flight, self._sending = task, taken
        task.add_done_callback(self._forget)
        return task

    def _forget(self, task: asyncio.Task[bool]) -> None:
        if self._in_flight is task:
            self._in_flight, self._sending = None, None

    async def room(self, max_staged: int) -> None:
        """Waits while its work waiting for its transaction is over `max_staged` with a
        commit in flight (bounded: each commit has a deadline)."""
        while (txn := self._transaction_of()) is not None and txn.waiting() > max_staged:
            commit = self.running()
            if commit is None:
                break  # the next cycle's stage starts one
            await asyncio.wait([commit])

    async def _send(self, taken: Transaction, deadline_s: float) -> bool:
        key = self.key
        try:
            try:
                async with asyncio.timeout(deadline_s):
                    while self._plain and self._plain.keys() & taken.offsets.keys():
                        # The group's commit of an earlier offset of the same partition
                        # is going: landing after this, it would move the offset back.
                        await self._plain_ended.wait()
                    await taken.send()
            except TimeoutError as exc:
                # A hung commit holds every later write of p: given up, p taken afresh.
                raise KafkaUnavailable(f"{key}: no commit within {deadline_s:g} s") from exc
        except asyncio.CancelledError as exc:
            if cancelled_here():
                raise  # abandoned (its task's close): what it holds never counts
            # Leaked out of the client library (the producer's commit re-raises it as it
            # came, broken): nobody cancelled the commit, yet what it took never landed.
            logger.error("%s: a commit was cancelled inside the client library", key)
            self._fail(self._leaked(exc))
            return False
        except Exception as exc:
            # Kafka's or the local store's (a state write after the commit): either way
            # p's local copy is not what its changelog says, so it is taken afresh.
            if not isinstance(exc, KafkaUnavailable):
                logger.exception("%s: a commit failed", key)
            self._fail(exc)
            return False
        self.landed += 1
        if self._on_landed is not None:
            self._on_landed()
        return True

    def _fail(self, exc: BaseException) -> None:
        self._failed = True
        self._on_failure(A_COMMIT, exc)

    def _leaked(self, exc: asyncio.CancelledError) -> KafkaUnavailable:
        """A commit's failure for a CancelledError leaked out of it: caused by what broke
        its producer (a fence stays one: `is_fenced`), if anything did."""
        txn = self._transaction_of()
        error = KafkaUnavailable(f"{self.key}: its commit was cancelled inside the client library")
        error.__cause__ = exc if txn is None or txn.broken is None else txn.broken
        return error

    def _whole(self, *, rest: bool) -> bool:
        """Whether its commits may count as all committed: none failed, its producer is not
        broken (a failure no commit of it reported), and (`rest`) no row written to its
        transaction is left unlanded (the copy holds no write its changelog lacks)."""
        if self._failed:
            return False
        txn = self._transaction_of()
        if txn is None:
            return True
        if txn.broken is not None:
            logger.warning("%s: its producer is broken: not committed (%s)", self.key, txn.broken)
            return False
        if rest and (unlanded := txn.unlanded()):
            logger.warning("%s: %d timer row(s) not landed: not committed", self.key, len(unlanded))
            return False
        return True

    async def settle(self, *, until: float, rest: bool = True) -> bool:
        """The task closes clean: its commit in flight is waited for, then (`rest`) what
        waits in its transaction is committed, each by `until` (the loop's time: the
        close's one deadline); whether everything committed (True: nothing was to).
        Nothing is cancelled here: a commit not done by then is `abandon`ed. The close's
        commits are in flight as any (`lag`: /healthz sees them)."""
        loop = asyncio.get_running_loop()
        while True:
            commit = self._in_flight
            left = until - loop.time()
            if commit is None:
                if not rest or not self.waits():
                    return self._whole(rest=rest)
                if left <= 0:
                    return False
                commit = self.start(left)
                if commit is None:
                    return self._whole(rest=rest)
            if not commit.done():
                if left <= 0:
                    return False
                await asyncio.wait([commit], timeout=left)
                if not commit.done():
                    return False
            if commit.cancelled() or commit.result() is not True:
                return False
            if self._in_flight is commit:
                self._in_flight, self._sending = None, None  # its done callback not run yet
            if not rest:
                return self._whole(rest=False)

    def abandon(self) -> asyncio.Task[bool] | None:
        """The task closes: its commit still in flight is cancelled (what it holds never
        counts) and returned, not waited for (its producer's stop waits for it)."""
        commit, self._in_flight, self._sending = self._in_flight, None, None
        if commit is None or commit.done():
            return None
        commit.cancel()
        return commit


def commit_lags(commits: Iterable[PartitionCommits], now: float) -> dict[int, float]:
    """Per partition, how long the oldest of `commits`' in flight has been going at `now`
    (only those with one; the types' commits of one partition number count as one)."""
    lags: dict[int, float] = {}
    for own in commits:
        if (lag := own.lag(now)) > 0:
            lags[own.p] = max(lags.get(own.p, 0.0), lag)
    return lags
