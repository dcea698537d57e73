"""The cycles of every partition task a node runs (one a type's partition): the logic they
share (deciding, staging), with no state of any task's own. Each cycle takes every batch
that arrived for its task's topics of its partition (the type's log, commands, operators'
requests) and the timers its firing holds claimed to fire in-process
(`TimerRunner.in_process_due`), decides them together, and stages them in its task's
transaction (which its input gives; `Commits` commits it). It decides for a bounded time
(`DECIDE_BUDGET_S`: a cycle is one run of the event loop, and a service's handlers may be
slow): what it did not reach, records and timers, the cycles after it decide, in order,
the loop let run between; the offsets it commits pass what it decided alone.
What each task's cycles run on is its own (`PartitionInput`, one per take): its queue, its
worker (`work`), its lock, its in-process wake-up, whether a cycle was cut short, where
its last failed cycle read and the timers its budget left.
Whatever goes wrong with one record (its bytes, its envelope, its handler, its applier,
what it does to the timer table, an operator's request) is that record's: it is
dead-lettered in the cycle's transaction and the cycle goes on. Only a fault of the node
itself (`app.errors.node_fault`), or an applier timed out on an event the log holds (the
timeout is not the event's), ends the task's work (its `failed`): nothing of the cycle
counts, its type's partition is taken afresh (no other type's task of the partition is
touched), and its input's `failed_at` says which offsets the failed cycle read from."""

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
from app.node.cycle_work import (
    CycleWork,
    behind_of,
    cycle_slices,
    decide_deadline,
    let_the_loop_turn,
    past_deadline,
    records_decided,
    records_to_do,
)
from app.node.failing import A_CYCLE
from app.node.kept import KeptType
from app.node.metrics import NodeMetrics
from app.node.own_records import OwnRecords
from app.node.partition_input import Batch, PartitionInput
from app.node.partition_transaction import PartitionTransaction
from app.node.task_id import TaskId
from app.protocol.limits import InputLimits
from app.protocol.wire import CommandEnvelope, ResultCode
from app.timers.runner import SendResult
from app.timers.sender import timer_command
from tables import StoreError, Timer
from tables.store import TimerWrites

__all__ = ["CycleTask", "PartitionCycles"]

logger = logging.getLogger(__name__)

BACKLOG_WITHIN_S = 5.0
"""How long the consumer's answer about a partition's backlog is waited for (its adapter
bounds it well under this): one that never came held the partition's worker for good
while the node said it was ready; counted 0 instead."""


class CycleTask(Protocol):
    """The task running a type's partition, as its cycles see it (`PartitionTask`): what a
    cycle works on is its own, and what the cycle says goes to it."""

    @property
    def input(self) -> PartitionInput | None:
        """Its input while it runs (its take's)."""
        ...

    @property
    def processor(self) -> CommandProcessor | None:
        """The command processor of its partition (None: its commands are not decided
        here)."""
        ...

    @property
    def store(self) -> TimerWrites | None:
        """Its partition's handle of its type's timer store (its take's): a cycle writes
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
        running: Mapping[TaskId, CycleTask],
        backlog: Callable[[str, int], Awaitable[int]],
        now: Callable[[], int],
        limits: InputLimits | None = None,
    ) -> None:
        self._types = types
        self._by_topic = by_topic
        self._partitions = partitions
        self._metrics = metrics
        self._commits = commits
        # The task running each type's partition: what a cycle of it works on is its own.
        self._running = running
        self._backlog = backlog
        self._now = now
        self.limits = limits or InputLimits()

    def fire_local(self, type_name: str, p: int) -> None:
        """The next cycle of type `type_name`'s task of p fires the timers its runner
        claimed to fire in-process in p (it asks the runner for them); none: p is not run
        here any more (the runner's stop drops them, the next owner fires them)."""
        if (inp := self._input(TaskId(type_name, p))) is not None:
            inp.fire_local()

    def _input(self, key: TaskId) -> PartitionInput | None:
        """The input of the task running `key` (None: none runs it)."""
        task = self._running.get(key)
        return None if task is None else task.input

    def _processor(self, key: TaskId) -> CommandProcessor | None:
        """The command processor of the task running `key`; None: not decided here (any
        more: the task may stop running during a cycle)."""
        task = self._running.get(key)
        return None if task is None else task.processor

    def _store(self, key: TaskId) -> TimerWrites | None:
        """The handle of `key`'s timers, the task running it's; None: no task runs it."""
        task = self._running.get(key)
        return None if task is None else task.store

    async def work(self, inp: PartitionInput) -> None:
        """A task's worker (`PartitionInput`): its cycles, one after the other, over what
        its queue holds, while it runs."""
        p, queue, kept = inp.p, inp.queue, self._types[inp.type_name]
        done: dict[str, int] = {}  # per topic, the last offset done (a batch read twice)
        while True:
            # Staging is bounded: batches wait in the queue (then the poll loop) meanwhile.
            await self._commits.room(kept, p)
            items = [await queue.get()]
            while not queue.empty():
                items.append(queue.get_nowait())
            # Records done already are passed over one by one, not by batch: after a lost
            # membership the consumer reads again from the committed offset, and a batch
            # may hold records done (staged, not committed) and new ones.
            to_do = records_to_do(items, done)
            try:
                while True:
                    slices = cycle_slices(to_do)
                    inp.holding = len(slices) > 1  # the handed-over timers fire in the last
                    inp.behind = behind_of(slices)[0]
                    staged = await self._one_cycle(inp, slices[0], done)
                    # The loop's other work (other partitions' timers, heartbeats) between
                    # two cycles: a queue that holds batches is taken from without a pause.
                    await let_the_loop_turn()
                    # What the cycle's budget left undecided, then the slices after it: in
                    # order, before anything queued since.
                    to_do = records_to_do(to_do, done)
                    if not staged or not to_do:
                        break
            finally:
                inp.holding, inp.behind = False, {}

    async def _one_cycle(
        self, inp: PartitionInput, part: list[Batch], done: dict[str, int]
    ) -> bool:
        """One cycle of its task over `part` under its input's lock; whether it staged (else
        its task is failed, or runs no more: the rest is read again by the next take)."""
        key = inp.key
        backlogs = await self._backlogs(key.p, part)
        async with inp.lock:
            if self._input(key) is not inp:
                return False  # its task runs no more (closed, or failed)
            inp.unreached = 0
            try:
                staged = await self._cycle(key, part, backlogs)
            except asyncio.CancelledError:
                # Cut short (a hand-off): what it wrote so far is half a cycle, thrown
                # away before the lock lets a commit take it.
                inp.cut = True
                if (txn := inp.transaction()) is not None:
                    txn.discard()
                raise
            if staged:
                for topic, records in records_decided(part, inp.unreached):
                    done[topic] = records[-1].offset
                if (task := self._running.get(key)) is not None:
                    task.read_past(done)
            return staged

    async def _backlogs(self, p: int, part: list[Batch]) -> dict[str, int]:
        """The consumer's backlog of each commands topic in `part`, asked before the cycle
        takes its lock (a Kafka client's call, however short, holds no lock). It only
        bounds how busy the partition says it is: one the consumer cannot tell (its
        coordinator failing, the partition no longer assigned) counts 0, never a cycle's
        failure."""
        found: dict[str, int] = {}
        for topic, _ in part:
            if self._by_topic[topic][1] != "commands":
                continue
            try:
                async with asyncio.timeout(BACKLOG_WITHIN_S):  # else its worker waits on
                    found[topic] = await self._backlog(topic, p)
            except Exception as exc:
                logger.warning("%s[%d]: backlog not known, counted 0: %r", topic, p, exc)
                found[topic] = 0
        return found

    async def _cycle(self, key: TaskId, items: list[Batch], backlogs: Mapping[str, int]) -> bool:
        """Decides what arrived for its task's p and the timers handed over to fire, and
        stages it; whether it did (else the task is let go and taken afresh). `backlogs`:
        the consumer's backlog of each commands topic in `items`, asked before the lock."""
        p, kept = key.p, self._types[key.type_name]
        work: CycleWork | None = None
        now, deadline = self._now(), decide_deadline()
        inp = self._input(key)

        def work_of() -> CycleWork:
            nonlocal work
            if work is None:
                processor, store = self._processor(key), self._store(key)
                work = CycleWork(kept, now, self.limits, processor, store=store)
                if inp is not None:
                    work.carried, work.own = inp.carried, inp.own
                work.deadline = deadline  # its command batch's (`CommandBatch.deadline`)
            return work

        unreached = 0  # the records its budget leaves for the next cycle (its last ones)
        try:
            for i, (topic, records) in enumerate(items):
                if i and past_deadline(deadline):  # the rest is the next cycle's
                    unreached = sum(len(rest) for _, rest in items[i:])
                    break
                # The poll loop hands a task its own type's topics alone.
                kind = self._by_topic[topic][1]
                w = work_of()
                if kind == "events":
                    wrote, taken = await self._subscribe(kept, records, w)
                    w.wrote = wrote or w.wrote
                    records, unreached = records[:taken], len(records) - taken
                elif kind == "timer-ops":
                    await self._operate(kept, records, w)
                    w.wrote = True
                elif (batch := w.batch_of(p)) is not None:
                    behind = inp.behind.get(topic, 0) if inp is not None else 0
                    backlog = backlogs.get(topic, 0) + behind
                    decided = w.decider.decide_records(batch, records, backlog, w.own.command)
                    records, unreached = records[:decided], len(records) - decided
                    w.wrote = await self._carry_out(w, batch, p) or w.wrote
                elif self._running.get(key) is not None:
                    # Never committed past undecided (an assignment that splits p is
                    # refused: `PartitionTasks.assign`); a task no longer running commits none.
                    raise RuntimeError(f"{topic}[{p}]: given to a task that decides no commands")
                # The offsets passed: of the records decided alone.
                w.offsets[(topic, p)] = records[-1].offset + 1
                if unreached:  # its budget spent in the batch: the rest is the next cycle's
                    unreached += sum(len(rest) for _, rest in items[i + 1 :])
                    break
            if inp is not None:
                inp.unreached = unreached
            # Its commands decided here (still: its task may stop running meanwhile), and
            # its records all (a cancel among those its budget left is decided first).
            if (
                not unreached
                and inp is not None
                and inp.take_local()
                and self._processor(key) is not None
            ):
                # Asked now, after the cycle's own commands were carried out on the timer
                # table: a cancel decided in this cycle stops its timer below. Those an
                # earlier cycle's budget left first (claimed before).
                timers = inp.take_timers_left() + kept.runner.in_process_due(p)
                w = work_of()
                if timers and (batch := w.batch_of(p)) is not None:
                    # A cancel or reschedule applied since they were loaded stops them here.
                    timers = await kept.runner.still_due(timers)
                    commands = [timer_command(t, batch.now, in_process=True) for t in timers]
                    fired = w.decider.decide_local(batch, commands)
                    # Those its budget left stay claimed (in their firing's hand: no round
                    # claims them again), fired by the next cycle.
                    inp.keep_timers(timers[len(fired) :])
                    await self._record_local(w, timers, fired)
                    # After the settles: a Fire that reschedules its own key would fail them.
                    w.wrote = await self._carry_out(w, batch, p) or w.wrote
            if work is not None:
                self._stage(p, work, inp.transaction() if inp is not None else None)
        except Exception as exc:
            # Nothing of the cycle counts: the partition is taken again and read from its
            # committed offsets (every write is idempotent).
            if not isinstance(exc, KafkaUnavailable | StoreError):
                logger.exception("partition %d of %s: a cycle failed", p, kept.name)
            if inp is not None:
                inp.failed_at = {topic: records[-1].offset for topic, records in items}
            if (task := self._running.get(key)) is not None:
                task.failed(A_CYCLE, exc)
            return False
        if inp is not None:
            inp.failed_at = {}
        return True

    async def _record_local(
        self,
        w: CycleWork,
        timers: list[Timer],
        decided: list[tuple[CommandEnvelope, ResultCode, str]],
    ) -> None:
        """Settles the timers fired in-process (before the cycle commits; counted at it)."""
        by_request = {t.request_id: t for t in timers}
        outcomes = [
            (by_request[cmd.request_id], SendResult(code.value, message))
            for cmd, code, message in decided
        ]
        stats = await w.kept.runner.record_outcomes(outcomes)
        w.counts.later.append(functools.partial(self._metrics.round, w.kept.name, stats))

    def _stage(self, p: int, w: CycleWork, txn: PartitionTransaction | None) -> None:
        """Stages the cycle's work in its task's transaction of p (`txn`; None: the task
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
            # needed; the offsets are committed with the others (and counted now: no
            # transaction will tell, though such a cycle has nothing to count).
            self._commits.pass_over(kept, w.offsets)
            w.counts.apply()
            return
        records = w.batch.out + w.out if w.batch is not None else w.out
        offsets = w.offsets if w.batch is None else w.offsets | w.batch.offsets
        committed = None
        if (batch := w.batch) is not None:
            processor = w.decider
            processor.staged(batch)
            committed = functools.partial(self._batch_committed, kept.name, processor, batch, w.own)
            for code, n in batch.stats.codes.items():
                w.counts.add(self._metrics.commands.labels(kept.name, code), n)
            if batch.stats.dead_letters:
                dead = self._metrics.dead_letters.labels(kept.topics.commands)
                w.counts.add(dead, batch.stats.dead_letters)
        for topic, n in w.letters.items():
            w.counts.add(self._metrics.dead_letters.labels(topic), n)
        if txn is None:
            raise KafkaUnavailable(f"{kept.topics.timers_changelog}[{p}] is not owned by this node")
        # Counted when (if) the transaction that carries it commits: a failed commit's
        # work is decided again by the next take, and counted once, then.
        txn.stage(records, offsets, committed, w.counts)
        if self._commits.may_commit(kept, p):
            self._commits.start(kept, p)

    def _batch_committed(
        self,
        type_name: str,
        processor: CommandProcessor,
        batch: CommandBatch,
        own: OwnRecords,
        written: list[int],
    ) -> None:
        processor.committed(batch, written[: len(batch.out)])
        own.committed([(batch.out[i][0], written[i], e) for i, e in batch.own.items()])
        # The timers' commands are applied now: their lateness is measured at the commit.
        self._metrics.fired(type_name, batch.fired_due, self._now())
