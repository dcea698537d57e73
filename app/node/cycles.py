"""The cycles of every partition a node runs: the logic they share (deciding, staging),
with no state of any partition's own. Each cycle takes every batch that arrived for its
partition (the log, commands, operators' requests) and the timers its partition's firing
holds claimed to fire in-process (`TimerRunner.in_process_due`), decides them together,
and stages them in the partition's transaction, one per type (its task's, which its input
carries; `Commits` commits it).
What each partition's cycles run on is its task's own (`PartitionInput`, one per take):
its queue, its worker (`work`), its lock, its in-process wake-up, whether a cycle was cut
short and where its last failed cycle read.
Whatever goes wrong with one record (its bytes, its envelope, its handler, its applier,
what it does to the timer table, an operator's request) is that record's: it is
dead-lettered in the cycle's transaction and the cycle goes on. Only a fault of the node
itself (`app.errors.node_fault`) ends the partition's work (its task's `failed`): nothing
of the cycle counts, the partition is taken afresh, and its input's `failed_at` says which
offsets the failed cycle read from."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from app.commands.processor import CommandBatch, CommandProcessor
from app.errors import KafkaUnavailable
from app.node.commits import Commits
from app.node.cycle_timers import TimerTableCycles
from app.node.cycle_work import CycleWork, behind_of, cycle_slices, records_after
from app.node.kept import KeptType
from app.node.metrics import NodeMetrics
from app.node.partition_input import Batch, PartitionInput
from app.node.partition_transaction import PartitionTransaction
from app.protocol.limits import InputLimits
from app.protocol.wire import CommandEnvelope, ResultCode
from app.timers.runner import SendResult
from app.timers.sender import timer_command
from tables import StoreError, Timer
from tables.store import TimerWrites

__all__ = ["CycleTask", "PartitionCycles"]

logger = logging.getLogger(__name__)


class CycleTask(Protocol):
    """The task running a partition, as its cycles see it (`PartitionTask`): what a cycle
    works on is its own, and what the cycle says goes to it."""

    @property
    def input(self) -> PartitionInput | None:
        """Its input while it runs (its take's)."""
        ...

    @property
    def processors(self) -> Mapping[str, CommandProcessor]:
        """Per type, the command processor of its partition (whose commands it decides)."""
        ...

    @property
    def stores(self) -> Mapping[str, TimerWrites]:
        """Per type, its partition's handle of the timer store (its take's): a cycle writes
        its partition's timers through it, under that partition's lock alone."""
        ...

    def failed(self, what: str, exc: BaseException) -> None:
        """Its work failed: it is closed dirty and taken afresh."""
        ...

    def read_past(self, done: dict[str, int]) -> None:
        """A cycle staged: the last offset done of each topic."""
        ...


class PartitionCycles(TimerTableCycles):
    def __init__(
        self,
        *,
        types: dict[str, KeptType],
        by_topic: dict[str, tuple[KeptType, str]],
        partitions: int,
        metrics: NodeMetrics,
        commits: Commits,
        running: Mapping[int, CycleTask],
        backlog: Callable[[str, int], Awaitable[int]],
        now: Callable[[], int],
        limits: InputLimits | None = None,
    ) -> None:
        self._types = types
        self._by_topic = by_topic
        self._partitions = partitions
        self._metrics = metrics
        self._commits = commits
        # The task running each partition: what a cycle of it works on is the task's.
        self._running = running
        self._backlog = backlog
        self._now = now
        self.limits = limits or InputLimits()

    def fire_local(self, type_name: str, p: int) -> None:
        """p's next cycle fires the timers type `type_name`'s runner claimed to fire
        in-process in p (it asks the runner for them); none: p is not run here any more
        (the runner's stop drops them, the next owner fires them)."""
        if (inp := self._input(p)) is not None:
            inp.fire_local(type_name)

    def _input(self, p: int) -> PartitionInput | None:
        """The input of the task running p (None: no task runs p)."""
        task = self._running.get(p)
        return None if task is None else task.input

    def _processor(self, type_name: str, p: int) -> CommandProcessor | None:
        """A type's command processor of the task running p; None: not decided here (any
        more: the task may stop running during a cycle)."""
        task = self._running.get(p)
        return None if task is None else task.processors.get(type_name)

    def _store(self, type_name: str, p: int) -> TimerWrites | None:
        """A type's handle of p's timers, the task running p's; None: no task runs p."""
        task = self._running.get(p)
        return None if task is None else task.stores.get(type_name)

    async def work(self, inp: PartitionInput) -> None:
        """A partition's worker (`PartitionInput`): its cycles, one after the other, over
        what its queue holds, while its task runs."""
        p, queue = inp.p, inp.queue
        done: dict[str, int] = {}  # per topic, the last offset done (a batch read twice)
        while True:
            # Staging is bounded: batches wait in the queue (then the poll loop) meanwhile.
            await self._commits.room(self._types.values(), p)
            items = [await queue.get()]
            while not queue.empty():
                items.append(queue.get_nowait())
            # Records done already are passed over one by one, not by batch: after a lost
            # membership the consumer reads again from the committed offset, and a batch
            # may hold records done (staged, not committed) and new ones.
            fresh = [
                (topic, rest)
                for topic, records in items
                if (rest := records_after(records, done.get(topic, -1)))
            ]
            slices = cycle_slices(fresh)
            try:
                for part, behind in zip(slices, behind_of(slices), strict=True):
                    inp.holding = part is not slices[-1]  # the handed-over timers fire in the last
                    inp.behind = behind
                    staged = await self._one_cycle(inp, part, done)
                    # The loop's other work (other partitions' timers) between two cycles: a
                    # queue that holds batches is taken from without a pause.
                    await asyncio.sleep(0)
                    if not staged:
                        break
            finally:
                inp.holding, inp.behind = False, {}

    async def _one_cycle(
        self, inp: PartitionInput, part: list[Batch], done: dict[str, int]
    ) -> bool:
        """One cycle of p over `part` under its input's lock; whether it staged (else its
        task is failed, or runs p no more: the rest is read again by the next take)."""
        p = inp.p
        async with inp.lock:
            if self._input(p) is not inp:
                return False  # its task runs p no more (closed, or failed)
            try:
                staged = await self._cycle(p, part)
            except asyncio.CancelledError:
                # Cut short (a hand-off): what it wrote so far is half a cycle, thrown
                # away before the lock lets a commit take it.
                inp.cut = True
                for txn in inp.transactions.values():
                    txn.discard()
                raise
            if staged:
                for topic, records in part:
                    done[topic] = records[-1].offset
                if (task := self._running.get(p)) is not None:
                    task.read_past(done)
            return staged

    async def _cycle(self, p: int, items: list[Batch]) -> bool:
        """Decides what arrived for p and the timers handed over to fire, and stages it;
        whether it did (else p is let go and taken afresh)."""
        work: dict[str, CycleWork] = {}
        now = self._now()
        inp = self._input(p)

        def work_of(kept: KeptType) -> CycleWork:
            w = work.get(kept.name)
            if w is None:
                processor = self._processor(kept.name, p)
                store = self._store(kept.name, p)
                w = work[kept.name] = CycleWork(kept, now, self.limits, processor, store=store)
            return w

        try:
            for topic, records in items:
                kept, kind = self._by_topic[topic]
                w = work_of(kept)
                w.offsets[(topic, p)] = records[-1].offset + 1
                if kind == "events":
                    w.wrote = await self._subscribe(kept, records, w) or w.wrote
                elif kind == "timer-ops":
                    await self._operate(kept, records, w)
                    w.wrote = True
                elif (batch := w.batch_of(p)) is not None:
                    behind = inp.behind.get(topic, 0) if inp is not None else 0
                    backlog = await self._backlog(topic, p) + behind
                    w.decider.decide_records(batch, records, backlog)
                    w.wrote = await self._carry_out(w, batch, p) or w.wrote
            for type_name in sorted(inp.take_local() if inp is not None else ()):
                kept = self._types[type_name]
                if self._processor(kept.name, p) is None:
                    continue  # its commands are not decided here any more
                # Asked now, after the cycle's own commands were carried out on the timer
                # table: a cancel decided in this cycle stops its timer below.
                timers = kept.runner.in_process_due(p)
                w = work_of(kept)
                if not timers or (batch := w.batch_of(p)) is None:
                    continue
                # A cancel or reschedule applied since they were loaded stops them here.
                timers = await kept.runner.still_due(timers)
                commands = [timer_command(t, batch.now, in_process=True) for t in timers]
                decided = w.decider.decide_local(batch, commands)
                await self._record_local(kept, timers, decided)
                # After the settles: a Fire that reschedules its own key would fail them.
                w.wrote = await self._carry_out(w, batch, p) or w.wrote
            transactions = inp.transactions if inp is not None else {}
            for w in work.values():
                self._stage(p, w, transactions.get(w.kept.name))
        except Exception as exc:
            # Nothing of the cycle counts: the partition is taken again and read from its
            # committed offsets (every write is idempotent).
            if not isinstance(exc, KafkaUnavailable | StoreError):
                logger.exception("partition %d: a cycle failed", p)
            if inp is not None:
                inp.failed_at = {topic: records[-1].offset for topic, records in items}
            if (task := self._running.get(p)) is not None:
                task.failed("a cycle", exc)
            return False
        if inp is not None:
            inp.failed_at = {}
        return True

    async def _record_local(
        self,
        kept: KeptType,
        timers: list[Timer],
        decided: list[tuple[CommandEnvelope, ResultCode, str]],
    ) -> None:
        """Settles the timers fired in-process (before the cycle commits)."""
        by_request = {t.request_id: t for t in timers}
        outcomes = [
            (by_request[cmd.request_id], SendResult(code.value, message))
            for cmd, code, message in decided
        ]
        self._metrics.round(kept.name, await kept.runner.record_outcomes(outcomes))

    def _stage(self, p: int, w: CycleWork, txn: PartitionTransaction | None) -> None:
        """Stages the cycle's work in p's transaction of its type (`txn`; None: p's task
        holds none, it stops running), and commits it at once unless p committed less than
        a commit interval ago (then the committer does, by then)."""
        kept = w.kept
        if w.batch is not None and w.batch.empty:
            w.batch = None
        if (
            w.batch is None
            and not w.out
            and not w.wrote
            and (txn is None or not txn.staged())
            and not self._commits.in_flight(kept, p)
        ):
            # Nothing written (most of a busy log is not about timers): no transaction
            # needed; the offsets are committed with the others.
            self._commits.pass_over(w.offsets)
            return
        records = w.batch.out + w.out if w.batch is not None else w.out
        offsets = w.offsets if w.batch is None else w.offsets | w.batch.offsets
        committed = None
        if (batch := w.batch) is not None:
            processor = w.decider
            processor.staged(batch)
            committed = functools.partial(self._batch_committed, kept.name, processor, batch)
            for code, n in batch.stats.codes.items():
                self._metrics.commands.labels(kept.name, code).inc(n)
            if batch.stats.dead_letters:
                self._metrics.dead_letters.labels(kept.topics.commands).inc(
                    batch.stats.dead_letters
                )
        for topic, n in w.letters.items():
            self._metrics.dead_letters.labels(topic).inc(n)
        if txn is None:
            raise KafkaUnavailable(f"{kept.topics.timers_changelog}[{p}] is not owned by this node")
        txn.stage(records, offsets, committed)
        if self._commits.may_commit(kept, p):
            self._commits.start(kept, p)

    def _batch_committed(
        self, type_name: str, processor: CommandProcessor, batch: CommandBatch, written: list[int]
    ) -> None:
        processor.committed(batch, written[: len(batch.out)])
        # The timers' commands are applied now: their lateness is measured at the commit.
        self._metrics.fired(type_name, batch.fired_due, self._now())
