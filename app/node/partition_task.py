"""A partition task: one per partition the node owns, and the one owner of its lifecycle.

Co-partitioning puts everything of partition p on one node: the log's p, the aggregates
decided from it, their timers and the command partition p of the same type. The task
takes p (its transactional producers, one a type, fence the previous owner; the log is
folded into the aggregate states; the timer table restored), runs it (its topics read,
its timers fired) and lets it go: cleanly when the group revokes p while it runs (what
its transactions hold commits), dirty on a fault of its own or when a take is cut short
(thrown away, the local copy restored next time), and then revived: taken afresh once
the group answers, if it still gives p here. A fault in one task never touches another.
Each task owns its transactions (`PartitionTransaction`, one a type, opened by its take
and abandoned by its close), its commits' scheduling (`PartitionCommits`), its command
processors, its timer firings (`PartitionFiring`, one a type: its wheel, its sends and
their outcomes, its write lock; obtained from the type's runner when it starts firing,
stopped and dropped by its close), per type its partition's handle of the timer store
(`PartitionHandle`, made by its take, dropped by its close: its cycles write p's timers
through it, and its firings reach them through it too, so a firing of a take let go
writes nothing), and, each time it runs, its input (`PartitionInput`: its queue, its
worker, its lock, its in-process wake-up, its cycle's state), stopped with its close. A
fault of its own, a corrupt row of its timer store included, fails it alone. Tasks share
the consumer, the clock and the clients; the cycles' logic (`PartitionCycles`, no state
of a partition's own); and still, per type, what holds all of the type's partitions on
the node, of which a task touches only its own partition's: the timer store (one RocksDB
store, which a task reaches its partition through its handle; a write lock per
partition, so a partition's writes wait for its own alone, a restore's memtable flush
included, never for another's), the aggregate states store (one RocksDB a partition, no
lock), the clean marks (a file a partition), the runner (which keeps a reference to each
task's firing and runs its rounds, each through the firing's own store; one gate on the
sends in flight), and `TypeTransactions` (which opens the tasks' transactions and stops
their producers; a take attaches its transaction to its handle, which hands it p's
rows). No task holds a lock across a Kafka call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection

from app.commands.processor import CommandProcessor
from app.errors import node_fault
from app.kafka.records import refused
from app.node.commits import PartitionCommits
from app.node.failing import FailingPartitions
from app.node.in_process import in_process_targets
from app.node.kept import is_fenced
from app.node.partition_input import Batch, Held, PartitionInput
from app.node.partition_open import open_partition
from app.node.partition_release import CloseFailed, release_partition
from app.node.partition_timers import PartitionTimerLoop
from app.node.partition_transaction import PartitionTransaction
from app.node.task_shared import TaskManager, TaskShared
from app.node.task_state import TaskState, closes_clean, transition
from app.timers.runner import PartitionFiring
from app.timers.runner.partition_store import PartitionStore
from tables.partition_handle import PartitionHandle

__all__ = ["TAKE_ATTEMPTS", "PartitionTask", "TaskManager", "TaskShared"]

logger = logging.getLogger(__name__)

TAKE_ATTEMPTS = 10
"""A partition not taken in this many attempts stops the node (loudly)."""


class PartitionTask:
    def __init__(self, p: int, shared: TaskShared, manager: TaskManager) -> None:
        self.p = p
        self.state = TaskState.CREATED
        self._shared = shared
        self._manager = manager
        # How many times it started running: a batch polled before a take is stale (the
        # take rewound p to its committed offsets) and is never handed over.
        self.takes = 0
        # Why its work stopped on a failure, until it runs again.
        self.broken: str | None = None
        # Its failures until read past, and whether it fires nothing till then.
        self.failing = FailingPartitions()
        # Per type, the command processor of p (whose commands are decided here).
        self.processors: dict[str, CommandProcessor] = {}
        # Per type, its transaction of p: opened by its take, abandoned by its close.
        self.transactions: dict[str, PartitionTransaction] = {}
        # Per type, p's handle of the timer store, its cycles' writes' (made by its take,
        # after the restore; dropped by its close: a retake's is a new one).
        self.stores: dict[str, PartitionHandle] = {}
        # Per type, p's timer firing: obtained when p starts firing, stopped by its close.
        self.firings: dict[str, PartitionFiring] = {}
        # Per type, the loop of p's own timer rounds over its firing (ended by its close).
        self.timer_loops: dict[str, PartitionTimerLoop] = {}
        # When its transactions commit (a failed commit fails the task).
        self.commits = PartitionCommits(p, self.failed, self.transactions)
        self._taking: asyncio.Task[None] | None = None
        # The group took p away: no take starts any more (a failure meanwhile included).
        self._leaving = False
        # When its close for the group's revoke began (`time.monotonic`), if it did.
        self.closing_since: float | None = None
        # Its input while it runs (one per take: created running, stopped by its close).
        self.input: PartitionInput | None = None

    def __repr__(self) -> str:
        return f"PartitionTask({self.p}, {self.state.value})"

    def _to(self, target: TaskState) -> None:
        self.state = transition(self.state, target)

    @property
    def queue(self) -> asyncio.Queue[Batch]:
        """Its input's queue, where the poll loop hands its batches (it runs)."""
        assert self.input is not None, f"partition {self.p} is not running"
        return self.input.queue

    @property
    def cut_short(self) -> bool:
        """Whether its input is stopped or a cycle of it was cut short (a close under way)."""
        return self.input is None or self.input.cut

    @property
    def held(self) -> Held:
        """Its input's batches that did not fit in its queue (the poll loop's to hand over)."""
        assert self.input is not None, f"partition {self.p} is not running"
        return self.input.held

    @property
    def lock(self) -> asyncio.Lock:
        """Its input's lock, held by its cycle and around taking its transaction."""
        assert self.input is not None, f"partition {self.p} is not running"
        return self.input.lock

    @property
    def taking(self) -> bool:
        """Whether it is being taken (restored, or waiting to be taken again)."""
        return self._taking is not None

    def take(
        self,
        topics: set[str],
        *,
        after_failure: float | None = None,
        behind: Collection[asyncio.Task[bool]] = (),
    ) -> None:
        """Takes p's `topics` (paused by the caller until it runs) in the background, once
        the closes `behind` (an earlier task's of p) are done."""
        self._taking = asyncio.create_task(
            self._take_in_background(topics, after_failure, behind),
            name=f"{'retake' if after_failure is not None else 'take'} {self.p}",
        )

    def leave(self) -> None:
        """The group took p away: no take starts from now on (a failure's included)."""
        self._leaving = True

    async def stop_taking(self) -> None:
        """The group takes p away: a take under way is cancelled (and waited for), and none
        starts from now on."""
        self.leave()
        if (taking := self._taking) is not None:
            taking.cancel()
            await asyncio.gather(taking, return_exceptions=True)

    def failed(self, what: str, exc: BaseException) -> None:
        """Ends p's work on a failure of its transaction, store or cycle: what it wrote
        since its last commit may never count. The task is closed dirty and revived (taken
        afresh: restored from the changelog and the log, read again from the committed
        offsets); when fenced, a newer owner has p, and it is taken again only if the
        group still gives it here."""
        if self.state is not TaskState.RUNNING:
            return
        s = self._shared
        fenced = is_fenced(exc)
        s.metrics.let_go.labels("fenced" if fenced else "failed").inc()
        then = "let go" if fenced else "taken afresh"
        logger.warning("partition %d: %s failed: %s; %s", self.p, what, exc, then)
        self._to(TaskState.SUSPENDED)
        self._stop_running()
        at = {} if self.input is None else self.input.failed_at
        failing = self.failing.failed(self.p, at, f"{what}: {exc}")
        self.broken = failing.describe()
        mine = [(t, q) for t, q in s.consumer.assignment() if q == self.p]
        s.consumer.pause(mine)
        if self._leaving:
            return  # being revoked: closed dirty there (it is suspended), never taken again
        delay = 2 * s.settings.session_timeout_ms / 1000 if fenced else 0.0
        self.take({t for t, _ in mine}, after_failure=delay)

    async def _take_in_background(
        self,
        topics: set[str],
        after_failure: float | None,
        behind: Collection[asyncio.Task[bool]],
    ) -> None:
        """Takes p, then runs it. `after_failure`: its work stopped on a failure: it is
        closed first (nothing of its local copy is trusted), and taken again once the group
        answers (its next assignment) or after that many seconds, if the group gives it to
        this node then. A partition that cannot be taken stops the node."""
        try:
            if behind:
                await asyncio.wait(behind)  # never cancels them (a stop_taking cancels this)
                if not all(not close.cancelled() and close.result() for close in behind):
                    # p may be half open there (a close that crashed failed the node): its
                    # transactional id is not opened again, nothing of p is taken.
                    logger.error(
                        "partition %d: its previous task's close failed: not taken", self.p
                    )
                    if any(close.cancelled() for close in behind):
                        self._manager.fail(f"partition {self.p}: a close of it was cancelled")
                    return
            await self._taking_partition(topics, after_failure)
        except Exception as exc:
            # A bug, whatever it is: never a partition left half taken, quietly.
            logger.exception("taking partition %d failed", self.p)
            self._manager.fail(f"taking partition {self.p} failed: {exc!r}")
        finally:
            if self._taking is asyncio.current_task():
                self._taking = None

    async def _taking_partition(self, topics: set[str], after_failure: float | None) -> None:
        p, consumer = self.p, self._shared.consumer
        if after_failure is not None:
            answered = self._manager.answered()
            await self.close(clean=False)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(after_failure):
                    await answered.wait()
            # As the group gives it now (a lost membership empties the assignment the
            # failure saw; the next one may give p back).
            topics = {t for t, q in consumer.assignment() if q == p}
            if not topics:
                self._manager.task_gone(self)  # the group moved it meanwhile
                return
            consumer.pause([(t, p) for t in topics])
            self.revive()
        last: BaseException | None = None
        for attempt in range(1, TAKE_ATTEMPTS + 1):
            try:
                await self._take(topics)
                await consumer.rewind([(t, p) for t in topics])
                break
            except Exception as exc:
                last = exc
                if refused(exc):
                    break  # an ACL or the credentials: no retry passes it
                # A node fault is expected to pass; anything else is a bug to see, but
                # either way p is tried again, and the node stops loudly if it never
                # can be taken: never a take that dies quietly, half done.
                log = logger.warning if node_fault(exc) else logger.exception
                log("taking partition %d failed (%d/%d): %s", p, attempt, TAKE_ATTEMPTS, exc)
                await self.close(clean=False)
                self.revive()
                await asyncio.sleep(min(0.2 * 2**attempt, 5))
        else:
            why = f"partition {p} could not be taken in {TAKE_ATTEMPTS} attempts: {last}"
            self._manager.fail(why)
            return
        if last is not None and refused(last):
            self._manager.fail(f"partition {p} could not be taken: {last}")
            return
        self._run(topics)

    def _run(self, topics: set[str]) -> None:
        """Taken: p's topics are read from here on, and its timers fire (unless it is
        held since a failure: then once its log is read past it)."""
        self._to(TaskState.RUNNING)
        self.input = PartitionInput(self.p, self._shared.cycles, self.failed, self.transactions)
        self._shared.running[self.p] = self
        self.takes += 1
        self.broken = None
        self._shared.consumer.resume([(t, self.p) for t in topics])
        if not self.failing.held(self.p):
            self.start_firing()
        self._manager.task_running(self)

    def _stop_running(self) -> None:
        if self._shared.running.get(self.p) is self:
            del self._shared.running[self.p]

    def start_firing(self) -> None:
        """p's timers fire from now on: those whose targets p decides itself in-process,
        in its cycles (`in_process_targets`), the others sent; each type's in rounds of
        p's own (`PartitionTimerLoop`), which no other partition's hold up."""
        partitions = self._shared.settings.partitions
        for kept in self._shared.types.values():
            local = kept.name in self.processors
            in_process = in_process_targets(kept.topics, partitions) if local else None
            # Its store calls through p's own handle: refused once p is let go.
            handle = self.stores.get(kept.name)
            store = None if handle is None else PartitionStore(handle)
            firing = kept.runner.start_partition(self.p, in_process=in_process, store=store)
            self.firings[kept.name] = firing
            self.timer_loops[kept.name] = kept.loop.start_partition(self, firing)

    def _end_timer_loops(self) -> None:
        """Its timer loops end (not waited for: a round in progress finds its firing
        stopped by the close and does nothing more of it)."""
        for name, loop in self.timer_loops.items():
            if (kept := self._shared.types.get(name)) is not None:
                kept.loop.end_partition(loop)
            else:
                loop.end()
        self.timer_loops.clear()

    def read_past(self, done: dict[str, int]) -> None:
        """A cycle of p staged: a task held since a failure fires again once its log was
        read past where the failure was."""
        if self.failing.read(self.p, done) and self.state is TaskState.RUNNING:
            logger.info("partition %d: its log read past its failure, firing again", self.p)
            self.start_firing()

    def revive(self) -> None:
        """A closed task is created again, to be taken afresh (its commits anew: none of
        its earlier ones, failed or abandoned, says anything of the next take's)."""
        self._to(TaskState.CREATED)
        self.commits = PartitionCommits(self.p, self.failed, self.transactions)

    async def _take(self, topics: set[str]) -> None:
        self._to(TaskState.RESTORING)
        await open_partition(
            self._shared, self.p, topics, self.transactions, self.processors, self.stores
        )

    async def revoke(self) -> None:
        """The group took p away: a take under way is stopped; a running task is closed
        clean, what its transactions hold committed (a hand-off); any other closes dirty
        (see `close`)."""
        await self.stop_taking()
        await self.stop_input()
        if self.state is TaskState.RUNNING:
            self._shared.metrics.let_go.labels("revoked").inc()
        await self.close(clean=True)

    async def close(self, *, clean: bool) -> None:
        """Stops everything of p this node runs (whole or half taken); `CloseFailed` when
        a part of it failed (the rest let go all the same, the copy not marked clean): p
        is then not taken again, the node stops (as for a crashed close).
        `clean`: commit what p's transactions hold first and mark the local copy clean;
        otherwise it is thrown away and the local copy restored from the changelog next
        time. Only a running task closes clean (`closes_clean`): a take cut short may not
        have restored a dirty copy yet, and a failed task's work may be half done. Closing
        a closed task does nothing."""
        if self.state is TaskState.CLOSED:
            return
        was = self.state
        clean = closes_clean(was, clean)
        if was is not TaskState.SUSPENDED:
            self._to(TaskState.SUSPENDED)
        self._stop_running()
        self.stores.clear()  # refused from p's revoke on anyway; a retake makes new ones
        self._end_timer_loops()
        if was is not TaskState.CREATED or self._half_open():
            # A cycle cut short wrote half of its work: nothing of p's transaction commits.
            clean = not await self.stop_input() and clean
            self.input = None
            try:
                await self._release(clean=clean)
            except CloseFailed:
                self._to(TaskState.CLOSED)  # all the rest of p was let go: not again
                raise
        self._to(TaskState.CLOSED)

    async def stop_input(self) -> bool:
        """Stops its input's worker, what was queued for it dropped (read again by the next
        take); whether a cycle of it was cut short."""
        return self.input is not None and await self.input.stop()

    def _half_open(self) -> bool:
        """Whether something of p is open (a take cut short)."""
        return bool(self.processors or self.transactions) or any(
            self.p in kept.store.assigned for kept in self._shared.types.values()
        )

    async def _release(self, *, clean: bool) -> None:
        await release_partition(
            self._shared,
            self.commits,
            self.processors,
            self.transactions,
            self.firings,
            self.p,
            clean=clean,
        )
