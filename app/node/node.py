"""A node: one worker process, a member of the service's consumer group.

Its assignment of the aggregate types' partitions is its ownership. For each partition p
it is assigned, before reading anything of p it: fences p's previous owner (a new
transactional producer) and folds the log into the aggregate states; restores the timer
table from its changelog; starts reading the results of its sends; then starts firing p's
timers. On revocation it does the reverse. The consumer reads three topics per type:
the log (into the timer table: the timers subscription), the commands (the command
path, `processor`) and the operators' retry/skip requests on its parked timers
(`operator`). Each context's failure ledger is read whole by every node (`ledger`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.commands.processor import (
    CommandBatch,
    CommandProcessor,
    Commit,
    dead_letter_record,
    misrouted,
)
from app.errors import (
    BadRecord,
    Fenced,
    KafkaUnavailable,
    NodeFailed,
)
from app.kafka import (
    GroupConsumer,
    OutRecord,
    Producer,
    Reader,
    Record,
    TopicSpec,
    cluster_id,
    ensure_topics,
)
from app.kafka.broker_watch import BrokerWatch
from app.model.aggregate import AggregateType
from app.node.local_state import keep_for_cluster
from app.node.metrics import NodeMetrics
from app.node.settings import Settings
from app.protocol.topics import AggregateTopics, ContextTopics, parse_aggregate_type
from app.protocol.wire import SYSTEM_EVENTS, CommandEnvelope, EventEnvelope, ResultCode, decode
from app.protocol.wire import TimerOp as OperatorRequest
from app.service import Service
from app.timers.changelog import CleanMarks, Transaction, TransactionalChangelog, restore_partition
from app.timers.ledger import KafkaFailureLedger
from app.timers.operator import carry_out
from app.timers.runner import Clock, SendResult, SystemClock, TimerLoop, TimerOptions, TimerRunner
from app.timers.sender import KafkaSender, ResultsReader, timer_command
from app.timers.subscription import TimerOp, apply_all, timer_op
from tables import StoreError, Timer, TimerStore, open_timer_store
from tables.aggregate_store import RocksAggregateStore
from tables.ledger import FailureLedger
from tables.partitioner import partition_of

__all__ = ["Node", "NodeFailed", "node_topics"]

logger = logging.getLogger(__name__)


_TAKE_ATTEMPTS = 10
_LOCAL: tuple[str, list[Record]] = ("", [])
"""Queued for a partition's worker: timers were handed over to fire in-process."""


def _fenced(exc: BaseException | None) -> bool:
    """Whether `exc` (or what it wraps) says another node took the partition over."""
    while exc is not None:
        if isinstance(exc, Fenced):
            return True
        exc = exc.__cause__
    return False


def node_topics(types: list[AggregateTopics], partitions: int) -> list[TopicSpec]:
    """Every topic a node of these aggregate types reads or writes."""
    specs: list[TopicSpec] = []
    for t in types:
        specs += [
            TopicSpec(t.events, partitions),
            TopicSpec(t.commands, partitions),
            TopicSpec(t.timers_changelog, partitions, compacted=True),
            TopicSpec(t.timer_ops, partitions),
        ]
    for ctx in sorted({t.context for t in types}):
        c = ContextTopics(ctx)
        specs += [
            TopicSpec(c.results, partitions),
            TopicSpec(c.dead_letters, 1),
            TopicSpec(c.ledger, partitions, compacted=True),
        ]
    return specs


@dataclass
class _Type:
    """What the node keeps for one aggregate type."""

    topics: AggregateTopics
    agg: AggregateType[Any] | None  # None: timers only (the type is decided elsewhere)
    store: TimerStore
    runner: TimerRunner
    loop: TimerLoop
    states: RocksAggregateStore | None
    changelog: TransactionalChangelog
    marks: CleanMarks
    processors: dict[int, CommandProcessor] = field(default_factory=dict)


@dataclass
class _Work:
    """What one cycle of a partition has for one type: written in one transaction."""

    kept: _Type
    out: list[OutRecord] = field(default_factory=list)  # beside the command batch's
    letters: Counter[str] = field(default_factory=Counter)  # dead letters in `out`, by topic
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    batch: CommandBatch | None = None
    wrote: bool = False  # timer rows written (buffered in the partition's transaction)

    def dead_letter(self, record: Record, error: str) -> None:
        """Skips a bad record: its dead letter commits with the offset that passes it."""
        self.out.append(dead_letter_record(record, error))
        self.letters[record.topic] += 1

    def batch_of(self, p: int) -> CommandBatch | None:
        """The cycle's command batch, begun on first use; None: p's commands are not
        decided here."""
        processor = self.kept.processors.get(p)
        if self.batch is None and processor is not None:
            self.batch = processor.begin()
        return self.batch


class _InProcess:
    """The runner's `LocalFirer`: a timer whose target is an aggregate of the same type in
    the timer's own partition (the default: its owner) is decided by this node, in the
    partition's transaction, instead of a round trip through the command topic."""

    def __init__(self, node: Node, type_name: str) -> None:
        self._node = node
        self._type_name = type_name

    def accepts(self, timer: Timer) -> bool:
        kept = self._node.types.get(self._type_name)
        if kept is None or timer.partition not in kept.processors:
            return False
        target = timer.target
        if target.context != kept.topics.context or target.aggregate != kept.topics.aggregate:
            return False
        return target == timer.owner or (
            partition_of(target.id, self._node.settings.partitions) == timer.partition
        )

    def fire(self, timers: list[Timer]) -> None:
        self._node._fire_local(self._type_name, timers)


class Node:
    def __init__(
        self,
        settings: Settings,
        service: Service,
        *,
        clock: Clock | None = None,
        options: TimerOptions | None = None,
        ledger: FailureLedger | None = None,
    ) -> None:
        self.settings = settings
        self.service = service
        self.clock: Clock = clock or SystemClock()
        self.options = options or settings.timers
        # One ledger per context, on its topic (started in `start`), unless one is given.
        self.ledger: FailureLedger | None = ledger
        self._ledgers: dict[str, KafkaFailureLedger] = {}
        # The declared aggregates and each context's schedule (its jobs), by type name.
        self.aggregates = {a.type_name: a for a in service.all_aggregates(settings.partitions)}
        names = list(self.aggregates)
        names += [n for n in settings.aggregate_types if n not in names]
        self.topics = [parse_aggregate_type(n) for n in names]
        self.producer = Producer(settings.bootstrap_servers)
        self.types: dict[str, _Type] = {}
        self._by_topic: dict[str, tuple[_Type, str]] = {}
        self._results: dict[str, ResultsReader] = {}
        self._consumer: GroupConsumer | None = None
        self._lock = asyncio.Lock()
        self._owned: set[int] = set()
        # Per partition, how many times it was taken: a batch polled before a take is
        # stale (the take rewound p to its committed offsets) and is never handed over.
        self._takes: Counter[int] = Counter()
        self._taking: dict[int, asyncio.Task[None]] = {}
        self._queues: dict[int, asyncio.Queue[tuple[str, list[Record]]]] = {}
        self._workers: dict[int, asyncio.Task[None]] = {}
        # A partition's lock: held by its worker's cycle and around every commit of it, so
        # that what a cycle writes (events, settles) commits in the cycle's transaction.
        self._plocks: defaultdict[int, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._to_commit: dict[tuple[str, int], int] = {}
        # Per type and partition: when its last commit started, and the one in flight.
        self._committed_at: dict[tuple[str, int], float] = {}
        self._commits: dict[tuple[str, int], asyncio.Task[bool]] = {}
        # Claimed timers handed over to be fired in-process, per partition and type.
        self._local: defaultdict[int, defaultdict[str, list[Timer]]] = defaultdict(
            lambda: defaultdict(list)
        )
        # Partitions whose work stopped on a failure, and why, until they are taken again.
        self._broken: dict[int, str] = {}
        self._failure: NodeFailed | None = None
        self._failed = asyncio.Event()
        # When the suspension watch last ran, and how long the process was last stopped
        # (SIGSTOP, a paused VM) for longer than the group's session timeout: until the
        # group answers again it no longer knows what it owns.
        self._ticked = time.monotonic()
        self._suspended: float | None = None
        self.metrics = NodeMetrics()
        self.broker = BrokerWatch(settings.bootstrap_servers, registry=self.metrics.registry)
        self.reader = Reader(settings.bootstrap_servers)
        self.ready = asyncio.Event()

    @property
    def restoring(self) -> frozenset[int]:
        """The partitions assigned to this node that it is still restoring."""
        return frozenset(self._taking)

    @property
    def ledgers(self) -> list[FailureLedger]:
        return [self.ledger] if self.ledger is not None else list(self._ledgers.values())

    async def refresh_metrics(self) -> None:
        """Sets the gauges a scrape reads (the /metrics handler awaits it first)."""
        ledgers = (
            dict(self._ledgers)
            if self.ledger is None
            else {",".join(sorted({t.context for t in self.topics})): self.ledger}
        )
        sources = [(name, kept.store, kept.runner) for name, kept in self.types.items()]
        await self.metrics.refresh(self.clock.now(), sources, ledgers)

    def _batch_committed(
        self, type_name: str, processor: CommandProcessor, batch: CommandBatch, written: list[int]
    ) -> None:
        processor.committed(batch, written[: len(batch.out)])
        # The timers' commands are applied now: their lateness is measured at the commit.
        self.metrics.fired(type_name, batch.fired_due, self.clock.now())

    @property
    def owned(self) -> frozenset[int]:
        """The partitions this node owns now (the same p of every type)."""
        return frozenset(self._owned)

    def health(self) -> dict[str, Any]:
        """What `/healthz` says: ready only while every partition given to this node runs.

        Not ready while a partition is restored, was let go on a failure and not taken
        again yet, or its firing loop keeps failing; or when the node failed for good.
        """
        stalled = dict(self._broken)
        if (suspended := self._suspension()) is not None:
            for p in self._owned | set(self._taking):
                stalled.setdefault(
                    p, f"the process was stopped for {suspended:.1f} s: waiting for the group"
                )
        for kept in self.types.values():
            if kept.loop.failing:
                for p in self._owned:
                    stalled.setdefault(p, f"{kept.topics.type_name}: timer rounds failing")
        restoring = sorted(self._taking)
        broker = self.broker.status()
        body: dict[str, Any] = {
            "owned": sorted(self._owned),
            "restoring": restoring,
            "stalled": {str(p): why for p, why in sorted(stalled.items())},
            "broker": broker,
            "ready": bool(broker["reachable"])
            and not restoring
            and not stalled
            and self._failure is None,
        }
        if suspended is not None:
            body["suspended_s"] = round(suspended, 3)
        if self._failure is not None:
            body["failed"] = str(self._failure)
        return body

    def _suspension(self) -> float | None:
        """How long the process was stopped, while the group has not answered since."""
        gap = time.monotonic() - self._ticked
        if gap * 1000 > self.settings.session_timeout_ms:
            self._suspended = gap  # read before the watch woke up after the stop
        return self._suspended

    async def _watch_suspension(self) -> None:
        """Notices the process was stopped longer than the session timeout: the group has
        given its partitions to others meanwhile (cleared by its next assignment)."""
        while True:
            await asyncio.sleep(0.1)
            gap = time.monotonic() - self._ticked
            if gap * 1000 > self.settings.session_timeout_ms:
                self._suspended = gap
                logger.warning("stopped for %.1f s: not ready until the group answers", gap)
            self._ticked = time.monotonic()

    async def start(self) -> None:
        s = self.settings
        await self.broker.start()
        await ensure_topics(s.bootstrap_servers, node_topics(self.topics, s.partitions))
        # Before any local store is opened: a copy of another cluster's topics is dropped.
        keep_for_cluster(
            Path(s.data_dir),
            await cluster_id(s.bootstrap_servers),
            [t.type_name for t in self.topics],
        )
        await self.producer.start()
        await self.reader.start()
        for ctx in sorted({t.context for t in self.topics}):
            reader = ResultsReader(s.bootstrap_servers, ctx)
            await reader.start()
            self._results[ctx] = reader
            if self.ledger is None:
                ledger = KafkaFailureLedger(s.bootstrap_servers, ctx, s.partitions, self.producer)
                await ledger.start()
                self._ledgers[ctx] = ledger
        for t in self.topics:
            self.types[t.type_name] = kept = self._open_type(t)
            self._by_topic[t.events] = (kept, "events")
            self._by_topic[t.timer_ops] = (kept, "timer-ops")
            if kept.agg is not None:
                self._by_topic[t.commands] = (kept, "commands")
        self._consumer = GroupConsumer(
            s.bootstrap_servers,
            s.group_id,
            list(self._by_topic),
            on_assigned=self._assigned,
            on_revoked=self._revoked,
            session_timeout_ms=s.session_timeout_ms,
        )
        await self._consumer.start()

    def _open_type(self, t: AggregateTopics) -> _Type:
        s = self.settings
        directory = Path(s.data_dir) / t.type_name
        (directory / "timers").mkdir(parents=True, exist_ok=True)
        changelog = TransactionalChangelog(
            s.bootstrap_servers,
            t.timers_changelog,
            s.group_id,
            on_commit=self.metrics.commit_duration.labels(t.type_name).observe,
        )
        store = open_timer_store(
            f"rocksdb://{(directory / 'timers').resolve()}",
            partitions=s.partitions,
            changelog=changelog,
        )
        sender = KafkaSender(self.producer, self._results[t.context], t.context, self.clock.now)
        ledger = self.ledger or self._ledgers[t.context]
        agg = self.aggregates.get(t.type_name)

        async def before_send(partitions: set[int]) -> None:
            await self._commit_claims(t.type_name, partitions)

        runner = TimerRunner(
            store,
            sender,
            self.clock,
            ledger,
            self.options,
            local=_InProcess(self, t.type_name) if agg is not None else None,
            before_send=before_send,
        )
        states = RocksAggregateStore(directory / "states") if agg is not None else None
        marks = CleanMarks(directory / "timers")
        loop = TimerLoop(runner, on_round=lambda stats: self.metrics.round(t.type_name, stats))
        return _Type(t, agg, store, runner, loop, states, changelog, marks)

    async def stop(self) -> None:
        for kept in self.types.values():
            await kept.runner.stop_all()
            await kept.loop.stop()
        if self._consumer is not None:
            await self._consumer.stop()
        # Whatever the consumer did not revoke on leaving the group is let go here.
        await self._revoked({("", p) for p in self._owned | set(self._taking)})
        for reader in self._results.values():
            await reader.stop()
        for ledger in self._ledgers.values():
            await ledger.stop()
        await self.producer.stop()
        await self.reader.stop()
        await self.broker.stop()
        for kept in self.types.values():
            await kept.store.close()
            if kept.states is not None:
                kept.states.close()

    async def run(self) -> None:
        """Reads the owned partitions' logs and commands until cancelled; `NodeFailed`
        when a partition it was given cannot be worked on (the node stops loudly)."""
        assert self._consumer is not None, "start() first"
        for kept in self.types.values():
            kept.loop.start()
        committer = asyncio.create_task(self._commit_changelogs(), name="changelog commits")
        reader = asyncio.create_task(self._read(), name="reader")
        failed = asyncio.create_task(self._failed.wait(), name="failure")
        watch = asyncio.create_task(self._watch_suspension(), name="suspension watch")
        tasks: list[asyncio.Task[Any]] = [committer, reader, failed, watch]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in (committer, reader):
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise NodeFailed(f"{task.get_name()} failed: {task.exception()!r}")
            if self._failure is not None:
                raise self._failure
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for p in list(self._workers):
                await self._stop_worker(p)

    def _fail(self, why: str) -> None:
        """Stops the node: it cannot do the work it was given."""
        logger.critical("node failed: %s", why)
        self._failure = NodeFailed(why)
        self._failed.set()

    async def _read(self) -> None:
        """Hands each polled batch to its partition's worker, and commits what they did.

        Partitions are independent: each has a worker of its own, so one partition's slow
        transaction does not hold up the others' commands.
        """
        assert self._consumer is not None
        while True:
            try:
                batches = await self._consumer.poll(timeout_ms=200)
                takes = self._takes.copy()  # no await since the poll: as it was fetched
                for (topic, p), records in batches.items():
                    # else revoked, or taken again (and rewound) since it was fetched
                    if p in self._owned and self._takes[p] == takes[p]:
                        await self._worker(p).put((topic, records))
                done, self._to_commit = self._to_commit, {}
                await self._consumer.commit(done)
            except KafkaUnavailable as exc:
                # The broker or the group is in flux: the node keeps going and reads again.
                logger.warning("reading paused: %s", exc)
                await asyncio.sleep(1)

    def _worker(self, p: int) -> asyncio.Queue[tuple[str, list[Record]]]:
        queue = self._queues.get(p)
        if queue is None:
            # Bounded: a partition that falls behind holds the poll loop up, not memory.
            queue = self._queues[p] = asyncio.Queue(maxsize=4)
            self._workers[p] = asyncio.create_task(self._work(p, queue), name=f"partition {p}")
        return queue

    async def _work(self, p: int, queue: asyncio.Queue[tuple[str, list[Record]]]) -> None:
        """Partition p's cycles: each takes every batch that arrived (and the timers handed
        over to fire), decides them, and commits them in one transaction per type."""
        done: dict[str, int] = {}  # per topic, the last offset done (a batch read twice)
        while True:
            items = [await queue.get()]
            while not queue.empty():
                items.append(queue.get_nowait())
            async with self._plocks[p]:
                if p not in self._owned:
                    continue
                fresh = [
                    (topic, records)
                    for topic, records in items
                    if records and records[0].offset > done.get(topic, -1)
                ]
                if await self._cycle(p, fresh):
                    for topic, records in fresh:
                        done[topic] = records[-1].offset

    async def _stop_worker(self, p: int) -> None:
        task = self._workers.pop(p, None)
        queue = self._queues.pop(p, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        while queue is not None and not queue.empty():
            queue.get_nowait()  # frees a poll loop waiting to put; the batches are stale

    def _fire_local(self, type_name: str, timers: list[Timer]) -> None:
        """Takes claimed timers to fire in their partition's next cycle."""
        for t in timers:
            self._local[t.partition][type_name].append(t)
        for p in {t.partition for t in timers}:
            queue = self._worker(p)
            if not queue.full():  # else the worker has batches to do, and fires with them
                queue.put_nowait(_LOCAL)

    async def _cycle(self, p: int, items: list[tuple[str, list[Record]]]) -> bool:
        """Decides what arrived for p and the timers handed over to fire, and commits it;
        whether it committed (else p is let go and taken afresh)."""
        assert self._consumer is not None
        work: dict[str, _Work] = {}
        try:
            for topic, records in items:
                kept, kind = self._by_topic[topic]
                w = work.setdefault(kept.topics.type_name, _Work(kept))
                w.offsets[(topic, p)] = records[-1].offset + 1
                if kind == "events":
                    w.wrote = await self._subscribe(kept, records, w) or w.wrote
                elif kind == "timer-ops":
                    await self._operate(kept, records, w)
                    w.wrote = True
                elif (batch := w.batch_of(p)) is not None:
                    backlog = await self._consumer.backlog(topic, p)
                    kept.processors[p].decide_records(batch, records, backlog)
            for type_name, timers in self._local.pop(p, {}).items():
                kept = self.types[type_name]
                w = work.setdefault(type_name, _Work(kept))
                if (batch := w.batch_of(p)) is None:
                    continue  # its commands are not decided here any more
                # A cancel or reschedule applied since they were loaded stops them here.
                timers = await kept.runner.still_due(timers)
                commands = [timer_command(t, batch.now, in_process=True) for t in timers]
                decided = kept.processors[p].decide_local(batch, commands)
                await self._record_local(kept, timers, decided)
            for w in work.values():
                await self._commit_work(p, w)
        except Exception as exc:
            # Nothing of the cycle counts: the partition is taken again and read from its
            # committed offsets (every write is idempotent).
            if not isinstance(exc, KafkaUnavailable | StoreError):
                logger.exception("partition %d: a cycle failed", p)
            self._partition_failed(p, "a cycle", exc)
            return False
        return True

    async def _record_local(
        self,
        kept: _Type,
        timers: list[Timer],
        decided: list[tuple[CommandEnvelope, ResultCode, str]],
    ) -> None:
        """Settles the timers fired in-process (before the cycle commits)."""
        by_request = {t.request_id: t for t in timers}
        outcomes = [
            (by_request[cmd.request_id], SendResult(code.value, message))
            for cmd, code, message in decided
        ]
        self.metrics.round(kept.topics.type_name, await kept.runner.record_outcomes(outcomes))

    async def _commit_work(self, p: int, w: _Work) -> None:
        """Stages the cycle's work in p's transaction, and commits it at once unless p
        committed less than a commit interval ago (then the committer does, by then)."""
        kept = w.kept
        if w.batch is not None and w.batch.empty:
            w.batch = None
        in_flight = (kept.topics.type_name, p) in self._commits
        if (
            w.batch is None
            and not w.out
            and not w.wrote
            and not kept.changelog.staged(p)
            and not in_flight
        ):
            # Nothing written (most of a busy log is not about timers): no transaction
            # needed; the offsets are committed with the others.
            self._to_commit.update(w.offsets)
            return
        records = w.batch.out + w.out if w.batch is not None else w.out
        offsets = w.offsets if w.batch is None else w.offsets | w.batch.offsets
        committed = None
        if (batch := w.batch) is not None:
            processor = kept.processors[p]
            processor.staged(batch)
            committed = functools.partial(
                self._batch_committed, kept.topics.type_name, processor, batch
            )
            for code, n in batch.stats.codes.items():
                self.metrics.commands.labels(kept.topics.type_name, code).inc(n)
            if batch.stats.dead_letters:
                topic = kept.topics.commands
                self.metrics.dead_letters.labels(topic).inc(batch.stats.dead_letters)
        for topic, n in w.letters.items():
            self.metrics.dead_letters.labels(topic).inc(n)
        kept.changelog.stage(p, records, offsets, committed)
        if self._may_commit(kept, p):
            self._start_commit(kept, p)

    def _may_commit(self, kept: _Type, p: int) -> bool:
        """Whether p may start a commit now: none in flight (the next takes all that waits
        meanwhile), and the last started a commit interval ago."""
        key = (kept.topics.type_name, p)
        if key in self._commits:
            return False
        last = self._committed_at.get(key, 0.0)
        return time.monotonic() - last >= self.settings.commit_interval_ms / 1000

    def _start_commit(self, kept: _Type, p: int) -> asyncio.Task[bool] | None:
        """Takes what waits in p's transaction (under p's lock, so that no cycle is cut in
        two) and commits it in the background, after the commits taken before it; the
        commit (True: committed), or the one in flight when nothing waits."""
        key = (kept.topics.type_name, p)
        taken = kept.changelog.take(p)
        if taken is None:
            return self._commits.get(key)
        self._committed_at[key] = time.monotonic()
        task = asyncio.create_task(self._send(p, taken), name=f"commit {key}")
        self._commits[key] = task
        task.add_done_callback(
            lambda t: self._commits.pop(key, None) if self._commits.get(key) is t else None
        )
        return task

    async def _send(self, p: int, taken: Transaction) -> bool:
        try:
            await taken.send()
        except Exception as exc:
            # Kafka's or the local store's (a state write after the commit): either way
            # p's local copy is not what its changelog says, so it is taken afresh.
            if not isinstance(exc, KafkaUnavailable):
                logger.exception("partition %d: a commit failed", p)
            self._partition_failed(p, "a commit", exc)
            return False
        return True

    def _partition_failed(self, p: int, what: str, exc: BaseException) -> None:
        """Ends p's work on a failure of its transaction or store: what it wrote since its
        last commit may never count. It is let go and taken afresh (restored from the
        changelog and the log, read again from the committed offsets); when fenced, a
        newer owner has it, and it is taken again only if the group still gives it here."""
        if p not in self._owned:
            return
        fenced = _fenced(exc)
        why = f"{what} failed: {exc}"
        logger.warning("partition %d: %s; %s", p, why, "let go" if fenced else "taken afresh")
        self._owned.discard(p)
        self._broken[p] = why
        assert self._consumer is not None
        self._consumer.pause([(t, q) for t, q in self._consumer.assignment() if q == p])
        topics = {t for t, q in self._consumer.assignment() if q == p}
        delay = 2 * self.settings.session_timeout_ms / 1000 if fenced else 0.0
        self._taking[p] = asyncio.create_task(
            self._take_in_background(p, topics, after_failure=delay), name=f"retake {p}"
        )

    async def _commit_changelogs(self) -> None:
        """Commits what waits in each partition's transaction as soon as it may (see
        `_may_commit`): the cycles' staged work and the runners' writes."""
        tick = min(self.settings.commit_interval_ms, 10) / 1000
        while True:
            await asyncio.sleep(tick)
            for kept in self.types.values():
                for p in kept.changelog.pending():
                    if not self._may_commit(kept, p):
                        continue
                    async with self._plocks[p]:
                        if p in self._owned and kept.changelog.owns(p):
                            self._start_commit(kept, p)

    async def _commit_claims(self, type_name: str, partitions: set[int]) -> None:
        """The runner's `before_send`: its claims commit before their commands leave."""
        kept = self.types[type_name]
        for p in sorted(partitions):
            async with self._plocks[p]:
                if p not in self._owned or not kept.changelog.owns(p):
                    raise KafkaUnavailable(f"partition {p} is not owned")
                commit = self._start_commit(kept, p)
            if commit is None:
                continue
            try:
                committed = await asyncio.shield(commit)
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
                committed = False  # the partition was let go meanwhile
            if not committed:
                raise KafkaUnavailable(f"partition {p}: claims not committed")

    async def _subscribe(self, kept: _Type, records: list[Record], w: _Work) -> bool:
        """Applies a log batch to the timer table, its bad records' dead letters added to
        the cycle's records; whether it wrote anything."""
        ops: list[TimerOp] = []
        partitions = self.settings.partitions
        p = records[0].partition
        batch = w.batch_of(p)  # None: p's aggregates are not decided here
        known = SYSTEM_EVENTS | (kept.agg.appliers.keys() if kept.agg is not None else set())
        for record in records:
            try:
                event = decode(EventEnvelope, record.value)
                if (why := misrouted(record, event.aggregate, partitions)) is not None:
                    raise BadRecord(why)
                if event.type.startswith("wow.") and event.type not in known:
                    raise BadRecord(f"unknown system event type {event.type!r}")
                if batch is not None and kept.processors[p].follow(batch, event, record.offset):
                    self.metrics.followed.labels(kept.topics.type_name).inc()
                op = timer_op(event, record.partition)
            except BadRecord as exc:
                w.dead_letter(record, str(exc))
                continue
            if op is not None:
                ops.append(op)
        if not ops:
            return False
        writes, put = await apply_all(kept.store, ops)
        if put:
            self.metrics.puts.labels(kept.topics.type_name).inc(len(put))
            kept.runner.offer(put)
            kept.loop.wake(reload=False)
        return writes > 0

    async def _operate(self, kept: _Type, records: list[Record], w: _Work) -> None:
        """Carries out operators' retry/skip requests on this partition's parked timers."""
        for record in records:
            try:
                op = decode(OperatorRequest, record.value)
            except BadRecord as exc:
                w.dead_letter(record, str(exc))
                continue
            try:
                await carry_out(kept.runner, op, record.partition)
            except TimeoutError as exc:
                # Not carried out (the ledger did not answer in time): read it again.
                raise KafkaUnavailable(f"operator request {op.request_id}: {exc!r}") from exc

    async def _assigned(self, assigned: set[tuple[str, int]]) -> None:
        """Starts restoring the new partitions in the background, paused until they are.

        Restoring inside the rebalance callback would hold the group up (and a long restore
        would cost the node its membership): the consumer is paused on them instead.
        """
        assert self._consumer is not None
        self._suspended = None  # the group answered
        async with self._lock:
            new = sorted({p for _, p in assigned} - self._owned - set(self._taking))
            self._consumer.pause([(t, p) for t, p in assigned if p in new])
            for p in new:
                topics = {t for t, q in assigned if q == p}
                self._taking[p] = asyncio.create_task(self._take_in_background(p, topics))
            if not new:
                self._owning()

    async def _take_in_background(
        self, p: int, topics: set[str], after_failure: float | None = None
    ) -> None:
        """Takes p (fencing its previous owner, restoring), then starts its work.

        `after_failure`: p's work stopped on a failure: it is let go first (nothing of its
        local copy is trusted), and taken again after that many seconds if the group still
        gives it to this node. A partition that cannot be taken stops the node.
        """
        assert self._consumer is not None
        try:
            if after_failure is not None:
                await self._stop_worker(p)
                async with self._lock:
                    await self._let_go(p, clean=False)
                await asyncio.sleep(after_failure)
                topics &= {t for t, q in self._consumer.assignment() if q == p}
                if not topics:
                    self._broken.pop(p, None)
                    return  # the group moved it meanwhile
            for attempt in range(1, _TAKE_ATTEMPTS + 1):
                try:
                    await self._take(p, topics)
                    await self._consumer.rewind([(t, p) for t in topics])
                    break
                except (KafkaUnavailable, StoreError) as exc:
                    logger.warning(
                        "taking partition %d failed (%d/%d): %s", p, attempt, _TAKE_ATTEMPTS, exc
                    )
                    await self._let_go(p, clean=False)
                    await asyncio.sleep(min(0.2 * 2**attempt, 5))
            else:
                self._fail(f"partition {p} could not be taken in {_TAKE_ATTEMPTS} attempts")
                return
            async with self._lock:
                self._owned.add(p)
                self._takes[p] += 1
                self._broken.pop(p, None)
                self._consumer.resume([(t, p) for t in topics])
                for kept in self.types.values():
                    kept.runner.start_partition(p)
                    kept.loop.wake()
                if not self._taking.keys() - {p}:
                    self._owning()
                    self.ready.set()
        finally:
            if self._taking.get(p) is asyncio.current_task():
                del self._taking[p]

    async def _take(self, p: int, topics: set[str]) -> None:
        for kept in self.types.values():
            t = kept.topics
            if t.events not in topics:
                continue
            # One producer per partition and type: starting it fences the previous owner,
            # before anything of p is read.
            await kept.changelog.open(p)
            if t.commands in topics and kept.agg is not None and kept.states is not None:
                processor = CommandProcessor(
                    kept.agg,
                    p,
                    partitions=self.settings.partitions,
                    states=kept.states,
                    commit=_committer(kept.changelog, p),
                    now=self.clock.now,
                    busy_backlog=self.settings.busy_backlog,
                )
                kept.processors[p] = processor
                progress = self.metrics.restore_progress(t.type_name, p, "states")
                with self.metrics.restore_duration.labels(t.type_name, "states").time():
                    await processor.restore(self.reader, progress)
            clean = kept.marks.take(p)
            await kept.store.assign({p})
            progress = self.metrics.restore_progress(t.type_name, p, "timers")
            with self.metrics.restore_duration.labels(t.type_name, "timers").time():
                await restore_partition(
                    kept.store, self.reader, t.timers_changelog, p, clean=clean, progress=progress
                )
                # Counted whole once, here, where a restore is waited for anyway: from now
                # on each write keeps the count (the /metrics gauges scan nothing).
                kept.store.status_counts(p)
        for results in self._results.values():
            await results.add_partition(p)

    async def _revoked(self, revoked: set[tuple[str, int]]) -> None:
        gone = {p for _, p in revoked}
        taking = [task for p, task in self._taking.items() if p in gone]
        for task in taking:
            task.cancel()
        await asyncio.gather(*taking, return_exceptions=True)
        for p in gone:
            await self._stop_worker(p)
            self._broken.pop(p, None)
        async with self._lock:
            for p in sorted(gone & (self._owned | self._half_taken())):
                await self._let_go(p)
            self._owning()

    def _owning(self) -> None:
        self.metrics.owned.set(len(self._owned))
        logger.info("owning partitions %s", sorted(self._owned))

    def _half_taken(self) -> set[int]:
        """Partitions with something of them open though they are not owned (yet)."""
        return {p for kept in self.types.values() for p in kept.processors} | {
            p for kept in self.types.values() for p in kept.store.assigned
        }

    async def _let_go(self, p: int, *, clean: bool = True) -> None:
        """Stops everything of partition p this node runs (whole or half taken); never
        raises. `clean`: commit what p's transaction holds first (a hand-off); otherwise
        it is thrown away and the local copy restored from the changelog next time."""
        self._owned.discard(p)
        self._local.pop(p, None)
        for kept in self.types.values():
            commit = self._commits.pop((kept.topics.type_name, p), None)
            if commit is not None:
                if not clean:
                    commit.cancel()
                await asyncio.gather(commit, return_exceptions=True)
            try:
                await kept.runner.stop_partition(p)
                if clean:
                    committed = await kept.changelog.close(p)
                else:
                    await kept.changelog.abandon(p)
                    committed = False
                if p in kept.store.assigned:
                    await kept.store.revoke({p})
                if committed:
                    kept.marks.mark(p)
                if kept.processors.pop(p, None) is not None:
                    assert kept.states is not None
                    kept.states.release(p)
            except Exception:
                logger.exception("letting partition %d of %s go failed", p, kept.topics.type_name)
        for reader in self._results.values():
            try:
                await reader.remove_partition(p)
            except Exception:
                logger.exception("results reader: letting partition %d go failed", p)


def _committer(changelog: TransactionalChangelog, p: int) -> Commit:
    """The command path's commit: p's one transaction."""

    async def commit(
        records: Sequence[OutRecord], offsets: dict[tuple[str, int], int]
    ) -> list[int]:
        return await changelog.commit(p, offsets, records)

    return commit
