"""A partition task: one per aggregate type and partition the node owns (`TaskId`), and
the one owner of its lifecycle.

Co-partitioning puts everything of partition p on one node: the log's p, the aggregates
decided from it, their timers and the command partition p of the same type; a Service of
several types is given the same p of each, and each type's p is a task of its own, so a
fault in one type's work of p never touches another type's. The task takes its type's p
(its transactional producer fences the previous owner; the log is folded into the
aggregate states; the timer table restored), runs it (its topics read, its timers fired)
and lets it go: cleanly when the group revokes p while it runs (what its transaction
holds commits), dirty on a fault of its own or when a take is cut short (thrown away, the
local copy restored next time), and then revived: taken afresh once the group answers, if
it still gives p here. A fault in one task never touches another.
Each task owns its transaction (`PartitionTransaction`, opened by its take and abandoned
by its close), its commits' scheduling (`PartitionCommits`), its command processor, its
timer firing (`PartitionFiring`: its wheel, its sends and their outcomes, its write lock;
obtained from the type's runner when it starts firing, stopped and dropped by its close),
its partition's handle of the type's timer store (`PartitionHandle`, made by its take,
dropped by its close: its cycles write p's timers through it, and its firing reaches them
through it too, so a firing of a take let go writes nothing), and, each time it runs, its
input (`PartitionInput`: its queue, its worker, its lock, its in-process wake-up, its
cycle's state), stopped with its close. A fault of its own, a corrupt row of its timer
store included, fails it alone. Tasks share the consumer, the clock and the clients; the
cycles' logic (`PartitionCycles`, no state of a task's own); and still, per type, what
holds all of the type's partitions on the node, of which a task touches only its own
partition's: the timer store (one RocksDB store, which a task reaches its partition
through its handle; a write lock per partition, so a partition's writes wait for its own
alone, a restore's memtable flush included, never for another's), the aggregate states
store (one RocksDB a partition, no lock), the clean marks (a file a partition), the
runner (which keeps a reference to each task's firing and runs its rounds, each through
the firing's own store; one gate on the sends in flight), and `TypeTransactions` (which
opens the tasks' transactions and stops their producers; a take attaches its transaction
to its handle, which hands it p's rows). The results readers read p while any type's task
of p is open (`TaskShared.reading_results`). No task holds a lock across a Kafka call.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Collection

from app.commands.processor import CommandProcessor
from app.errors import KafkaUnavailable
from app.node import partition_firing
from app.node.failing import A_COMMIT, FailingPartitions
from app.node.kept import KeptType, is_fenced
from app.node.partition_commits import PartitionCommits
from app.node.partition_failure import let_go
from app.node.partition_input import Batch, Held, PartitionInput
from app.node.partition_open import open_partition
from app.node.partition_release import CloseFailed, release_partition
from app.node.partition_take import take_partition
from app.node.partition_timers import PartitionTimerLoop
from app.node.partition_transaction import PartitionTransaction
from app.node.shielded_close import ShieldedClose
from app.node.task_id import TaskId
from app.node.task_shared import TaskManager, TaskShared
from app.node.task_state import TaskState, closes_clean, transition
from app.timers.runner import PartitionFiring
from tables import Timer
from tables.partition_handle import PartitionHandle

__all__ = [
    "PartitionTask",
    "TaskId",
    "TaskManager",
    "TaskShared",
]

logger = logging.getLogger(__name__)


class PartitionTask:
    def __init__(self, key: TaskId, shared: TaskShared, manager: TaskManager) -> None:
        self.key = key
        self.type_name, self.p = key
        self.state = TaskState.CREATED
        self.shared = shared
        self.manager = manager
        # How many times it started running: a batch polled before a take is stale (the
        # take rewound p to its committed offsets) and is never handed over.
        self.takes = 0
        # Why its work stopped on a failure, until it runs again.
        self.broken: str | None = None
        # Its failures until read past, and whether it fires nothing till then.
        self.failing = FailingPartitions()
        # The command processor of p (None: its type's commands are not decided here).
        self.processor: CommandProcessor | None = None
        # Its transaction of p: opened by its take, abandoned by its close.
        self.transaction: PartitionTransaction | None = None
        # p's handle of the timer store, its cycles' writes' (made by its take, after the
        # restore; dropped by its close: a retake's is a new one).
        self.store: PartitionHandle | None = None
        # Whether it failed since its take in a way not known to leave its store sound (a
        # corrupt row, RocksDB's own error, a bug): then its copy is restored whole, never
        # rolled back to what its landed commits left.
        self.copy_doubtful = False
        # Whether it failed on a record or batch refused as too large: its take reads the
        # limits of its topics and its type's `batch_topics` again before its producer is
        # made (`take_partition`).
        self.limits_doubtful = False
        # Whether its take's restore left the copy holding committed changelog records
        # alone, through the offset it holds (`open_partition`): a take cut short (a stop,
        # a revoke) then marks it clean, and the next one reads on from there rather
        # than restore the whole changelog again (a rolling restart during long restores).
        self.copy_committed = False
        # When its copy was last in step with the changelog; None: now (`open_partition`).
        self.copy_in_step_at: int | None = None
        # p's timer firing: obtained when p starts firing, stopped by its close.
        self.firing: PartitionFiring | None = None
        # Rows its writes replaced while it did not fire that were PARKED (a take's, a
        # held partition's: `_sink`), for its firing's `unparked` once it does.
        self.unparked_early: list[Timer] = []
        # The loop of p's own timer rounds over its firing (ended by its close).
        self.timer_loop: PartitionTimerLoop | None = None
        # When its transaction commits (a failed commit fails the task).
        self.commits = self._new_commits()
        self._taking: asyncio.Task[None] | None = None
        # The group took p away: no take starts any more (a failure meanwhile included).
        self.leaving = False
        # The closes of an earlier task of p its take waits for: p's state open until then
        # is theirs (a close of this task meanwhile lets none of it go).
        self._behind: tuple[asyncio.Task[bool], ...] = ()
        # When its close for the group's revoke began (`time.monotonic`), if it did.
        self.closing_since: float | None = None
        # Its input while it runs (one per take: created running, stopped by its close).
        self.input: PartitionInput | None = None
        # Its close under way, or its last (`close`), and that one's failure while no
        # caller has heard it.
        self._closes = ShieldedClose()

    def _transaction(self) -> PartitionTransaction | None:
        """Its transaction now, as its commits and input read it (each take's own)."""
        return self.transaction

    @property
    def kept(self) -> KeptType:
        """What the node keeps of its type."""
        return self.shared.types[self.type_name]

    def __repr__(self) -> str:
        return f"PartitionTask({self.type_name}, {self.p}, {self.state.value})"

    def _to(self, target: TaskState) -> None:
        self.state = transition(self.state, target)

    @property
    def queue(self) -> asyncio.Queue[Batch]:
        """Its input's queue, where the poll loop hands its batches (it runs)."""
        assert self.input is not None, f"{self.key} is not running"
        return self.input.queue

    @property
    def cut_short(self) -> bool:
        """Whether its input is stopped or a cycle of it was cut short (a close under way)."""
        return self.input is None or self.input.cut

    @property
    def held(self) -> Held:
        """Its input's batches that did not fit in its queue (the poll loop's to hand over)."""
        assert self.input is not None, f"{self.key} is not running"
        return self.input.held

    @property
    def lock(self) -> asyncio.Lock:
        """Its input's lock, held by its cycle and around taking its transaction."""
        assert self.input is not None, f"{self.key} is not running"
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
        """Takes p's `topics` of its type (paused by the caller until it runs) in the
        background, once the closes `behind` (an earlier task's of its type's p) are done."""
        self._behind = tuple(behind)
        self._taking = asyncio.create_task(
            self._take_in_background(topics, after_failure, behind),
            name=f"{'retake' if after_failure is not None else 'take'} {self.type_name} {self.p}",
        )

    def leave(self) -> None:
        """The group took p away: no take starts from now on (a failure's included)."""
        self.leaving = True

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
        fenced = is_fenced(exc)
        # Only Kafka's side failing is known to leave the store sound.
        sound = what == A_COMMIT or fenced or isinstance(exc, KafkaUnavailable)
        self.copy_doubtful = self.copy_doubtful or not sound
        if self.state is not TaskState.RUNNING:
            return
        s = self.shared
        s.metrics.let_go.labels("fenced" if fenced else "failed").inc()
        then = "let go" if fenced else "taken afresh"
        logger.warning("%s: %s failed: %s; %s", self.key, what, exc, then)
        self._to(TaskState.SUSPENDED)
        try:
            self._stop_running()
            let_go(self, what, exc, fenced)
        except Exception as error:  # suspended with no retake, p would stay so for good
            self.manager.fail(f"{self.key}: letting it go after {what} failed raised {error!r}")

    def given(self) -> list[tuple[str, int]]:
        """Its topics' p as the group gives them to this node now (its type's alone)."""
        by_topic = self.shared.by_topic
        return [
            (t, q)
            for t, q in self.shared.consumer.assignment()
            if q == self.p and t in by_topic and by_topic[t][0].name == self.type_name
        ]

    async def _take_in_background(
        self,
        topics: set[str],
        after_failure: float | None,
        behind: Collection[asyncio.Task[bool]],
    ) -> None:
        try:
            await take_partition(self, topics, after_failure, behind)
        finally:
            if self._taking is asyncio.current_task():
                self._taking = None

    def run(self, topics: set[str]) -> None:
        """Taken: p's topics are read from here on, and its timers fire (unless it is
        held since a failure: then once its log is read past it)."""
        self._to(TaskState.RUNNING)
        self.input = PartitionInput(self.key, self.shared.cycles, self.failed, self._transaction)
        self.shared.running[self.key] = self
        self.takes += 1
        self.broken = None
        self.shared.consumer.resume([(t, self.p) for t in topics])
        if not self.failing.held(self.p):
            self.start_firing()
        self.manager.task_running(self)

    def _stop_running(self) -> None:
        if self.shared.running.get(self.key) is self:
            del self.shared.running[self.key]

    @property
    def rounds_failing(self) -> bool:
        """Whether its timer loop's last rounds all failed: its timers do not fire."""
        return self.timer_loop is not None and self.timer_loop.failing

    def start_firing(self) -> None:
        """p's timers of its type fire from now on (`partition_firing.start_firing`)."""
        partition_firing.start_firing(self)

    def worked(self, what: str) -> None:
        """Its `what` worked: a failure of it that read nothing is forgotten."""
        self.failing.worked(self.p, what)
        if what == A_COMMIT:
            self.failing.committed(self.p, self.commits.landed)

    def read_past(self, done: dict[str, int]) -> None:
        """A cycle of p staged: a task held since a failure fires again once its log was
        read past where the failure was (`partition_firing.read_past`)."""
        partition_firing.read_past(self, done)

    def revive(self) -> None:
        """A closed task is created again, to be taken afresh (its commits anew: none of
        its earlier ones, failed or abandoned, says anything of the next take's)."""
        self._to(TaskState.CREATED)
        self.commits = self._new_commits()
        self.copy_doubtful = False

    def _new_commits(self) -> PartitionCommits:
        landed = functools.partial(self.worked, A_COMMIT)
        return PartitionCommits(self.key, self.failed, self._transaction, landed=landed)

    async def open_topics(self, topics: set[str]) -> str | None:
        """Restores p's state and opens its transaction (`open_partition`); why its
        changelog lost rows, if it did."""
        self._to(TaskState.RESTORING)
        self.copy_committed = False  # until its restore says (an earlier take's is stale)
        return await open_partition(self.shared, self, topics)

    async def revoke(self) -> None:
        """The group took p away: a take under way is stopped; a running task is closed
        clean, what its transaction holds committed (a hand-off); any other closes dirty
        (see `close`)."""
        await self.stop_taking()
        await self.stop_input()
        if self.state is TaskState.RUNNING:
            self.shared.metrics.let_go.labels("revoked").inc()
        await self.close(clean=True)

    async def close(self, *, clean: bool) -> None:
        """Stops everything of p this node runs (whole or half taken); `CloseFailed` when
        a part of it failed (the rest let go all the same, the copy not marked clean): p
        is then not taken again, the node stops (as for a crashed close).
        `clean`: commit what its transaction holds first and mark the local copy clean;
        otherwise it is thrown away and the local copy restored from the changelog next
        time. Only a running task closes clean (`closes_clean`): a take cut short may not
        have restored a dirty copy yet, and a failed task's work may be half done (but
        what a take's restore applied is kept, and read on from: `copy_committed`).
        Closing a closed task does nothing.

        It runs in a task of its own: a caller cut short (a revoke cancelling the retake
        that closes it after a failure) cuts none of it, and a close asked for while one
        runs waits for that one (`ShieldedClose`)."""
        await self._closes.run(
            functools.partial(self._close, clean=clean),
            closed=self.state is TaskState.CLOSED,
            name=f"close {self.type_name} {self.p}",
        )

    async def _close(self, *, clean: bool) -> None:
        was = self.state
        clean = closes_clean(was, clean)
        if was is not TaskState.SUSPENDED:
            self._to(TaskState.SUSPENDED)
        self._stop_running()
        # Refused from p's revoke on anyway; a retake makes a new one. Its close may roll
        # back through it what did not commit.
        store, self.store = self.store, None
        partition_firing.end_timer_loop(self)
        if was is not TaskState.CREATED or self._half_open():
            # A cycle cut short wrote half of its work: nothing of p's transaction commits.
            clean = not await self.stop_input() and clean
            self.input = None
            if was is not TaskState.RESTORING:
                # Only a take cut short (in its restore, or after it before it ran) wrote
                # nothing but the changelog's records to the copy since it was taken.
                self.copy_committed = False
            try:
                await self._release(clean=clean, store=store)
            except CloseFailed:
                self._to(TaskState.CLOSED)  # all the rest of p was let go: not again
                raise
        self._to(TaskState.CLOSED)

    async def stop_input(self) -> bool:
        """Stops its input's worker, what was queued for it dropped (read again by the next
        take); whether a cycle of it was cut short."""
        return self.input is not None and await self.input.stop()

    def _half_open(self) -> bool:
        """Whether something of its type's p is open (a take cut short). What the node
        holds of p while an earlier task's close of it still runs is that task's: never
        let go here (its firing, transaction and store would be cut from under it)."""
        if self.processor is not None or self.transaction is not None:
            return True
        if any(not close.done() for close in self._behind):
            return False
        return (
            self.p in self.kept.store.assigned
            or self.type_name in self.shared.reading_results.get(self.p, ())
        )

    async def _release(self, *, clean: bool, store: PartitionHandle | None) -> None:
        await release_partition(self.shared, self, clean=clean, store=store)
