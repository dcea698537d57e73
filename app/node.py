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
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.aggregate import AggregateType, Service
from app.changelog import CleanMarks, TransactionalChangelog, restore_partition
from app.exceptions import BadRecord
from app.kafka import (
    Fenced,
    GroupConsumer,
    KafkaUnavailable,
    Producer,
    Reader,
    Record,
    TopicSpec,
    TransactionalProducer,
    ensure_topics,
)
from app.ledger import KafkaFailureLedger
from app.metrics import NodeMetrics
from app.operator import TimerOp, carry_out
from app.processor import CommandProcessor, dead_letter_record
from app.runner import Clock, SystemClock, TimerLoop, TimerOptions, TimerRunner
from app.sender import KafkaSender, ResultsReader
from app.settings import Settings
from app.subscription import PutTimer, apply, timer_op
from app.topics import AggregateTopics, ContextTopics, parse_aggregate_type
from app.web import WebServer
from app.wire import EventEnvelope, decode
from tables import StoreError, TimerStore, open_timer_store
from tables.aggregate_store import RocksAggregateStore
from tables.ledger import FailureLedger

__all__ = ["Node", "node_topics"]

logger = logging.getLogger(__name__)


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
        self._taking: dict[int, asyncio.Task[None]] = {}
        self._queues: dict[int, asyncio.Queue[tuple[str, list[Record]]]] = {}
        self._workers: dict[int, asyncio.Task[None]] = {}
        self._plocks: defaultdict[int, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._to_commit: dict[tuple[str, int], int] = {}
        self.metrics = NodeMetrics()
        self._web: WebServer | None = None
        self.reader = Reader(settings.bootstrap_servers)
        self.ready = asyncio.Event()

    @property
    def restoring(self) -> frozenset[int]:
        """The partitions assigned to this node that it is still restoring."""
        return frozenset(self._taking)

    @property
    def ledgers(self) -> list[FailureLedger]:
        return [self.ledger] if self.ledger is not None else list(self._ledgers.values())

    @property
    def web_port(self) -> int | None:
        return None if self._web is None else self._web.port

    @property
    def owned(self) -> frozenset[int]:
        """The partitions this node owns now (the same p of every type)."""
        return frozenset(self._owned)

    async def start(self) -> None:
        s = self.settings
        await ensure_topics(s.bootstrap_servers, node_topics(self.topics, s.partitions))
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
        if s.web_port:
            self._web = WebServer(self, s.web_port)
            await self._web.start()

    def _open_type(self, t: AggregateTopics) -> _Type:
        s = self.settings
        directory = Path(s.data_dir) / t.type_name
        (directory / "timers").mkdir(parents=True, exist_ok=True)
        changelog = TransactionalChangelog(s.bootstrap_servers, t.timers_changelog, s.group_id)
        store = open_timer_store(
            f"rocksdb://{(directory / 'timers').resolve()}",
            partitions=s.partitions,
            changelog=changelog,
        )
        sender = KafkaSender(self.producer, self._results[t.context], t.context, self.clock.now)
        ledger = self.ledger or self._ledgers[t.context]
        runner = TimerRunner(store, sender, self.clock, ledger, self.options)
        agg = self.aggregates.get(t.type_name)
        states = RocksAggregateStore(directory / "states") if agg is not None else None
        marks = CleanMarks(directory / "timers")
        loop = TimerLoop(runner, on_round=lambda stats: self.metrics.round(t.type_name, stats))
        return _Type(t, agg, store, runner, loop, states, changelog, marks)

    async def stop(self) -> None:
        if self._web is not None:
            await self._web.stop()
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
        for kept in self.types.values():
            await kept.store.close()
            if kept.states is not None:
                kept.states.close()

    async def run(self) -> None:
        """Reads the owned partitions' logs and commands until cancelled."""
        assert self._consumer is not None, "start() first"
        for kept in self.types.values():
            kept.loop.start()
        committer = asyncio.create_task(self._commit_changelogs(), name="changelog commits")
        try:
            await self._read()
        finally:
            committer.cancel()
            await asyncio.gather(committer, return_exceptions=True)
            for p in list(self._workers):
                await self._stop_worker(p)

    async def _read(self) -> None:
        """Hands each polled batch to its partition's worker, and commits what they did.

        Partitions are independent: each has a worker of its own, so one partition's slow
        transaction does not hold up the others' commands.
        """
        assert self._consumer is not None
        while True:
            try:
                batches = await self._consumer.poll(timeout_ms=200)
                for (topic, p), records in batches.items():
                    if p in self._owned:  # else revoked while it was fetched
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
        # Per topic: the last offset done, or the offset a failed batch must be read from
        # again (batches fetched before the seek are then stale and dropped).
        done: dict[str, int] = {}
        rewound: dict[str, int] = {}
        while True:
            topic, records = await queue.get()
            first = records[0].offset
            if topic in rewound:
                if first != rewound[topic]:
                    continue
                del rewound[topic]
            elif first <= done.get(topic, -1):
                continue
            async with self._plocks[p]:
                if p not in self._owned:
                    continue
                ok, commit = await self._process_partition(topic, p, records)
            if ok:
                done[topic] = records[-1].offset
                if commit:
                    self._to_commit[(topic, p)] = records[-1].offset + 1
            else:
                rewound[topic] = first

    async def _stop_worker(self, p: int) -> None:
        task = self._workers.pop(p, None)
        queue = self._queues.pop(p, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        while queue is not None and not queue.empty():
            queue.get_nowait()  # frees a poll loop waiting to put; the batches are stale

    async def _process_partition(
        self, topic: str, p: int, records: list[Record]
    ) -> tuple[bool, bool]:
        """Handles one partition's batch: whether it was done, and whether its offsets are
        to be committed outside a transaction."""
        assert self._consumer is not None
        kept, kind = self._by_topic[topic]
        try:
            if kind == "events":
                if await self._subscribe(kept, records):
                    # The view's writes and the log offsets commit together.
                    await kept.changelog.commit(p, {(topic, p): records[-1].offset + 1})
                    return True, False
                # Nothing written (most of a busy log is not about timers): no transaction
                # needed; the offsets are committed with the others.
                return True, True
            elif kind == "timer-ops":
                await self._operate(kept, records)
                await kept.changelog.commit(p)
                return True, True
            else:
                processor = kept.processors.get(p)
                if processor is not None:
                    backlog = await self._consumer.backlog(topic, p)
                    stats = await processor.handle(records, backlog)
                    for code, n in stats.codes.items():
                        self.metrics.commands.labels(kept.topics.type_name, code).inc(n)
                    if stats.dead_letters:
                        self.metrics.dead_letters.labels(topic).inc(stats.dead_letters)
        except (KafkaUnavailable, StoreError) as exc:
            # Nothing of the batch counts: read it again (every write is idempotent).
            logger.warning("%s[%d] batch failed, reading it again: %s", topic, p, exc)
            if _fenced(exc):
                logger.warning("partition %d was taken over: letting it go", p)
                await self._let_go(p)
            elif kind != "commands":
                await self._reset(kept, p)
            self._consumer.seek(topic, p, records[0].offset)
            await asyncio.sleep(0.5)
            return False, False
        return True, False

    async def _reset(self, kept: _Type, p: int) -> None:
        """After a failed changelog commit the local copy may hold writes that never counted:
        restore it from the changelog."""
        if p not in self._owned:
            return
        await kept.runner.stop_partition(p)
        await kept.changelog.close(p)
        await kept.changelog.open(p)
        await restore_partition(
            kept.store, self.reader, kept.topics.timers_changelog, p, clean=False
        )
        kept.runner.start_partition(p)

    async def _commit_changelogs(self) -> None:
        """Commits the runners' writes every `commit_interval_ms`."""
        interval = self.settings.commit_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            for kept in self.types.values():
                for p in kept.changelog.pending():
                    try:
                        await kept.changelog.commit(p)
                    except KafkaUnavailable as exc:
                        logger.warning("changelog commit of %d failed: %s", p, exc)
                        async with self._lock, self._plocks[p]:
                            if _fenced(exc):
                                await self._let_go(p)
                            else:
                                await self._reset(kept, p)

    async def _subscribe(self, kept: _Type, records: list[Record]) -> int:
        """Applies a log batch to the timer table; how many writes it made."""
        woke = False
        writes = 0
        for record in records:
            try:
                event = decode(EventEnvelope, record.value)
                op = timer_op(event, record.partition)
            except BadRecord as exc:
                await self._dead_letter(record, str(exc))
                continue
            if op is not None and await apply(kept.store, op):
                writes += 1
                woke = woke or isinstance(op, PutTimer)
        if woke:
            kept.loop.wake()
        return writes

    async def _dead_letter(self, record: Record, error: str) -> None:
        topic, partition, key, value = dead_letter_record(record, error)
        await self.producer.send(topic, key, value, partition)
        self.metrics.dead_letters.labels(record.topic).inc()

    async def _operate(self, kept: _Type, records: list[Record]) -> None:
        """Carries out operators' retry/skip requests on this partition's parked timers."""
        for record in records:
            try:
                op = decode(TimerOp, record.value)
            except BadRecord as exc:
                await self._dead_letter(record, str(exc))
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
        async with self._lock:
            new = sorted({p for _, p in assigned} - self._owned - set(self._taking))
            self._consumer.pause([(t, p) for t, p in assigned if p in new])
            for p in new:
                topics = {t for t, q in assigned if q == p}
                self._taking[p] = asyncio.create_task(self._take_in_background(p, topics))
            if not new:
                self._owning()

    async def _take_in_background(self, p: int, topics: set[str], attempts: int = 10) -> None:
        assert self._consumer is not None
        try:
            for attempt in range(1, attempts + 1):
                try:
                    await self._take(p, topics)
                    break
                except (KafkaUnavailable, StoreError) as exc:
                    logger.warning(
                        "taking partition %d failed (%d/%d): %s", p, attempt, attempts, exc
                    )
                    await self._let_go(p)
                    await asyncio.sleep(min(0.2 * 2**attempt, 5))
            else:
                logger.error("partition %d could not be restored; it waits for its next owner", p)
                return
            async with self._lock:
                self._owned.add(p)
                self._consumer.resume([(t, p) for t in topics])
                for kept in self.types.values():
                    kept.runner.start_partition(p)
                    kept.loop.wake()
                if not self._taking.keys() - {p}:
                    self._owning()
                    self.ready.set()
        finally:
            self._taking.pop(p, None)

    async def _take(self, p: int, topics: set[str]) -> None:
        s = self.settings
        for kept in self.types.values():
            t = kept.topics
            if t.commands in topics and kept.agg is not None and kept.states is not None:
                producer = TransactionalProducer(
                    s.bootstrap_servers, f"{s.group_id}.{t.commands}.{p}"
                )
                await producer.start()  # fences the partition's previous owner
                processor = CommandProcessor(
                    kept.agg,
                    p,
                    partitions=s.partitions,
                    states=kept.states,
                    producer=producer,
                    group_id=s.group_id,
                    now=self.clock.now,
                    busy_backlog=s.busy_backlog,
                )
                kept.processors[p] = processor
                await processor.restore(self.reader)
            if t.events in topics:
                await kept.changelog.open(p)  # fences the partition's previous owner
                clean = kept.marks.take(p)
                await kept.store.assign({p})
                await restore_partition(kept.store, self.reader, t.timers_changelog, p, clean=clean)
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

    async def _let_go(self, p: int) -> None:
        """Stops everything of partition p this node runs (whole or half taken)."""
        self._owned.discard(p)
        for kept in self.types.values():
            await kept.runner.stop_partition(p)
            committed = await kept.changelog.close(p)
            if p in kept.store.assigned:
                await kept.store.revoke({p})
            if committed:
                kept.marks.mark(p)
            processor = kept.processors.pop(p, None)
            if processor is not None:
                await processor.stop()
                assert kept.states is not None
                kept.states.release(p)
        for reader in self._results.values():
            await reader.remove_partition(p)
