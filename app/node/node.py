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
import contextlib
import logging
from collections import Counter, defaultdict
from collections.abc import Awaitable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.commands.processor import (
    CommandProcessor,
    Commit,
)
from app.errors import (
    KafkaUnavailable,
    NodeFailed,
    node_fault,
)
from app.kafka import (
    OutRecord,
    Record,
)
from app.kafka.broker_watch import BrokerWatch
from app.kafka.catalog import TopicCatalog
from app.kafka.clients import KafkaClients
from app.kafka.ports import Clients, GroupMember
from app.kafka.records import BROKER_MAX_MESSAGE_BYTES, refused
from app.node.commits import Commits
from app.node.cycles import PartitionCycles
from app.node.failing import FailingPartitions
from app.node.in_process import InProcess
from app.node.kept import KeptType, is_fenced, node_topics
from app.node.local_state import keep_for_cluster
from app.node.metrics import NodeMetrics
from app.node.settings import Settings
from app.node.suspension import SuspensionWatch
from app.protocol.dead_letters import DEAD_LETTER_TOPIC_BYTES
from app.protocol.topics import AggregateTopics, ContextTopics, parse_aggregate_type
from app.service import Service
from app.timers.changelog import (
    CleanMarks,
    TransactionalChangelog,
    restore_partition,
    unreadable_letters,
)
from app.timers.ledger import KafkaFailureLedger
from app.timers.runner import Clock, SystemClock, TimerLoop, TimerOptions, TimerRunner
from app.timers.sender import KafkaSender, ResultsReader
from tables import open_timer_store
from tables.aggregate_store import RocksAggregateStore
from tables.ledger import FailureLedger

__all__ = ["Node", "node_topics"]

logger = logging.getLogger(__name__)


_TAKE_ATTEMPTS = 10
_FAILING_IN_A_ROW = 3
"""A partition failing this many times in a row at the same offsets makes the node not ready."""


class Node:
    def __init__(
        self,
        settings: Settings,
        service: Service,
        *,
        clock: Clock | None = None,
        options: TimerOptions | None = None,
        ledger: FailureLedger | None = None,
        clients: Clients | None = None,
    ) -> None:
        self.settings = settings
        self.service = service
        self.clock: Clock = clock or SystemClock()
        self.options = options or settings.timers
        # One ledger per context, on its topic (started in `start`), unless one is given.
        self.ledger: FailureLedger | None = ledger
        self._ledgers: dict[str, KafkaFailureLedger] = {}
        # The declared aggregates and each context's schedule (its jobs), by type name.
        self.aggregates = {
            a.type_name: a
            for a in service.all_aggregates(
                settings.partitions, request_id_window_ms=settings.request_id_window_ms
            )
        }
        names = list(self.aggregates)
        names += [n for n in settings.aggregate_types if n not in names]
        self.topics = [parse_aggregate_type(n) for n in names]
        # Kafka's clients at the settings' address, unless others are given (a MemoryLog).
        self.clients: Clients = clients or KafkaClients(
            settings.kafka, replication=settings.replication
        )
        self._admin = self.clients.admin()
        self.producer = self.clients.publisher()
        self.types: dict[str, KeptType] = {}
        self._by_topic: dict[str, tuple[KeptType, str]] = {}
        self._results: dict[str, ResultsReader] = {}
        self._consumer: GroupMember | None = None
        self._lock = asyncio.Lock()
        self._owned: set[int] = set()
        # Per partition, how many times it was taken: a batch polled before a take is
        # stale (the take rewound p to its committed offsets) and is never handed over.
        self._takes: Counter[int] = Counter()
        self._taking: dict[int, asyncio.Task[None]] = {}
        # Set (and replaced) at each assignment: a retake after a failure waits for it.
        self._answered = asyncio.Event()
        # A partition's lock: held by its worker's cycle and around taking its transaction.
        locks: defaultdict[int, asyncio.Lock] = defaultdict(asyncio.Lock)
        # Partitions whose work stopped on a failure, and why, until they are taken again.
        self._broken: dict[int, str] = {}
        # Their failures until read past, and which of them fire nothing till then.
        self._failing = FailingPartitions()
        self.limits = settings.limits
        self._failure: NodeFailed | None = None
        self._failed = asyncio.Event()
        self._suspension = SuspensionWatch(settings.session_timeout_ms)
        self.metrics = NodeMetrics()
        # The cluster's topics: commands to a missing one are refused, not sent (NO_TARGET).
        self.targets = TopicCatalog(
            self._admin.topic_names,
            self.clock.now,
            on_missing=lambda _: self.metrics.no_target.inc(),
        )
        self.commits = Commits(
            settings.commit_interval_ms, locks, self._owned.__contains__, self._partition_failed
        )
        self.cycles = PartitionCycles(
            types=self.types,
            by_topic=self._by_topic,
            partitions=settings.partitions,
            metrics=self.metrics,
            commits=self.commits,
            locks=locks,
            owns=self._owned.__contains__,
            backlog=self._backlog,
            now=self.clock.now,
            on_failure=self._partition_failed,
            on_done=self._read_past,
            limits=self.limits,
        )
        self.broker = BrokerWatch(
            settings.kafka, registry=self.metrics.registry, probe=self._admin.probe
        )
        self.reader = self.clients.reader()
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
        # A held partition says so whether or not it is being taken again: it is what an
        # operator needs to know (the message names the failure too).
        stalled.update(self._failing.stalled())
        if (suspended := self._suspension.suspended()) is not None:
            for p in self._owned | set(self._taking):
                stalled.setdefault(
                    p, f"the process was stopped for {suspended:.1f} s: waiting for the group"
                )
        if self._consumer is not None:
            # Given by the group but neither worked on nor being taken: nobody runs it.
            given = {p for _, p in self._consumer.assignment()}
            for p in sorted(given - self._owned - set(self._taking)):
                stalled.setdefault(p, "assigned by the group, not taken")
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
            "commit_lag_s": round(self.commits.lag(), 3),
            "ready": bool(broker["reachable"])
            and not restoring
            and not stalled
            and self._failure is None,
        }
        if failing := self._failing.report():
            body["failing"] = failing
            # Failing again and again at the same place, even between takes that look
            # fine: not ready, whatever else holds.
            if self._failing.again_and_again(_FAILING_IN_A_ROW):
                body["ready"] = False
        if suspended is not None:
            body["suspended_s"] = round(suspended, 3)
        if self._failure is not None:
            body["failed"] = str(self._failure)
        return body

    async def start(self) -> None:
        s = self.settings
        # Wrong credentials or an untrusted certificate: one error now, not the clients'
        # retries ending in "Unable to bootstrap".
        await self._admin.check_access()
        await self.broker.start()
        await self._admin.ensure_topics(node_topics(self.topics, s.partitions))
        await self._size_dead_letters()
        await self.targets.refresh()
        # Before any local store is opened: a copy of another cluster's topics is dropped.
        keep_for_cluster(
            Path(s.data_dir),
            await self._admin.cluster_id(),
            [t.type_name for t in self.topics],
        )
        await self.producer.start()
        await self.reader.start()
        for ctx in sorted({t.context for t in self.topics}):
            reader = ResultsReader(self.clients.follower, ctx)
            await reader.start()
            self._results[ctx] = reader
            if self.ledger is None:
                ledger = KafkaFailureLedger(self.clients, ctx, s.partitions, self.producer)
                await ledger.start()
                self._ledgers[ctx] = ledger
        for t in self.topics:
            self.types[t.type_name] = kept = self._open_type(t)
            self._by_topic[t.events] = (kept, "events")
            self._by_topic[t.timer_ops] = (kept, "timer-ops")
            if kept.agg is not None:
                self._by_topic[t.commands] = (kept, "commands")
        self._consumer = self.clients.group_member(
            s.group_id,
            list(self._by_topic),
            on_assigned=self._assigned,
            on_revoked=self._revoked,
            session_timeout_ms=s.session_timeout_ms,
        )
        await self._consumer.start()

    async def _size_dead_letters(self) -> None:
        """Dead letters as large as the dead-letter topics take (an older one may take
        less than Tickwheel creates them with: its letters of larger records are cut)."""
        limit = DEAD_LETTER_TOPIC_BYTES
        for ctx in sorted({t.context for t in self.topics}):
            topic = ContextTopics(ctx).dead_letters
            try:
                takes = await self._admin.max_message_bytes(topic)
            except KafkaUnavailable as exc:
                # Not allowed to describe its configs (an ACL): assume the broker's default.
                logger.warning("%s: %s; its letters are cut to 1 MiB", topic, exc)
                takes = BROKER_MAX_MESSAGE_BYTES
            if takes < limit:
                logger.warning(
                    "%s takes records of %d bytes at most (max.message.bytes), not %d: dead "
                    "letters of larger records are cut to fit; raise it to keep them whole",
                    topic,
                    takes,
                    DEAD_LETTER_TOPIC_BYTES,
                )
                limit = takes
        self.limits = replace(self.limits, dead_letter_bytes=limit)
        self.cycles.limits = self.limits

    def _open_type(self, t: AggregateTopics) -> KeptType:
        s = self.settings
        directory = Path(s.data_dir) / t.type_name
        (directory / "timers").mkdir(parents=True, exist_ok=True)
        changelog = TransactionalChangelog(
            self.clients.transactional_writer,
            t.timers_changelog,
            s.group_id,
            on_commit=self.metrics.commit_duration.labels(t.type_name).observe,
        )
        store = open_timer_store(
            f"rocksdb://{(directory / 'timers').resolve()}",
            partitions=s.partitions,
            changelog=changelog,
        )
        sender = KafkaSender(
            self.producer, self._results[t.context], t.context, self.clock.now, self.targets
        )
        ledger = self.ledger or self._ledgers[t.context]
        agg = self.aggregates.get(t.type_name)

        async def before_send(partitions: set[int]) -> None:
            await self.commits.commit_claims(self.types[t.type_name], partitions)

        runner = TimerRunner(
            store,
            sender,
            self.clock,
            ledger,
            self.options,
            local=(
                InProcess(self.cycles, lambda: self.types.get(t.type_name), s.partitions)
                if agg is not None
                else None
            ),
            before_send=before_send,
        )
        states = RocksAggregateStore(directory / "states") if agg is not None else None
        marks = CleanMarks(directory / "timers")
        loop = TimerLoop(runner, on_round=lambda stats: self.metrics.round(t.type_name, stats))
        return KeptType(t, agg, store, runner, loop, states, changelog, marks)

    async def stop(self) -> None:
        """Stops everything the node runs, each part whatever another's stop raised (a
        consumer stopped while the broker is away re-raises its fetcher's cancellation);
        the stores are closed last, always."""
        for kept in self.types.values():
            await _stopping(f"{kept.name} runner", kept.runner.stop_all())
            await _stopping(f"{kept.name} loop", kept.loop.stop())
        if self._consumer is not None:
            await _stopping("the group consumer", self._consumer.stop())
        # Whatever the consumer did not revoke on leaving the group is let go here.
        await _stopping(
            "the partitions", self._revoked({("", p) for p in self._owned | set(self._taking)})
        )
        for reader in self._results.values():
            await _stopping("a results reader", reader.stop())
        for ledger in self._ledgers.values():
            await _stopping("a ledger", ledger.stop())
        await _stopping("the producer", self.producer.stop())
        await _stopping("the reader", self.reader.stop())
        await _stopping("the broker watch", self.broker.stop())
        await _stopping("the topic catalog", self.targets.stop())
        for kept in self.types.values():
            await _stopping(f"{kept.name} store", kept.store.close())
            if kept.states is not None:
                kept.states.close()

    async def run(self) -> None:
        """Reads the owned partitions' logs and commands until cancelled; `NodeFailed`
        when a partition it was given cannot be worked on (the node stops loudly)."""
        assert self._consumer is not None, "start() first"
        for kept in self.types.values():
            kept.loop.start()
        committer = asyncio.create_task(
            self.commits.run(self.types.values), name="changelog commits"
        )
        reader = asyncio.create_task(self._read(), name="reader")
        failed = asyncio.create_task(self._failed.wait(), name="failure")
        watch = asyncio.create_task(self._suspension.run(), name="suspension watch")
        tasks: list[asyncio.Task[Any]] = [committer, reader, failed, watch]
        # The readers the sends and the ledgers depend on: one that ends stops the node.
        following = {f"the results reader of {c}": r.task for c, r in self._results.items()}
        following |= {f"the ledger of {c}": ledger.task for c, ledger in self._ledgers.items()}
        tasks += [
            asyncio.create_task(self._supervise(what, task), name=f"supervising {what}")
            for what, task in following.items()
            if task is not None
        ]
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
            await self.cycles.stop_all()

    async def _supervise(self, what: str, task: asyncio.Task[None]) -> None:
        """Stops the node loudly when `task` ends (they retry what passes by itself)."""
        await asyncio.wait([task])
        if task.cancelled():
            return  # stopped: the node is stopping
        self._fail(f"{what} stopped: {task.exception()!r}")

    async def _backlog(self, topic: str, p: int) -> int:
        assert self._consumer is not None
        return await self._consumer.backlog(topic, p)

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
                        await self.cycles.queue(p).put((topic, records))
                await self._consumer.commit(self.commits.take_offsets())
            except KafkaUnavailable as exc:
                if refused(exc):
                    # An ACL missing (the group's Read, a topic's): no retry will pass it.
                    self._fail(f"the group consumer was refused: {exc}")
                    return
                # The broker or the group is in flux: the node keeps going and reads again.
                logger.warning("reading paused: %s", exc)
                await asyncio.sleep(1)

    def _partition_failed(self, p: int, what: str, exc: BaseException) -> None:
        """Ends p's work on a failure of its transaction or store: what it wrote since its
        last commit may never count. It is let go and taken afresh (restored from the
        changelog and the log, read again from the committed offsets); when fenced, a
        newer owner has it, and it is taken again only if the group still gives it here."""
        if p not in self._owned:
            return
        fenced = is_fenced(exc)
        self.metrics.let_go.labels("fenced" if fenced else "failed").inc()
        why = f"{what} failed: {exc}"
        logger.warning("partition %d: %s; %s", p, why, "let go" if fenced else "taken afresh")
        self._owned.discard(p)
        failing = self._failing.failed(p, self.cycles.failed_at.pop(p, {}), f"{what}: {exc}")
        self._broken[p] = failing.describe()
        assert self._consumer is not None
        self._consumer.pause([(t, q) for t, q in self._consumer.assignment() if q == p])
        topics = {t for t, q in self._consumer.assignment() if q == p}
        delay = 2 * self.settings.session_timeout_ms / 1000 if fenced else 0.0
        self._taking[p] = asyncio.create_task(
            self._take_in_background(p, topics, after_failure=delay), name=f"retake {p}"
        )

    async def _assigned(self, assigned: set[tuple[str, int]]) -> None:
        """Starts restoring the new partitions in the background, paused until they are.

        Restoring inside the rebalance callback would hold the group up (and a long restore
        would cost the node its membership): the consumer is paused on them instead.
        """
        assert self._consumer is not None
        self._suspension.group_answered()
        # Retakes waiting after a failure go on now: the group has answered.
        self._answered.set()
        self._answered = asyncio.Event()
        given = {p for _, p in assigned}
        if stale := (self._owned | set(self._taking)) - given:
            # The group is the authority: what it no longer gives here is let go (a revoke
            # after a lost membership may have named none of it).
            await self._revoked({("", p) for p in stale})
        async with self._lock:
            new = sorted(given - self._owned - set(self._taking))
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
        local copy is trusted), and taken again once the group answers (its next
        assignment) or after that many seconds, if the group gives it to this node then. A
        partition that cannot be taken stops the node.
        """
        assert self._consumer is not None
        try:
            await self._taking_partition(p, topics, after_failure)
        except Exception as exc:
            # A bug, whatever it is: never a partition left half taken, quietly.
            logger.exception("taking partition %d failed", p)
            self._fail(f"taking partition {p} failed: {exc!r}")
        finally:
            if self._taking.get(p) is asyncio.current_task():
                del self._taking[p]

    async def _taking_partition(
        self, p: int, topics: set[str], after_failure: float | None
    ) -> None:
        assert self._consumer is not None
        if after_failure is not None:
            answered = self._answered
            await self.cycles.stop(p)
            async with self._lock:
                await self._let_go(p, clean=False)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(after_failure):
                    await answered.wait()
            # As the group gives it now (a lost membership empties the assignment the
            # failure saw; the next one may give p back).
            topics = {t for t, q in self._consumer.assignment() if q == p}
            if not topics:
                self._broken.pop(p, None)
                self._failing.forget(p)
                return  # the group moved it meanwhile
            self._consumer.pause([(t, p) for t in topics])
        last: BaseException | None = None
        for attempt in range(1, _TAKE_ATTEMPTS + 1):
            try:
                await self._take(p, topics)
                await self._consumer.rewind([(t, p) for t in topics])
                break
            except Exception as exc:
                last = exc
                if refused(exc):
                    break  # an ACL or the credentials: no retry passes it
                # A node fault is expected to pass; anything else is a bug to see, but
                # either way p is tried again, and the node stops loudly if it never
                # can be taken: never a take that dies quietly, half done.
                log = logger.warning if node_fault(exc) else logger.exception
                log("taking partition %d failed (%d/%d): %s", p, attempt, _TAKE_ATTEMPTS, exc)
                await self._let_go(p, clean=False)
                await asyncio.sleep(min(0.2 * 2**attempt, 5))
        else:
            self._fail(f"partition {p} could not be taken in {_TAKE_ATTEMPTS} attempts: {last}")
            return
        if last is not None and refused(last):
            self._fail(f"partition {p} could not be taken: {last}")
            return
        async with self._lock:
            self._owned.add(p)
            self._takes[p] += 1
            self._broken.pop(p, None)
            self._consumer.resume([(t, p) for t in topics])
            if not self._failing.held(p):
                self._start_firing(p)
            if not self._taking.keys() - {p}:
                self._owning()
                self.ready.set()

    def _start_firing(self, p: int) -> None:
        for kept in self.types.values():
            kept.runner.start_partition(p)
            kept.loop.wake()

    def _read_past(self, p: int, done: dict[str, int]) -> None:
        """A cycle of p staged: a partition held since a failure fires again once its log
        was read past where the failure was."""
        if self._failing.read(p, done) and p in self._owned:
            logger.info("partition %d: its log read past its failure, firing again", p)
            self._start_firing(p)

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
                    limits=self.limits,
                    request_id_window=self.settings.request_id_window_ms,
                    targets=self.targets,
                )
                kept.processors[p] = processor
                progress = self.metrics.restore_progress(t.type_name, p, "states")
                with self.metrics.restore_duration.labels(t.type_name, "states").time():
                    await processor.restore(self.reader, progress)
            clean = kept.marks.take(p)
            await kept.store.assign({p})
            progress = self.metrics.restore_progress(t.type_name, p, "timers")
            unreadable: list[tuple[Record, str]] = []
            with self.metrics.restore_duration.labels(t.type_name, "timers").time():
                await restore_partition(
                    kept.store,
                    self.reader,
                    t.timers_changelog,
                    p,
                    clean=clean,
                    progress=progress,
                    unreadable=unreadable,
                )
                # Counted whole once, here, where a restore is waited for anyway: from now
                # on each write keeps the count (the /metrics gauges scan nothing).
                kept.store.status_counts(p)
            if unreadable:
                # Their letters and tombstones commit in p's next transaction.
                letters = unreadable_letters(
                    unreadable, self.clock.now(), self.limits.dead_letter_bytes
                )
                kept.changelog.stage(p, letters, {})
                self.metrics.dead_letters.labels(t.timers_changelog).inc(len(unreadable))
        for results in self._results.values():
            await results.add_partition(p)

    async def _revoked(self, revoked: set[tuple[str, int]]) -> None:
        gone = {p for _, p in revoked}
        taking = [task for p, task in self._taking.items() if p in gone]
        for task in taking:
            task.cancel()
        await asyncio.gather(*taking, return_exceptions=True)
        for p in gone:
            await self.cycles.stop(p)
            self._broken.pop(p, None)
            self._failing.forget(p)
        async with self._lock:
            for p in sorted(gone & (self._owned | self._half_taken())):
                if p in self._owned:
                    self.metrics.let_go.labels("revoked").inc()
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
        self.cycles.drop_local(p)
        # A cycle cut short wrote half of its work: nothing of p's transaction may commit.
        clean = not self.cycles.cut_short(p) and clean
        for kept in self.types.values():
            await self.commits.drop(kept, p, clean=clean)
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


async def _stopping(what: str, stop: Awaitable[None]) -> None:
    """Awaits one part's stop; what it raises is logged, not passed on (the next part is
    stopped all the same). A cancellation of the stopping task itself still ends it."""
    try:
        await stop
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
        logger.warning("stopping %s: cancelled inside the client library", what)
    except Exception as exc:
        logger.warning("stopping %s failed: %r", what, exc)
