"""An in-memory Kafka log implementing the ports (`app.kafka.ports`), for tests.

`MemoryLog` holds topics of partitions of records, and models what the runtime relies on:

- Offsets. Every record takes the next offset of its partition, when it is sent (so the
  records of a transaction interleave with other writers' by offset). Ending a transaction
  writes a marker (commit or abort) in each partition it wrote to, which takes an offset
  too and is never returned by a read. `delete_records` moves a partition's first offset.
- Transactions and read-committed visibility. A transaction's records are invisible to
  read-committed readers until it commits, and skipped for good when it aborts. The last
  stable offset (the end a read-committed reader sees) stops at the first record of the
  oldest open transaction of the partition, so later records, even non-transactional
  ones, wait behind it as in Kafka. Read-uncommitted readers (`reader(read_committed=
  False)`) see every record up to the high watermark, aborted ones included.
- Fencing. Each transactional id has an epoch; a writer's `start` bumps it and aborts the
  open transaction of the previous writer of that id, whose every later call raises
  `app.errors.Fenced` (and breaks it for good, as `TransactionalProducer` does).
  `expire` aborts an open transaction as the broker's transaction timeout does.
- Consumer-group offsets sent in a transaction: visible (`committed`) only once it
  commits, dropped when it aborts.
- The default partitioner: a keyed record without a partition goes where the Java client
  (and aiokafka) puts it, murmur2 of the key; an unkeyed one round robin.
- An unreachable broker (`down = True`): every client call raises `KafkaUnavailable`; a
  transactional writer that fails so is broken, and its open transaction cannot be
  aborted either (it stays open, holding the last stable offset back, until the next
  writer of its id fences it or `expire`).

- A missing topic: a write to a topic the log does not have fails (`KafkaUnavailable`),
  and breaks a transactional writer, as aiokafka's send does on a broker that does not
  create topics (its metadata wait ends in `UnknownTopicOrPartitionError`, after
  `request_timeout_ms`: here at once).
- Topic configs (`configs`): each topic's as `app.kafka.ensure_topics` makes it (one
  replica), over a broker's defaults (`cleanup.policy=delete`, 7 days' retention); a test
  changes them as `kafka-configs --alter` does. `describe_refused` refuses their reads
  topic by topic, as a missing DescribeConfigs ACL does. The live brokers (`brokers`) and
  each topic's replicas (`replicas`) are numbers alone, 1 unless a test sets them.

Consumer groups: `app.kafka.memory_group`. Not modelled: compaction,
retention by time or size, record headers, batching and linger, producer idempotence's
sequence numbers, and timeouts (nothing here ever waits but a follower's poll).

Pure asyncio and deterministic: no threads, no wall clock (record timestamps count up from
0 unless a clock is given). `before_commit` lets a test act between a transaction's
writes and its commit (e.g. start a newer writer of the same id: a zombie's commit).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable, Iterable, Sequence

from aiokafka.partitioner import murmur2

from app.errors import KafkaUnavailable
from app.kafka.admin import topic_configs
from app.kafka.memory_clients import (
    MemoryClusterAdmin,
    MemoryFollower,
    MemoryPublisher,
    MemoryReader,
    MemoryWriter,
)
from app.kafka.memory_group import MemoryGroup, MemoryGroupMember
from app.kafka.memory_partition import BROKER_DEFAULTS, Entry, Key, Partition, Txn
from app.kafka.ports import Assigned, DeletedUnread
from app.kafka.records import (
    BROKER_MAX_MESSAGE_BYTES,
    OutRecord,
    Record,
    Replication,
    TopicSpec,
    headers_of,
)

__all__ = [
    "MemoryFollower",
    "MemoryLog",
    "MemoryPublisher",
    "MemoryReader",
    "MemoryWriter",
]


class MemoryLog:
    """Topics, transactional ids and consumer groups of one in-memory cluster; makes the
    ports' clients (`app.kafka.ports.Clients`)."""

    def __init__(
        self, topics: Iterable[TopicSpec] = (), *, now: Callable[[], int] | None = None
    ) -> None:
        self._topics: dict[str, list[Partition]] = {}
        self._max_bytes: dict[str, int] = {}
        self._epochs: dict[str, int] = {}
        self._open: dict[str, Txn] = {}
        self._groups: dict[str, dict[Key, int]] = {}
        self._now = now
        self._ticks = itertools.count()
        self._unkeyed = itertools.count()
        self._waiters: list[asyncio.Future[None]] = []
        self.groups: dict[str, MemoryGroup] = {}
        """Consumer groups by id (`app.kafka.memory_group`)."""
        self.cluster_id = f"memory-{id(self):x}"
        self.down = False
        """While set, every client call raises `KafkaUnavailable`."""
        self.before_commit: Callable[[str], Awaitable[None]] | None = None
        """Awaited with the transactional id between a transaction's writes and its end."""
        self.configs: dict[str, dict[str, str]] = {}
        """Each topic's configs, as DescribeConfigs tells them (its own, else the default)."""
        self.describe_refused: str | None = None
        """While set, every topic's configs are refused to readers, saying this."""
        self.brokers = 1
        self.replicas: dict[str, int] = {}
        """Each topic's replication factor said to readers, where not 1."""
        self.login_refused: str | None = None
        """While set, the cluster lets no new connection in (credentials rotated, say):
        a writer's start fails as aiokafka's does, naming no refusal ("Unable to
        bootstrap"), and `check_access` says why. Clients already started go on."""
        self.ensure_topics(topics)

    # --- clients (`Clients`) --------------------------------------------------------

    def transactional_writer(
        self,
        transactional_id: str,
        *,
        max_batch_bytes: int | None = None,
        topics: Iterable[str] = (),  # a memory log has no metadata to fetch
    ) -> MemoryWriter:
        return MemoryWriter(self, transactional_id, max_batch_bytes=max_batch_bytes)

    def reader(self, *, read_committed: bool = True, batch: int = 5_000) -> MemoryReader:
        return MemoryReader(self, read_committed=read_committed, batch=batch)

    def publisher(self) -> MemoryPublisher:
        return MemoryPublisher(self)

    def follower(self, topic: str) -> MemoryFollower:
        return MemoryFollower(self, topic)

    def admin(self) -> MemoryClusterAdmin:
        return MemoryClusterAdmin(self)

    def group_member(
        self,
        group_id: str,
        topics: Sequence[str],
        *,
        on_assigned: Assigned,
        on_revoked: Assigned,
        session_timeout_ms: int = 10_000,
        group_instance_id: str | None = None,
        on_deleted: DeletedUnread | None = None,
    ) -> MemoryGroupMember:
        """A member of `group_id` (its session timeout plays no part: `expel` ends one; nor
        does a static member's id: every member here is dynamic)."""
        group = self.groups.setdefault(group_id, MemoryGroup(self, group_id))
        return MemoryGroupMember(
            self,
            group,
            topics,
            on_assigned=on_assigned,
            on_revoked=on_revoked,
            on_deleted=on_deleted,
        )

    def commit_group_offsets(self, group_id: str, offsets: dict[Key, int]) -> None:
        """Offsets committed outside a transaction (a consumer's commit)."""
        self._groups.setdefault(group_id, {}).update(offsets)

    # --- topics and offsets ---------------------------------------------------------

    def ensure_topics(self, specs: Iterable[TopicSpec]) -> None:
        """Creates the topics not there yet; one there with another partition count is an
        error (as `app.kafka.ensure_topics`)."""
        for spec in specs:
            have = self._topics.get(spec.name)
            if have is None:
                self._topics[spec.name] = [Partition() for _ in range(spec.partitions)]
                self.configs[spec.name] = BROKER_DEFAULTS | topic_configs(spec, Replication(1, 1))
                if spec.max_message_bytes is not None:
                    self._max_bytes[spec.name] = spec.max_message_bytes
            elif len(have) != spec.partitions:
                raise KafkaUnavailable(
                    f"topic {spec.name} has {len(have)} partitions, expected {spec.partitions}"
                )

    def max_message_bytes(self, topic: str) -> int:
        """What the topic was created to accept (no record is refused for its size here)."""
        self._topic(topic)
        return self._max_bytes.get(topic, BROKER_MAX_MESSAGE_BYTES)

    def create_topic(self, name: str, partitions: int = 1) -> str:
        self.ensure_topics([TopicSpec(name, partitions)])
        return name

    def topic_names(self) -> set[str]:
        return set(self._topics)

    def partitions(self, topic: str) -> int:
        return len(self._topic(topic))

    def offsets(self, topic: str, partition: int, *, committed: bool = True) -> tuple[int, int]:
        """(first offset held, last stable offset), or the high watermark for the end when
        not `committed`."""
        part = self._partition(topic, partition)
        return part.start, part.stable_end if committed else part.end

    def records(
        self, topic: str, partition: int, *, committed: bool = True, start: int = 0
    ) -> list[Record]:
        """The partition's records a reader sees now (read-committed by default)."""
        part = self._partition(topic, partition)
        end = part.stable_end if committed else part.end
        return self.visible(topic, partition, max(start, part.start), end, committed, None)[0]

    def delete_records(self, topic: str, partition: int, before: int) -> None:
        """Moves the partition's first offset to `before` (DeleteRecords)."""
        part = self._partition(topic, partition)
        if before > part.end:
            raise KafkaUnavailable(f"{topic}[{partition}]: {before} is past the end {part.end}")
        part.start = max(part.start, before)

    def compact(self, topic: str, partition: int) -> None:
        """What a broker's cleaner leaves of the partition once its tombstones are past
        `delete.retention.ms`: each key's last committed record alone, none of a key whose
        last is a tombstone. Their offsets stay taken (read over), the first offset stays."""
        part = self._partition(topic, partition)
        done = [
            (i, e)
            for i, e in enumerate(part.entries[: part.stable_end])
            if not e.marker and e.key is not None and (e.txn is None or e.txn.state != "open")
        ]
        last = {e.key: i for i, e in done if e.txn is None or e.txn.state == "committed"}
        for i, e in done:
            if last.get(e.key) != i or e.value is None:
                e.marker = True  # gone: read over, as a transaction's marker is

    async def add_partitions(self, topics: Iterable[str], count: int) -> None:
        """Adds `count` partitions to each of `topics` (CreatePartitions); then every group
        rebalances, as a consumer's metadata refresh has its group do in Kafka."""
        for topic in topics:
            self._topic(topic).extend(Partition() for _ in range(count))
        for group in list(self.groups.values()):
            await group.rebalance()

    def recreate(self, topic: str) -> None:
        """Deletes `topic` and creates it again, empty, with as many partitions."""
        self._topics[topic] = [Partition() for _ in self._topic(topic)]

    def committed(self, group_id: str, topic: str, partition: int) -> int | None:
        """The group's committed offset of the partition, if any."""
        return self._groups.get(group_id, {}).get((topic, partition))

    def epoch(self, transactional_id: str) -> int:
        """The transactional id's current epoch (0: never started)."""
        return self._epochs.get(transactional_id, 0)

    def open_transaction(self, transactional_id: str) -> bool:
        return transactional_id in self._open

    def expire(self, transactional_id: str) -> bool:
        """Aborts the id's open transaction as the transaction timeout does (its writer is
        fenced); whether there was one."""
        txn = self._open.get(transactional_id)
        if txn is None:
            return False
        self._epochs[transactional_id] = txn.epoch + 1
        self._end(txn, commit=False)
        return True

    # --- internals ------------------------------------------------------------------

    def _topic(self, topic: str) -> list[Partition]:
        parts = self._topics.get(topic)
        if parts is None:
            raise KafkaUnavailable(f"unknown topic {topic}")
        return parts

    def _partition(self, topic: str, partition: int) -> Partition:
        parts = self._topic(topic)
        if not 0 <= partition < len(parts):
            raise KafkaUnavailable(f"unknown partition {topic}[{partition}]")
        return parts[partition]

    def check_up(self) -> None:
        if self.down:
            raise KafkaUnavailable("the broker is not reachable")

    def connect(self) -> None:
        """A new connection: refused while `login_refused` is set."""
        self.check_up()
        if self.login_refused is not None:
            raise KafkaUnavailable("cannot connect: Unable to bootstrap from memory")

    def _where(self, record: OutRecord) -> Key:
        """The partition a record goes to (the default partitioner's when not given)."""
        topic, partition, key = record[0], record[1], record[2]
        count = len(self._topic(topic))
        if partition is None:
            if key is None:
                partition = next(self._unkeyed) % count
            else:
                partition = (murmur2(key) & 0x7FFFFFFF) % count
        self._partition(topic, partition)
        return topic, partition

    def date_by(self, now: Callable[[], int]) -> None:
        """Records appended from now on are dated by `now`, unless a clock was given."""
        if self._now is None:
            self._now = now

    def _timestamp(self) -> int:
        return self._now() if self._now is not None else next(self._ticks)

    def _append(self, records: Sequence[OutRecord], txn: Txn | None) -> list[int]:
        """Appends all of `records` or (an unknown partition) none."""
        where = [self._where(r) for r in records]
        offsets: list[int] = []
        for (topic, partition), record in zip(where, records, strict=True):
            part = self._topics[topic][partition]
            offset = part.end
            key, value, headers = record[2], record[3], headers_of(record)
            part.entries.append(Entry(key, value, self._timestamp(), txn, headers=headers))
            if txn is not None and (topic, partition) not in txn.first:
                txn.first[(topic, partition)] = offset
                part.open[txn] = offset
            offsets.append(offset)
        self._notify()
        return offsets

    def _init(self, transactional_id: str) -> int:
        """A new writer of the id: the previous one's open transaction is aborted and it is
        fenced. The new epoch."""
        self.check_up()
        epoch = self.epoch(transactional_id) + 1
        self._epochs[transactional_id] = epoch
        txn = self._open.get(transactional_id)
        if txn is not None:
            self._end(txn, commit=False)
        return epoch

    def _begin(self, transactional_id: str, epoch: int) -> Txn:
        txn = Txn(transactional_id, epoch)
        self._open[transactional_id] = txn
        return txn

    def _end(self, txn: Txn, *, commit: bool) -> None:
        """Writes the transaction's markers; its group offsets count if it commits."""
        for topic, partition in txn.first:
            part = self._topics[topic][partition]
            part.entries.append(Entry(None, None, self._timestamp(), txn, marker=True))
            del part.open[txn]
        txn.state = "committed" if commit else "aborted"
        if commit:
            for group, offsets in txn.offsets.items():
                self._groups.setdefault(group, {}).update(offsets)
        if self._open.get(txn.transactional_id) is txn:
            del self._open[txn.transactional_id]
        self._notify()

    def visible(
        self,
        topic: str,
        partition: int,
        position: int,
        end: int,
        committed: bool,
        limit: int | None,
    ) -> tuple[list[Record], int]:
        """The records a reader sees from `position` (at most `limit`), and where the next
        read starts: past the markers and aborted records read over."""
        entries = self._topics[topic][partition].entries
        got: list[Record] = []
        while position < end and (limit is None or len(got) < limit):
            e = entries[position]
            if not e.marker and (not committed or e.txn is None or e.txn.state == "committed"):
                got.append(
                    Record(topic, partition, position, e.key, e.value, e.timestamp, e.headers)
                )
            position += 1
        return got, position

    def _notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def changed(self, seconds: float) -> None:
        """Returns when anything was written or a transaction ended, or after `seconds`."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        # Not wait_for: on 3.11 it swallows a cancellation that comes as the waiter is set,
        # and a reader's task cancelled then would never end.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await waiter
