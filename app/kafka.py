"""The Kafka edge: the only module that imports aiokafka.

Everything above it talks in topics, partitions, keys and bytes; aiokafka's errors are
translated into `KafkaUnavailable` here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic, RecordsToDelete
from aiokafka.client import AIOKafkaClient
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.errors import (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    IllegalStateError,
    KafkaError,
    NotCoordinatorError,
    ProducerFenced,
    TopicAlreadyExistsError,
)
from aiokafka.protocol.metadata import MetadataRequest

from app.exceptions import TickwheelError

__all__ = [
    "Fenced",
    "GroupConsumer",
    "GroupOffsets",
    "KafkaUnavailable",
    "MissingTopic",
    "OutRecord",
    "PartitionReader",
    "Producer",
    "Reader",
    "Record",
    "TopicSpec",
    "TransactionalProducer",
    "cluster_id",
    "delete_records",
    "ensure_topics",
    "existing_topics",
    "group_members",
    "log_offsets",
    "read_partitions",
    "read_to_end",
    "require_topic",
    "require_topics",
    "reset_group_offsets",
    "tail",
    "topic_names",
]

logger = logging.getLogger(__name__)


class KafkaUnavailable(TickwheelError):
    """The broker did not answer, or refused a request; the message says which."""


async def _start(client: Any, what: str) -> None:
    """Starts an aiokafka client, its failure said in our terms."""
    try:
        await client.start()
    except KafkaError as exc:
        raise KafkaUnavailable(f"{what} cannot connect: {exc!r}") from exc


class Fenced(KafkaUnavailable):
    """Another node took this partition's transactional id over: this one must let go."""


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    partitions: int
    compacted: bool = False


@dataclass(frozen=True, slots=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int


# Compacted, and never deleted by age or size; "delete" is in the policy only so that a
# rebuild may empty the topic with DeleteRecords (refused on a compact-only topic).
_COMPACTED = {"cleanup.policy": "compact,delete", "retention.ms": "-1", "retention.bytes": "-1"}


async def ensure_topics(bootstrap: str, specs: Iterable[TopicSpec]) -> None:
    """Creates the topics that do not exist; checks that existing ones have the partitions."""
    specs = list(specs)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    try:
        await admin.start()
        new = [
            NewTopic(
                s.name,
                num_partitions=s.partitions,
                replication_factor=1,
                topic_configs=_COMPACTED if s.compacted else {},
            )
            for s in specs
        ]
        with contextlib.suppress(TopicAlreadyExistsError):
            await admin.create_topics(new)
        described = await admin.describe_topics([s.name for s in specs])
        have = {t["topic"]: len(t["partitions"]) for t in described if not t.get("error_code")}
        for s in specs:
            if s.name not in have:
                # Created one by one when a batch failed part-way.
                with contextlib.suppress(TopicAlreadyExistsError):
                    await admin.create_topics([n for n in new if n.name == s.name])
            elif have[s.name] != s.partitions:
                raise KafkaUnavailable(
                    f"topic {s.name} has {have[s.name]} partitions, expected {s.partitions}: "
                    "co-partitioned topics must all have the same count"
                )
    except KafkaError as exc:
        raise KafkaUnavailable(f"cannot create topics at {bootstrap}: {exc!r}") from exc
    finally:
        await admin.close()


OutRecord = tuple[str, int | None, bytes | None, bytes | None]
"""(topic, partition or None for the key's default partition, key, value)."""


class Producer:
    """An idempotent producer (acks=all); `send_many` returns once the broker has all."""

    def __init__(self, bootstrap: str, *, linger_ms: int = 2) -> None:
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            enable_idempotence=True,
            acks="all",
            linger_ms=linger_ms,
            max_request_size=1_048_576,
        )

    async def start(self) -> None:
        await _start(self._producer, "producer")

    async def stop(self) -> None:
        await self._producer.stop()

    async def send_many(self, records: Sequence[OutRecord]) -> list[int]:
        """Sends (topic, partition, key, value) records; their offsets once acknowledged."""
        try:
            futures = [
                await self._producer.send(topic, value=value, key=key, partition=partition)
                for topic, partition, key, value in records
            ]
            return [(await f).offset for f in futures]
        except KafkaError as exc:
            raise KafkaUnavailable(f"send failed: {exc!r}") from exc

    async def send(
        self, topic: str, key: bytes | None, value: bytes | None, partition: int | None = None
    ) -> int:
        return (await self.send_many([(topic, partition, key, value)]))[0]


_NO_COORDINATOR_YET = (
    CoordinatorNotAvailableError,
    CoordinatorLoadInProgressError,
    NotCoordinatorError,
)
"""A group's coordinator not ready: on a new cluster the broker is still creating its
offsets topic, or the coordinator moved. Asked again, it answers."""

T = TypeVar("T")


async def _coordinated(call: Callable[[], Awaitable[T]], within: float = 15.0) -> T:
    """`call`, asked again while the group's coordinator is not ready, for up to `within` s."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await call()
        except _NO_COORDINATOR_YET:
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.2)


async def cluster_id(bootstrap: str) -> str:
    """The id of the Kafka cluster at `bootstrap` (what its metadata says)."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    try:
        await client.bootstrap()
        response = await client.send(
            client.get_random_node(), MetadataRequest(topics=[], allow_auto_topic_creation=False)
        )
    except KafkaError as exc:
        raise KafkaUnavailable(f"cannot read the cluster id: {exc!r}") from exc
    finally:
        await client.close()
    found = getattr(response, "cluster_id", None)
    if not isinstance(found, str) or not found:
        raise KafkaUnavailable("the broker told no cluster id")
    return found


async def group_members(bootstrap: str, group_id: str) -> int:
    """How many members the consumer group has now."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    try:
        await admin.start()
        responses = await _coordinated(lambda: admin.describe_consumer_groups([group_id]))
        groups = [g for r in responses for g in r.groups]
        # (error_code, group_id, state, protocol_type, protocol, members, …)
        return sum(len(g[5]) for g in groups)
    except KafkaError as exc:
        raise KafkaUnavailable(f"cannot describe group {group_id}: {exc!r}") from exc
    finally:
        await admin.close()


class MissingTopic(TickwheelError):
    """A topic a read-only command (or a rebuild) needs is not there; nothing was created."""


async def existing_topics(bootstrap: str, names: Iterable[str]) -> dict[str, int]:
    """The partition counts of those of `names` the broker has; never creates a topic.

    The broker is first asked for all of its topics: a metadata request that names a
    topic creates it on a broker with `auto.create.topics.enable`. Only the topics found
    are then described.
    """
    wanted = list(names)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    try:
        await admin.start()
        have = set(await admin.list_topics())
        present = [n for n in wanted if n in have]
        if not present:
            return {}
        described = await admin.describe_topics(present)
        return {t["topic"]: len(t["partitions"]) for t in described if not t.get("error_code")}
    except KafkaError as exc:
        raise KafkaUnavailable(f"cannot read the topics at {bootstrap}: {exc!r}") from exc
    finally:
        await admin.close()


async def topic_names(bootstrap: str) -> set[str]:
    """The names of all the broker's topics (one metadata request that names none)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    try:
        await admin.start()
        return set(await admin.list_topics())
    except KafkaError as exc:
        raise KafkaUnavailable(f"cannot read the topics at {bootstrap}: {exc!r}") from exc
    finally:
        await admin.close()


async def require_topics(bootstrap: str, topics: dict[str, str]) -> dict[str, int]:
    """The partition count of each topic of `topics` (topic -> why it may be missing);
    `MissingTopic` naming every one the broker does not have. Creates nothing."""
    found = await existing_topics(bootstrap, topics)
    missing = [t for t in topics if t not in found]
    if missing:
        said = "; ".join(f"topic {t} does not exist at {bootstrap}: {topics[t]}" for t in missing)
        raise MissingTopic(
            f"{said} (nothing was created; is KAFKA_BOOTSTRAP_SERVERS or --bootstrap the "
            "cluster's?)"
        )
    return found


async def require_topic(bootstrap: str, topic: str, why: str) -> int:
    """The partition count of `topic`; `MissingTopic` (saying `why` it may be missing) when
    the broker does not have it. Creates nothing."""
    return (await require_topics(bootstrap, {topic: why}))[topic]


async def log_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
    """Per partition of an existing `topic`: (first offset held, high watermark).

    The high watermark counts records of transactions still open: it is what a
    DeleteRecords up to "now" deletes before.
    """
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    try:
        await consumer.start()
        begins = await consumer.beginning_offsets(tps)
        ends = await consumer.end_offsets(tps)
        return {tp.partition: (int(begins[tp]), int(ends[tp])) for tp in tps}
    except KafkaError as exc:
        raise KafkaUnavailable(f"cannot read the offsets of {topic}: {exc!r}") from exc
    finally:
        await consumer.stop()


async def delete_records(bootstrap: str, topic: str, before: dict[int, int]) -> dict[int, int]:
    """Deletes the records of `topic` before `before[p]` in each partition p given; the
    new start offset per partition."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    try:
        await admin.start()
        done = await admin.delete_records(
            {TopicPartition(topic, p): RecordsToDelete(o) for p, o in before.items()}
        )
        return {tp.partition: int(o) for tp, o in done.items()}
    except KafkaError as exc:
        hint = (
            " (the topic must allow deletes: cleanup.policy=compact,delete, as created here)"
            if "PolicyViolation" in repr(exc)
            else ""
        )
        raise KafkaUnavailable(f"cannot delete the records of {topic}: {exc!r}{hint}") from exc
    finally:
        await admin.close()


class GroupOffsets:
    """Reads a consumer group's committed offsets, as often as asked, on one connection.

    Only committed offsets count: those a transaction sent are seen once it commits.
    Reading them joins nothing, so the group's members are not disturbed.
    """

    def __init__(self, bootstrap: str, group_id: str) -> None:
        self.group_id = group_id
        self._admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)

    async def start(self) -> None:
        await _start(self._admin, "admin client")

    async def stop(self) -> None:
        await self._admin.close()

    async def __aenter__(self) -> GroupOffsets:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def fetch(
        self, partitions: Iterable[tuple[str, int]]
    ) -> dict[tuple[str, int], int | None]:
        """The committed offset of each (topic, partition); None where the group has none."""
        tps = [TopicPartition(t, p) for t, p in partitions]
        try:
            got = await _coordinated(
                lambda: self._admin.list_consumer_group_offsets(self.group_id, partitions=tps)
            )
        except KafkaError as exc:
            raise KafkaUnavailable(f"cannot read {self.group_id}'s offsets: {exc!r}") from exc
        out: dict[tuple[str, int], int | None] = {}
        for tp in tps:
            meta = got.get(tp)
            out[(tp.topic, tp.partition)] = (
                None if meta is None or meta.offset < 0 else int(meta.offset)
            )
        return out


async def reset_group_offsets(
    bootstrap: str, group_id: str, topic: str, partitions: int, offset: int = 0
) -> None:
    """Sets the group's committed offset of every partition of `topic` (group must be idle)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group_id, enable_auto_commit=False
    )
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    try:
        await consumer.start()
        consumer.assign(tps)
        await consumer.commit({tp: offset for tp in tps})
    except KafkaError as exc:
        raise KafkaUnavailable(f"cannot reset {group_id}'s offsets of {topic}: {exc!r}") from exc
    finally:
        await consumer.stop()


class TransactionalProducer:
    """A producer whose records and consumer offsets commit together, or not at all.

    One per owned partition (transactional id `<group>.<ctx>.<agg>.timers.<partition>`):
    starting it fences a previous owner's producer, so a zombie can never commit beside
    the new owner. Any failure breaks it for good (`broken`): every later call raises at
    once, so a caller can never go on with a producer in an unknown state; it is closed
    and the partition taken afresh.
    """

    def __init__(self, bootstrap: str, transactional_id: str) -> None:
        self.transactional_id = transactional_id
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            transactional_id=transactional_id,
            enable_idempotence=True,
            acks="all",
            linger_ms=1,
            transaction_timeout_ms=60_000,
            # A commit's retries (CONCURRENT_TRANSACTIONS just after the previous commit,
            # NOT_ENOUGH_REPLICAS) wait this long: 100 ms by default, the tail of a commit.
            retry_backoff_ms=10,
        )
        self._lock = asyncio.Lock()
        self._open = False
        self.broken: KafkaUnavailable | None = None

    async def start(self) -> None:
        await _start(self._producer, self.transactional_id)

    async def stop(self) -> None:
        """Closes the client; never raises (a broken producer may fail to say goodbye)."""
        try:
            await self._producer.stop()
        except Exception as exc:
            logger.warning("%s: stop failed: %r", self.transactional_id, exc)

    async def commit(
        self,
        records: Sequence[OutRecord],
        offsets: dict[tuple[str, int], int],
        group_id: str,
    ) -> list[int]:
        """Sends `records` and commits `offsets` for `group_id` in one transaction.

        Returns the records' offsets. `Fenced` when a newer owner took over; any other
        failure aborts the transaction and raises `KafkaUnavailable`.
        """
        async with self._lock:
            futures = await self._append(records)
            await self._commit(offsets, group_id)
        try:
            return [(await f).offset for f in futures]
        except KafkaError as exc:  # committed, so acknowledged: this would be a client bug
            raise KafkaUnavailable(f"{self.transactional_id}: no offsets: {exc!r}") from exc

    async def flush(
        self, offsets: dict[tuple[str, int], int] | None = None, group_id: str = ""
    ) -> bool:
        """Commits the open transaction (with `offsets`, if any); whether there was one."""
        async with self._lock:
            if not self._open and not offsets:
                return False
            await self._commit(offsets or {}, group_id)
            return True

    @property
    def pending(self) -> bool:
        """Whether records wait in an open transaction."""
        return self._open

    async def _append(self, records: Sequence[OutRecord]) -> list[asyncio.Future[Any]]:
        self._check()
        p = self._producer
        try:
            if not self._open:
                await p.begin_transaction()
                self._open = True
            futures = [
                await p.send(topic, value=value, key=key, partition=partition)
                for topic, partition, key, value in records
            ]
            for f in futures:
                # A failed send fails the commit too, which is where it is reported.
                f.add_done_callback(_retrieve)
            return futures
        except BaseException as exc:
            raise await self._fail(exc) from exc

    async def _commit(self, offsets: dict[tuple[str, int], int], group_id: str) -> None:
        self._check()
        p = self._producer
        try:
            if not self._open:
                await p.begin_transaction()
                self._open = True
            if offsets:
                await p.send_offsets_to_transaction(
                    {TopicPartition(t, part): o for (t, part), o in offsets.items()}, group_id
                )
            await p.commit_transaction()
            self._open = False
        except BaseException as exc:
            raise await self._fail(exc) from exc

    def _check(self) -> None:
        if self.broken is not None:
            raise self.broken

    async def _fail(self, exc: BaseException) -> BaseException:
        """Breaks the producer: what to raise for `exc`.

        Whatever went wrong (fenced, a fatal client state, an aiokafka assertion, a
        cancellation half-way through a commit), the transaction's fate is unknown here:
        the broker aborts it (a newer owner's start, or the transaction timeout).
        """
        if isinstance(exc, ProducerFenced):
            error: KafkaUnavailable = Fenced(f"{self.transactional_id} was fenced by a newer owner")
        else:
            error = KafkaUnavailable(f"{self.transactional_id}: transaction failed: {exc!r}")
        self.broken = error
        if self._open and not isinstance(exc, ProducerFenced):
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await self._producer.abort_transaction()
        self._open = False
        if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
            return exc
        return error


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class Reader:
    """Reads partitions to their current end (committed records only), one at a time.

    Long-lived, so that restoring a partition costs no consumer start-up; the short fetch
    wait keeps the last, empty fetch of each read from idling.
    """

    def __init__(self, bootstrap: str, *, batch: int = 5_000) -> None:
        self._batch = batch
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            max_poll_records=batch,
            fetch_max_wait_ms=20,
            fetch_max_bytes=32 * 1024 * 1024,
            max_partition_fetch_bytes=16 * 1024 * 1024,
        )
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        await _start(self._consumer, "reader")

    async def stop(self) -> None:
        # Also when never started: aiokafka warns of a client that was made and not closed.
        await self._consumer.stop()

    async def __aenter__(self) -> Reader:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        """(first offset still held, last stable offset) of the partition."""
        tp = TopicPartition(topic, partition)
        async with self._lock:
            try:
                begin = (await self._consumer.beginning_offsets([tp]))[tp]
                end = (await self._consumer.end_offsets([tp]))[tp]
            except KafkaError as exc:
                raise KafkaUnavailable(f"offsets of {topic}[{partition}]: {exc!r}") from exc
        return int(begin), int(end)

    async def read(self, topic: str, partition: int, start: int) -> AsyncIterator[list[Record]]:
        """The partition's records from `start` to its end as it is now, in batches."""
        tp = TopicPartition(topic, partition)
        async with self._lock:
            c = self._consumer
            try:
                c.assign([tp])
                end = (await c.end_offsets([tp]))[tp]
                begin = (await c.beginning_offsets([tp]))[tp]
                position = max(start, begin)
                if position >= end:
                    return
                c.seek(tp, position)
                while position < end:
                    # Short: what is left may be a transaction marker, which no fetch returns.
                    got = await c.getmany(tp, timeout_ms=100, max_records=self._batch)
                    msgs = got.get(tp, [])
                    if msgs:
                        yield [_record(m) for m in msgs if m.offset < end]
                    # Transaction markers take offsets too: trust the consumer's position.
                    position = await c.position(tp)
            except KafkaError as exc:
                raise KafkaUnavailable(f"cannot read {topic}[{partition}]: {exc!r}") from exc


async def read_to_end(
    bootstrap: str, topic: str, partition: int, start: int, *, batch: int = 5_000
) -> AsyncIterator[list[Record]]:
    """Reads one partition from `start` to its end as it is now (a one-off `Reader`)."""
    async with Reader(bootstrap, batch=batch) as reader:
        async for records in reader.read(topic, partition, start):
            yield records


async def read_partitions(
    bootstrap: str, topic: str, partitions: Iterable[int]
) -> AsyncIterator[list[Record]]:
    """Reads each of `partitions` from its start to its end as it is now, one after another."""
    async with Reader(bootstrap) as reader:
        for p in partitions:
            async for records in reader.read(topic, p, 0):
                yield records


async def tail(bootstrap: str, topic: str, partitions: Iterable[int]) -> AsyncIterator[Record]:
    """The records written to `partitions` of `topic` from now on, until cancelled."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="latest",
    )
    tps = [TopicPartition(topic, p) for p in partitions]
    try:
        await consumer.start()
        consumer.assign(tps)
        await consumer.seek_to_end(*tps)
        while True:
            got = await consumer.getmany(timeout_ms=500)
            for ms in got.values():
                for m in ms:
                    yield _record(m)
    finally:
        await consumer.stop()


def _record(m: Any) -> Record:
    return Record(m.topic, m.partition, m.offset, m.key, m.value, m.timestamp)


class PartitionReader:
    """Reads a changing set of one topic's partitions, each from where it was added.

    For the results of this node's own sends: no group, no committed offsets.
    """

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            fetch_max_wait_ms=50,
        )
        self._lock = asyncio.Lock()
        self._changed = asyncio.Event()

    async def start(self) -> None:
        await _start(self._consumer, f"reader of {self.topic}")

    async def stop(self) -> None:
        await self._consumer.stop()

    async def add(self, partition: int) -> None:
        async with self._lock:
            tp = TopicPartition(self.topic, partition)
            kept = {t: await self._consumer.position(t) for t in self._consumer.assignment()}
            if tp in kept:
                return
            end = (await self._consumer.end_offsets([tp]))[tp]
            # assign() forgets positions: put back those of the partitions already read.
            self._consumer.assign([*kept, tp])
            for t, position in kept.items():
                self._consumer.seek(t, position)
            self._consumer.seek(tp, end)
            self._changed.set()

    async def remove(self, partition: int) -> None:
        async with self._lock:
            tp = TopicPartition(self.topic, partition)
            kept = {t: await self._consumer.position(t) for t in self._consumer.assignment()}
            kept.pop(tp, None)
            self._consumer.assign(list(kept))
            for t, position in kept.items():
                self._consumer.seek(t, position)

    async def poll(self, timeout_ms: int = 200) -> list[Record]:
        if not self._consumer.assignment():
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout_ms / 1000)
            return []
        async with self._lock:
            try:
                got = await self._consumer.getmany(timeout_ms=timeout_ms)
            except KafkaError as exc:
                raise KafkaUnavailable(f"reading {self.topic} failed: {exc!r}") from exc
        return [_record(m) for ms in got.values() for m in ms]


Assigned = Callable[[set[tuple[str, int]]], Awaitable[None]]


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, on_assigned: Assigned, on_revoked: Assigned) -> None:
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self._on_revoked({(tp.topic, tp.partition) for tp in revoked})

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self._on_assigned({(tp.topic, tp.partition) for tp in assigned})


class GroupConsumer:
    """A consumer-group member whose assignment is the node's partition ownership.

    The range assignor hands partition p of every subscribed topic to the same member,
    which is what co-partitioning needs (round robin, aiokafka's default, would not).
    The rebalance callbacks are awaited before fetching resumes, so a partition is
    restored before any of its records is processed.
    """

    def __init__(
        self,
        bootstrap: str,
        group_id: str,
        topics: Sequence[str],
        *,
        on_assigned: Assigned,
        on_revoked: Assigned,
        session_timeout_ms: int = 10_000,
        max_poll_records: int = 2_000,
    ) -> None:
        self._topics = list(topics)
        self._listener = _Listener(on_assigned, on_revoked)
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            partition_assignment_strategy=(RangePartitionAssignor,),
            session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=max(300, session_timeout_ms // 4),
            rebalance_timeout_ms=max(session_timeout_ms * 3, 30_000),
            max_poll_records=max_poll_records,
        )

    async def start(self) -> None:
        await _start(self._consumer, "consumer")
        self._consumer.subscribe(self._topics, listener=self._listener)

    async def stop(self) -> None:
        await self._consumer.stop()

    async def poll(self, timeout_ms: int = 500) -> dict[tuple[str, int], list[Record]]:
        try:
            got = await self._consumer.getmany(timeout_ms=timeout_ms)
        except KafkaError as exc:
            raise KafkaUnavailable(f"poll failed: {exc!r}") from exc
        return {(tp.topic, tp.partition): [_record(m) for m in ms] for tp, ms in got.items()}

    async def commit(self, offsets: dict[tuple[str, int], int]) -> None:
        """Commits `offsets` (the next offset to read, per partition).

        `KafkaUnavailable` when the group rebalanced meanwhile: the partitions' next owner
        reads those records again, which every consumer here is written to survive.
        """
        if offsets:
            tps = {TopicPartition(t, p): o for (t, p), o in offsets.items()}
            try:
                await self._consumer.commit(tps)
            except KafkaError as exc:
                raise KafkaUnavailable(f"offset commit failed: {exc!r}") from exc

    async def backlog(self, topic: str, partition: int) -> int:
        """How many records of the partition wait behind what was fetched."""
        tp = TopicPartition(topic, partition)
        high = self._consumer.highwater(tp)
        if high is None:
            return 0
        return max(0, int(high) - int(await self._consumer.position(tp)))

    def pause(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Stops fetching these partitions (they are restored first)."""
        tps = [TopicPartition(t, p) for t, p in partitions]
        assigned = self._consumer.assignment()
        self._consumer.pause(*[tp for tp in tps if tp in assigned])

    def resume(self, partitions: Iterable[tuple[str, int]]) -> None:
        tps = [TopicPartition(t, p) for t, p in partitions]
        assigned = self._consumer.assignment()
        self._consumer.resume(*[tp for tp in tps if tp in assigned])

    async def rewind(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Reads these partitions again from the group's committed offsets (the start where
        none is committed): what was read after them never counted."""
        assigned = self._consumer.assignment()
        targets: dict[TopicPartition, int] = {}
        try:
            for t, p in partitions:
                tp = TopicPartition(t, p)
                if tp not in assigned:
                    continue
                offset = await self._consumer.committed(tp)
                if offset is None or offset < 0:
                    offset = (await self._consumer.beginning_offsets([tp]))[tp]
                targets[tp] = offset
            # All seeks at once, after the last await: a caller that marks the rewind
            # (a new take generation) right after it returns sees no batch fetched from
            # the old positions delivered after the mark.
            assigned = self._consumer.assignment()
            for tp, offset in targets.items():
                if tp in assigned:
                    self._consumer.seek(tp, offset)
        except IllegalStateError:
            return  # revoked in between
        except KafkaError as exc:
            raise KafkaUnavailable(f"cannot read committed offsets: {exc!r}") from exc

    def seek(self, topic: str, partition: int, offset: int) -> bool:
        """Reads the partition again from `offset`; False when it is no longer assigned."""
        tp = TopicPartition(topic, partition)
        if tp not in self._consumer.assignment():
            return False
        try:
            self._consumer.seek(tp, offset)
        except IllegalStateError:
            return False  # revoked in between
        return True

    def assignment(self) -> set[tuple[str, int]]:
        return {(tp.topic, tp.partition) for tp in self._consumer.assignment()}


async def wait_closed(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancels `tasks` and waits for them, swallowing their cancellation."""
    tasks = list(tasks)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
