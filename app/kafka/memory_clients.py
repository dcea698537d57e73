"""The ports' clients of a `MemoryLog` (`app.kafka.memory`, which describes what it
models): the transactional writer (epochs and fencing, broken for good by a failure, as
`TransactionalProducer`), the reader of whole partitions, the publisher, the follower, and
the admin port with the operators' calls (`MemoryClusterAdmin`: topics found, their
configs and replicas, groups' members and offsets, records deleted). Each is made by the log
(`MemoryLog.transactional_writer`, `reader`, `publisher`, `follower`, `admin`) and acts on
it through its internals.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, TypeVar

from app.errors import Fenced, KafkaUnavailable
from app.kafka.memory_group import MemoryAdmin
from app.kafka.producers import TRANSACTION_BATCH_BYTES
from app.kafka.records import OutRecord, Record, TopicConfigs

if TYPE_CHECKING:
    from app.kafka.memory import MemoryLog
    from app.kafka.memory_partition import Txn

__all__ = [
    "MemoryClusterAdmin",
    "MemoryFollower",
    "MemoryPublisher",
    "MemoryReader",
    "MemoryWriter",
]

_T = TypeVar("_T")


class MemoryWriter:
    """`TransactionalWriter` on a `MemoryLog`. Beside `commit` (a whole transaction), the
    steps one is made of, for tests: `send` (into the open transaction, begun if none is),
    `send_offsets`, `commit_transaction` and `abort`."""

    def __init__(
        self, log: MemoryLog, transactional_id: str, *, max_batch_bytes: int | None = None
    ) -> None:
        self.transactional_id = transactional_id
        # As asked (None: the default); nothing is batched here.
        self.max_batch_bytes = (
            TRANSACTION_BATCH_BYTES if max_batch_bytes is None else max_batch_bytes
        )
        self.broken: KafkaUnavailable | None = None
        self._log = log
        self._epoch: int | None = None
        self._txn: Txn | None = None
        self._lock = asyncio.Lock()

    @property
    def pending(self) -> bool:
        """Whether a transaction is open."""
        return self._txn is not None and self._txn.state == "open"

    async def start(self) -> None:
        self._log.connect()
        self._epoch = self._log._init(self.transactional_id)

    async def stop(self) -> None:
        """Closes the writer: an open transaction stays open (until the next writer of the
        id fences it, or `MemoryLog.expire`), as a producer closed mid-transaction leaves
        it on the broker."""
        self._epoch = None

    async def commit(
        self,
        records: Sequence[OutRecord],
        offsets: dict[tuple[str, int], int],
        group_id: str,
    ) -> list[int]:
        async with self._lock:
            written = self._guard(lambda: self._send(records))
            self._guard(lambda: self._send_offsets(offsets, group_id))
            if self._log.before_commit is not None:
                await self._log.before_commit(self.transactional_id)
            self._guard(self._commit)
            return written

    async def send(self, records: Sequence[OutRecord]) -> list[int]:
        """Writes `records` in the open transaction (begun if none is); their offsets."""
        async with self._lock:
            return self._guard(lambda: self._send(records))

    async def send_offsets(self, offsets: dict[tuple[str, int], int], group_id: str) -> None:
        async with self._lock:
            self._guard(lambda: self._send_offsets(offsets, group_id))

    async def commit_transaction(self) -> None:
        async with self._lock:
            self._guard(self._commit)

    async def abort(self) -> None:
        """Aborts the open transaction, if one is."""
        async with self._lock:
            self._guard(self._abort)

    def _current(self) -> Txn:
        """The open transaction, begun if none is; raises if the writer cannot write."""
        if self.broken is not None:
            raise self.broken
        if self._epoch is None:
            raise KafkaUnavailable(f"{self.transactional_id}: not started")
        self._log.check_up()
        if self._log.epoch(self.transactional_id) != self._epoch:
            raise Fenced(f"{self.transactional_id} was fenced by a newer owner")
        if self._txn is None or self._txn.state != "open":
            self._txn = self._log._begin(self.transactional_id, self._epoch)
        return self._txn

    def _send(self, records: Sequence[OutRecord]) -> list[int]:
        return self._log._append(records, self._current())

    def _send_offsets(self, offsets: dict[tuple[str, int], int], group_id: str) -> None:
        txn = self._current()
        if offsets:
            txn.offsets.setdefault(group_id, {}).update(offsets)

    def _commit(self) -> None:
        txn = self._current()
        self._log._end(txn, commit=True)
        self._txn = None

    def _abort(self) -> None:
        if self.pending:
            txn = self._current()
            self._log._end(txn, commit=False)
        self._txn = None

    def _guard(self, step: Callable[[], _T]) -> _T:
        try:
            return step()
        except KafkaUnavailable as exc:
            error = self._fail(exc)
            if error is exc:
                raise
            raise error from exc

    def _fail(self, exc: KafkaUnavailable) -> KafkaUnavailable:
        """Breaks the writer, as `TransactionalProducer._fail`: an open transaction is
        aborted unless fenced (the newer writer aborted it) or the broker is unreachable
        (then it stays open until fenced or expired)."""
        if self.broken is exc:
            return exc
        if not isinstance(exc, Fenced):
            exc = KafkaUnavailable(f"{self.transactional_id}: transaction failed: {exc}")
        self.broken = exc
        txn, self._txn = self._txn, None
        fenced = isinstance(exc, Fenced)
        if txn is not None and txn.state == "open" and not fenced and not self._log.down:
            self._log._end(txn, commit=False)
        return exc


class MemoryReader:
    """`ReaderClient` on a `MemoryLog` (read-committed unless told otherwise)."""

    def __init__(self, log: MemoryLog, *, read_committed: bool = True, batch: int = 5_000) -> None:
        self._log = log
        self._committed = read_committed
        self._batch = batch

    async def start(self) -> None:
        self._log.check_up()

    async def stop(self) -> None:
        return None

    async def __aenter__(self) -> MemoryReader:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        self._log.check_up()
        return self._log.offsets(topic, partition, committed=self._committed)

    async def read(
        self, topic: str, partition: int, start: int
    ) -> AsyncGenerator[list[Record], None]:
        begin, end = await self.offsets(topic, partition)
        position = max(start, begin)
        while position < end:
            self._log.check_up()
            position = max(position, self._log.offsets(topic, partition)[0])
            got, position = self._log.visible(
                topic, partition, position, end, self._committed, self._batch
            )
            if got:
                yield got
            await asyncio.sleep(0)


class MemoryPublisher:
    """`PublisherClient` on a `MemoryLog`: non-transactional writes. `die` ends it for good,
    as aiokafka's sender task ending does (`app.kafka.producers.Producer`)."""

    def __init__(self, log: MemoryLog) -> None:
        self._log = log
        self.broken: KafkaUnavailable | None = None
        self._died = asyncio.Event()

    async def start(self) -> None:
        self._log.check_up()

    async def stop(self) -> None:
        return None

    def die(self, error: KafkaUnavailable) -> None:
        """Every later send raises `error`, and `failed` raises it."""
        self.broken = error
        self._died.set()

    async def failed(self) -> None:
        await self._died.wait()
        assert self.broken is not None
        raise self.broken

    async def send_many(self, records: Sequence[OutRecord]) -> list[int]:
        if self.broken is not None:
            raise self.broken
        self._log.check_up()
        return self._log._append(records, None)

    async def send(
        self, topic: str, key: bytes | None, value: bytes | None, partition: int | None = None
    ) -> int:
        return (await self.send_many([(topic, partition, key, value)]))[0]


class MemoryFollower:
    """`Follower` on a `MemoryLog`: committed records of the added partitions."""

    def __init__(self, log: MemoryLog, topic: str) -> None:
        self.topic = topic
        self._log = log
        self._positions: dict[int, int] = {}

    async def start(self) -> None:
        self._log.check_up()

    async def stop(self) -> None:
        self._positions.clear()

    async def add(self, partition: int) -> None:
        self._log.check_up()
        if partition not in self._positions:
            self._positions[partition] = self._log.offsets(self.topic, partition)[1]
            self._log._notify()

    async def remove(self, partition: int) -> None:
        self._positions.pop(partition, None)

    async def poll(self, timeout_ms: int = 200) -> list[Record]:
        got = self._take()
        if not got:
            await self._log.changed(timeout_ms / 1000)
            got = self._take()
        return got

    def _take(self) -> list[Record]:
        self._log.check_up()
        got: list[Record] = []
        for p, position in sorted(self._positions.items()):
            begin, end = self._log.offsets(self.topic, p)
            records, self._positions[p] = self._log.visible(
                self.topic, p, max(position, begin), end, True, None
            )
            got += records
        return got


class MemoryClusterAdmin(MemoryAdmin):
    """`app.kafka.ports.Admin` on a `MemoryLog`, with the operators' calls: as Kafka's, a
    group's offsets cannot be set while it has members, and records cannot be deleted past
    a partition's end."""

    def __init__(self, log: MemoryLog) -> None:
        super().__init__(log)
        self._memory = log

    def where(self) -> str:
        return f"the memory log {self._memory.cluster_id}"

    async def existing_topics(self, names: Iterable[str]) -> dict[str, int]:
        self._memory.check_up()
        have = self._memory.topic_names()
        return {n: self._memory.partitions(n) for n in names if n in have}

    async def topic_configs(self, topics: Sequence[str], names: Sequence[str]) -> TopicConfigs:
        self._memory.check_up()
        read: dict[str, dict[str, str]] = {}
        unread: dict[str, str] = {}
        for topic in topics:
            configs = self._memory.configs.get(topic)
            if self._memory.describe_refused is not None:
                unread[topic] = self._memory.describe_refused
            elif configs is None:
                unread[topic] = "This server does not host this topic-partition."
            else:
                # As a broker answers: the topic's own value, else the default.
                own = {**configs, "max.message.bytes": str(self._memory.max_message_bytes(topic))}
                read[topic] = {n: own[n] for n in names if n in own}
        return TopicConfigs(read, unread)

    async def replicas(self, topics: Sequence[str]) -> tuple[int, dict[str, int]]:
        self._memory.check_up()
        have = self._memory.topic_names()
        return self._memory.brokers, {
            t: self._memory.replicas.get(t, 1) for t in topics if t in have
        }

    async def group_members(self, group_id: str) -> int:
        self._memory.check_up()
        group = self._memory.groups.get(group_id)
        return 0 if group is None else len(group.members)

    async def committed_offsets(
        self, group_id: str, partitions: Iterable[tuple[str, int]]
    ) -> dict[tuple[str, int], int | None]:
        self._memory.check_up()
        return {(t, p): self._memory.committed(group_id, t, p) for t, p in partitions}

    async def log_offsets(self, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
        self._memory.check_up()
        return {p: self._memory.offsets(topic, p, committed=False) for p in range(partitions)}

    async def delete_records(self, topic: str, before: dict[int, int]) -> dict[int, int]:
        self._memory.check_up()
        for p, offset in before.items():
            self._memory.delete_records(topic, p, offset)
        return {p: self._memory.offsets(topic, p)[0] for p in before}

    async def reset_group_offsets(
        self, group_id: str, topic: str, partitions: int, offset: int = 0
    ) -> None:
        members = await self.group_members(group_id)
        if members:
            raise KafkaUnavailable(
                f"cannot reset {group_id}'s offsets of {topic}: the group has {members} member(s)"
            )
        self._memory.partitions(topic)  # an unknown topic is an error, as on Kafka
        self._memory.commit_group_offsets(group_id, {(topic, p): offset for p in range(partitions)})


if TYPE_CHECKING:
    from app.kafka.clients import KafkaClients
    from app.kafka.consumers import Reader
    from app.kafka.partition_reader import PartitionReader
    from app.kafka.ports import (
        Admin,
        Clients,
        Follower,
        LogReader,
        Publisher,
        PublisherClient,
        ReaderClient,
        TransactionalWriter,
        WriterFactory,
    )
    from app.kafka.producers import Producer
    from app.kafka.transactional_producer import TransactionalProducer

    def _conforms(
        kafka: KafkaClients,
        reader: Reader,
        producer: Producer,
        writer: TransactionalProducer,
        follower: PartitionReader,
        memory: MemoryLog,
    ) -> None:
        """mypy checks that both sides implement the ports (never called)."""
        _clients: list[Clients] = [kafka, memory]
        _readers: list[ReaderClient] = [reader, memory.reader()]
        _log_readers: list[LogReader] = [reader, memory.reader()]
        _publishers: list[PublisherClient] = [producer, memory.publisher()]
        _publish: list[Publisher] = [producer, memory.publisher()]
        _writers: list[TransactionalWriter] = [writer, memory.transactional_writer("t")]
        _factories: list[WriterFactory] = [kafka.transactional_writer, memory.transactional_writer]
        _followers: list[Follower] = [follower, memory.follower("t")]
        _admins: list[Admin] = [kafka.admin(), memory.admin()]
