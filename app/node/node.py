"""A node: one worker process, a member of the service's consumer group, and the manager
of its partition tasks.

Its assignment of the aggregate types' partitions is its ownership: for each type's
partition it is given a task (`partition_task`, one per type and partition) takes the
partition (fencing its previous owner, restoring) and runs it, and on revocation that task
is closed (`partition_tasks`). What a task does not own the node runs for all of them:
the consumer, which reads three topics per type: the log (into the timer table: the
timers subscription), the commands (the command path, `processor`) and the operators'
retry/skip requests on its parked timers (`operator`); each context's failure ledger,
read whole by every node (`ledger`); `/healthz`, read from the tasks' states; and the
policy of its compacted topics, read again every minute (`topic_watch`); and its TLS
files, loaded again when renewed (`app.kafka.tls_reload`)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.commands.sent_sizes import sent_too_large
from app.errors import NodeFailed
from app.kafka.broker_watch import BrokerWatch
from app.kafka.catalog import TopicCatalog, topic_limits
from app.kafka.clients import KafkaClients
from app.kafka.ports import Clients, GroupMember
from app.kafka.tls_reload import tls_reload
from app.node.commits import Commits
from app.node.cycles import PartitionCycles
from app.node.health import node_health, oldest
from app.node.kept import KeptType, node_topics
from app.node.local_state import DataDirLock
from app.node.metrics import NodeMetrics
from app.node.node_run import run_parts
from app.node.node_start import check_cluster, follow_contexts
from app.node.node_stop import stop_parts
from app.node.opening import open_type
from app.node.partition_count import keep_partition_count
from app.node.partition_task import TaskShared
from app.node.partition_tasks import PartitionTasks
from app.node.settings import Settings
from app.node.suspension import SuspensionWatch
from app.node.task_id import TaskId
from app.node.topic_watch import PartitionCounts, ReplicationRead, TopicPolicyWatch
from app.node.user_code_watch import UserCodeWatch, watch_user_code
from app.protocol.topics import parse_aggregate_type
from app.service import Service
from app.timers.ledger import KafkaFailureLedger
from app.timers.runner import Clock, SystemClock, TimerOptions
from app.timers.sender import ResultsReader
from tables.ledger import FailureLedger

__all__ = ["Node", "node_topics"]

logger = logging.getLogger(__name__)


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
        self._data_lock = DataDirLock(Path(settings.data_dir))
        self.clock: Clock = clock or SystemClock()
        self.options = options or settings.timers
        # One ledger per context, on its topic (started in `start`), unless one is given.
        self.ledger: FailureLedger | None = ledger
        self._ledgers: dict[str, KafkaFailureLedger] = {}
        # The declared aggregates and each context's schedule (its jobs), by type name.
        self.aggregates = {
            a.type_name: a
            for a in service.all_aggregates(
                settings.partitions,
                request_id_window_ms=settings.request_id_window_ms,
                expires_after_ms=self.options.expires_after,
                # A job's command its partition's processor would refuse fails its slot
                # alone, not the whole tick (which would stop the schedule). The limits as
                # they are when it runs: what the node's own topics take is read at start.
                sent_check=lambda commands: sent_too_large(commands, self.limits, self.targets),
            )
        }
        names = list(self.aggregates)
        names += [n for n in settings.aggregate_types if n not in names]
        self.topics = [parse_aggregate_type(n) for n in names]
        # Kafka's clients at the settings' address, unless others are given (a MemoryLog).
        self.clients: Clients = clients or KafkaClients(
            settings.kafka,
            replication=settings.replication,
            client=settings.kafka_client,
            producer_thread=settings.producer_thread,
        )
        self._admin = self.clients.admin()
        self.producer = self.clients.publisher()
        self.types: dict[str, KeptType] = {}
        self._by_topic: dict[str, tuple[KeptType, str]] = {}
        # Each topic read: its type's name (the poll loop's routing to a type's task).
        self._type_of: dict[str, str] = {}
        self._results: dict[str, ResultsReader] = {}
        # What the sends and the parks depend on, by name: each context's results reader
        # and ledger follower, said in `/healthz` while failing, supervised by `run`.
        self._following: dict[str, ResultsReader | KafkaFailureLedger] = {}
        self._consumer: GroupMember | None = None
        self.metrics = NodeMetrics()
        # The TLS files read again while it runs: renewed ones loaded into the clients' context.
        self.tls = tls_reload(settings.kafka, on_loaded=self.metrics.client_cert_loaded)
        self.ready = asyncio.Event()
        # Its partitions' tasks, created and closed as the group gives and takes them.
        self.tasks = PartitionTasks(
            owned=self.metrics.owned.set, all_running=self.ready.set, fail=self.fail
        )
        # Its maps by the node's names: each type's partition's task, and the task running it.
        self._tasks, self._owned = self.tasks.tasks, self.tasks.running
        self.limits = settings.limits
        self._failure: NodeFailed | None = None
        # Its stop began: it takes nothing the group gives from then on.
        self._stopping = False
        # Whether the group gave it its partitions since it joined or a rebalance began.
        self._answered = False
        self._failed = asyncio.Event()
        self._suspension = SuspensionWatch(settings.session_timeout_ms)
        # The cluster's topics: commands to a missing one are refused, not sent (NO_TARGET).
        self.targets = TopicCatalog(
            self._admin.topic_names,
            self.clock.now,
            on_missing=lambda _: self.metrics.no_target.inc(),
            read_limits=topic_limits(self._admin),
        )
        self.commits = Commits(settings.commit_interval_ms, self._owned)
        self.cycles = PartitionCycles(
            types=self.types,
            by_topic=self._by_topic,
            partitions=settings.partitions,
            metrics=self.metrics,
            commits=self.commits,
            running=self._owned,
            backlog=self._backlog,
            now=self.clock.now,
            limits=self.limits,
        )
        self.broker = BrokerWatch(
            settings.kafka, registry=self.metrics.registry, probe=self._admin.probe
        )
        self.reader = self.clients.reader()
        self._watch: UserCodeWatch | None = None
        # The start refuses a table whose policy deletes rows: read again while it runs.
        specs = node_topics(self.topics, settings.partitions)
        self.topic_watch = TopicPolicyWatch(
            self._admin.topic_configs,
            tables=[s.name for s in specs if s.compacted],
            logs=[s.name for s in specs if s.retained],
            refused=self.fail,
            replication=ReplicationRead.of(self._admin, specs, settings.replication, self.metrics),
            counts=PartitionCounts(
                self._admin.existing_topics,
                {s.name: s.partitions for s in specs},
                self._admin.topic_names,
            ),
        )

    @property
    def restoring(self) -> frozenset[int]:
        """The partitions assigned to this node that it is still restoring."""
        return self.tasks.restoring

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
        """The partitions this node owns now: those of which a task (of any type) runs."""
        return self.tasks.owned

    def owns(self, type_name: str, p: int) -> bool:
        """Whether the task of `type_name`'s partition p runs here (its store serves p)."""
        return TaskId(type_name, p) in self._owned

    def owned_of(self, type_name: str) -> frozenset[int]:
        """The partitions of `type_name` whose task runs here."""
        return self.tasks.owned_of(type_name)

    def health(self) -> dict[str, Any]:
        """What `/healthz` says (`node_health`): ready only while every partition given to
        this node runs, and the followers its sends depend on read."""
        return node_health(
            self._tasks,
            closing=self.tasks.closes(),
            given=None if (c := self._consumer) is None else self.tasks.keys(c.assignment()),
            suspended=self._suspension.suspended(),
            broker=self.broker.status(),
            # A close's commits count: a hung one holds its partition's next take back.
            commit_lags=oldest(self.commits.lags(), self.tasks.closing_commit_lags()),
            failure=None if self._failure is None else str(self._failure),
            following={w: f for w, r in self._following.items() if (f := r.failing)},
            answered=self._answered,
            topics=self.topic_watch.findings,
        )

    async def start(self) -> None:
        s = self.settings
        self._data_lock.acquire()  # before anything of the directory is read or dropped
        # Wrong credentials or an untrusted certificate: one error now, not the clients'
        # retries ending in "Unable to bootstrap".
        await self._admin.check_access()
        await self.broker.start()
        checked = await check_cluster(self._admin, self.topics, s)
        self.topic_watch.found_at_start(checked.topic_faults)
        self.topic_watch.kept_read(checked.tombstones)
        # One dict for every holder of the limits: the catalog keeps it current.
        record_bytes = dict(checked.record_bytes)
        letters = dict(checked.letters)
        self.limits = replace(
            self.limits,
            dead_letter_bytes=checked.dead_letter_bytes,
            dead_letter_topic_bytes=letters,
            topic_record_bytes=record_bytes,
        )
        self.targets.keep_current(record_bytes, checked.written, letters)
        self.cycles.limits = self.limits
        await self.targets.refresh()
        await self.producer.start()
        await self.reader.start()
        # Before any table is opened: tables built with another partition count refused.
        await keep_partition_count(
            self.reader, self.producer, self.topics, s.partitions, self.clock.now()
        )
        await follow_contexts(
            self.clients,
            sorted({t.context for t in self.topics}),
            settings=s,
            producer=self.producer,
            metrics=self.metrics,
            results=self._results,
            ledgers=self._ledgers if self.ledger is None else None,
            following=self._following,
        )
        for t in self.topics:
            self.types[t.type_name] = kept = open_type(
                t,
                self.aggregates.get(t.type_name),
                self,
                results=self._results[t.context],
                ledger=self.ledger or self._ledgers[t.context],
            )
            self._by_topic[t.events] = (kept, "events")
            self._by_topic[t.timer_ops] = (kept, "timer-ops")
            if kept.agg is not None:
                self._by_topic[t.commands] = (kept, "commands")
        self._type_of.update({topic: kept.name for topic, (kept, _) in self._by_topic.items()})
        self._consumer = self.clients.group_member(
            s.group_id,
            list(self._by_topic),
            on_assigned=self._assigned,
            on_revoked=self._revoked,
            session_timeout_ms=s.session_timeout_ms,
            group_instance_id=s.group_instance_id,
            on_deleted=lambda topic, _, n: self.metrics.deleted_unread.labels(topic).inc(n),
        )
        self.tasks.shared = TaskShared(
            settings=s,
            limits=self.limits,
            types=self.types,
            by_topic=self._by_topic,
            consumer=self._consumer,
            reader=self.reader,
            results=self._results,
            cycles=self.cycles,
            metrics=self.metrics,
            now=self.clock.now,
            targets=self.targets,
            running=self._owned,
            close_deadline_s=s.close_deadline_s,
            check_access=self._admin.check_access,
            tombstones_kept=self.topic_watch.tombstones_kept.get,
        )
        await self._consumer.start()
        # From here partitions may be given, and their user code runs: it is timed.
        if s.handler_timeout_ms:  # 0: untimed
            self._watch = watch_user_code(s.handler_timeout_ms / 1000)

    async def stop(self) -> None:
        """Stops everything the node runs (`stop_parts`: its partitions closed while it is
        still the group's member, before it leaves; the stores last, always). `NodeFailed`
        when a part of the stop failed the node (a partition's close that failed): the
        worker exits as failed."""
        self._stopping = True
        before = self._failure
        self._unwatch()  # first, whatever a part's stop raises
        shared = self.tasks.shared  # the closes' deadline (None: never started)
        deadline = self.settings.close_deadline_s if shared is None else shared.close_deadline_s
        await stop_parts(
            self.tasks,
            self.types,
            deadline_s=deadline,
            consumer=self._consumer,
            followers=self._following,
            clients={
                "the producer": self.producer,
                "the reader": self.reader,
                "the broker watch": self.broker,
                "the topic catalog": self.targets,
            },
            data_lock=self._data_lock,
        )
        if self._failure is not None and self._failure is not before:
            raise self._failure

    async def run(self) -> None:
        """Reads the owned partitions' logs and commands until cancelled; `NodeFailed`
        when a partition it was given cannot be worked on (the node stops loudly)."""
        assert self._consumer is not None, "start() first"
        await run_parts(
            self,
            self._consumer,
            type_of=self._type_of,
            failure_set=self._failed,
            failure=lambda: self._failure,
            suspension=self._suspension,
            followers=self._following,
            ledgers=self._ledgers,
            unwatch=self._unwatch,
        )

    def _unwatch(self) -> None:
        if self._watch is not None:
            self._watch.stop()
            self._watch = None

    async def _backlog(self, topic: str, p: int) -> int:
        assert self._consumer is not None
        return await self._consumer.backlog(topic, p)

    async def _assigned(self, assigned: set[tuple[str, int]]) -> None:
        """The group answered: tasks for the partitions it gives (`PartitionTasks.assign`);
        none while the node stops (it is leaving the group)."""
        self._suspension.group_answered()
        self._answered = True
        if self._stopping:
            logger.info("given %d partition(s) while stopping: not taken", len(assigned))
            return
        try:
            self.tasks.assign(assigned)
        except Exception as exc:  # aiokafka logs a callback's error and goes on: untaken
            self.fail(f"taking the partitions the group gave raised {exc!r}")

    async def _revoked(self, revoked: set[tuple[str, int]]) -> None:
        """The group takes partitions away: their tasks closed (`PartitionTasks.revoke`)."""
        self._suspension.group_rebalancing()
        self._answered = False  # a rebalance began (aiokafka revokes all first)
        try:
            await self.tasks.revoke(self.tasks.keys(revoked))
        except Exception as exc:  # as above: closed or not, the node cannot go on sure
            self.fail(f"letting go of the partitions the group took raised {exc!r}")

    def fail(self, why: str) -> None:
        """Stops the node: it cannot do the work it was given."""
        logger.critical("node failed: %s", why)
        self._failure = NodeFailed(why)
        self._failed.set()
