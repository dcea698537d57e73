"""The memory log against the real broker: one scenario through the ports (`Clients`), run
on both, must see the same offsets, records, group offsets and fencing, so the fake cannot
drift from Kafka's behaviour (markers taking offsets, read-committed visibility, the
stable end held by an open transaction, a zombie's aborted writes, group offsets
committed with a transaction). The Kafka runs are marked `kafka`; the memory one is not.
The Kafka scenario runs twice: with aiokafka's transactional writer (the default) and
with librdkafka's (`KafkaClients(client="confluent")`), the same port contract for both."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from app.errors import Fenced
from app.kafka import (
    Clients,
    Follower,
    GroupOffsets,
    KafkaClients,
    OutRecord,
    ReaderClient,
    TransactionalProducer,
    TransactionalWriter,
)
from app.kafka.clients import KafkaClient
from app.kafka.memory import MemoryLog, MemoryWriter
from app.kafka.rdkafka_writer import RdkafkaTransactionalWriter

GROUP = "contract-group"


class MemoryBackend:
    def __init__(self) -> None:
        self.log = MemoryLog()
        self.clients: Clients = self.log
        self._n = 0

    async def topic(self) -> str:
        self._n += 1
        return self.log.create_topic(f"contract-{self._n}", 1)

    async def committed(self, topic: str, expected: int) -> int | None:
        return self.log.committed(GROUP, topic, 0)

    async def open_transaction(self, writer: TransactionalWriter, records: list[OutRecord]) -> None:
        assert isinstance(writer, MemoryWriter)
        await writer.send(records)


class KafkaBackend:
    def __init__(
        self, bootstrap: str, topics: Callable[..., Any], client: KafkaClient = "aiokafka"
    ) -> None:
        self.bootstrap = bootstrap
        self.clients = KafkaClients(bootstrap, client=client)
        self._topics = topics

    async def topic(self) -> str:
        name: str = await self._topics(partitions=1)
        return name

    async def committed(self, topic: str, expected: int) -> int | None:
        """The group's offset once it is `expected` (else the last one read, after 20 s).

        A transaction's offsets become visible only when the transaction coordinator has
        written its commit markers, which it does after the commit has returned; aiokafka's
        OffsetFetch (v3 at most) cannot ask to wait for them (KIP-447's require_stable), so
        a read right after the commit may still see the previous offset."""
        async with GroupOffsets(self.bootstrap, GROUP) as offsets:
            deadline = time.monotonic() + 20
            while True:
                got = (await offsets.fetch([(topic, 0)]))[(topic, 0)]
                if got == expected or time.monotonic() > deadline:
                    return got
                await asyncio.sleep(0.05)

    async def open_transaction(self, writer: TransactionalWriter, records: list[OutRecord]) -> None:
        """Writes records in an open transaction and waits for the broker to have them (the
        runtime only ever commits at once: the producer's own step, for this scenario)."""
        if isinstance(writer, TransactionalProducer):
            await asyncio.gather(*(batch for batch, _ in await writer._append(records)))
        else:
            assert isinstance(writer, RdkafkaTransactionalWriter)
            await writer.send(records)  # returns once the broker has them


Backend = MemoryBackend | KafkaBackend


@pytest.fixture(
    params=[
        "memory",
        pytest.param("kafka", marks=[pytest.mark.kafka, pytest.mark.kafka_next]),
        pytest.param("kafka-confluent", marks=[pytest.mark.kafka, pytest.mark.kafka_next]),
    ]
)
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param == "memory":
        return MemoryBackend()
    return KafkaBackend(
        request.getfixturevalue("kafka_bootstrap"),
        request.getfixturevalue("topic_factory"),
        "confluent" if request.param == "kafka-confluent" else "aiokafka",
    )


async def values(reader: ReaderClient, topic: str, start: int = 0) -> list[tuple[int, bytes]]:
    return [(r.offset, r.value or b"") async for b in reader.read(topic, 0, start) for r in b]


async def polled(follower: Follower, count: int) -> list[tuple[int, bytes]]:
    got: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 20
    while len(got) < count and time.monotonic() < deadline:
        got += [(r.offset, r.value or b"") for r in await follower.poll(timeout_ms=200)]
    return got


async def offsets_once(
    reader: ReaderClient, topic: str, expected: tuple[int, int]
) -> tuple[int, int]:
    """The log's offsets once they are `expected` (else the last read, after 20 s): a
    commit returns before the coordinator writes its markers, which take an offset."""
    deadline = time.monotonic() + 20
    while True:
        got = await reader.offsets(topic, 0)
        if got == expected or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.05)


def rec(topic: str, value: bytes) -> OutRecord:
    return (topic, 0, b"k", value)


async def commit(
    writer: TransactionalWriter,
    records: Sequence[OutRecord],
    offsets: dict[tuple[str, int], int] | None = None,
) -> list[int]:
    return await writer.commit(records, offsets or {}, GROUP)


async def test_the_memory_log_behaves_as_the_broker_does(backend: Backend) -> None:
    await scenario(backend)
    # aiokafka leaves a fenced transaction's first waiter unretrieved (the fatal error's
    # waiter replaces it): collected here, with the scenario's clients, its "never
    # retrieved" log comes now, not at the session's end (where Python 3.11.7 then fails
    # compiling a late import with "AST constructor recursion depth mismatch").
    gc.collect()


async def scenario(backend: Backend) -> None:
    topic, consumed = await backend.topic(), await backend.topic()
    clients = backend.clients
    tid = f"{topic}.txn"
    reader, publisher = clients.reader(), clients.publisher()
    await reader.start()
    await publisher.start()
    writers: list[TransactionalWriter] = []

    async def writer() -> TransactionalWriter:
        w = clients.transactional_writer(tid)
        writers.append(w)
        await w.start()
        return w

    try:
        # Two records and their commit marker; a group offset committed with them.
        a = await writer()
        assert await commit(a, [rec(topic, b"a"), rec(topic, b"b")], {(consumed, 0): 5}) == [0, 1]
        # (before the plain record: a marker written after it would come after it)
        assert await offsets_once(reader, topic, (0, 3)) == (0, 3)
        assert await backend.committed(consumed, 5) == 5
        assert await publisher.send(topic, b"k", b"plain", 0) == 3
        assert await reader.offsets(topic, 0) == (0, 4)

        # A newer writer of the id fences the old one: its commit writes nothing.
        b = await writer()
        with pytest.raises(Fenced):
            await commit(a, [rec(topic, b"zombie")], {(consumed, 0): 99})
        assert isinstance(a.broken, Fenced)
        assert await reader.offsets(topic, 0) == (0, 4)

        # A transaction left open: invisible, and it holds the stable end back.
        await backend.open_transaction(b, [rec(topic, b"open")])
        assert await reader.offsets(topic, 0) == (0, 4)
        assert await values(reader, topic) == [(0, b"a"), (1, b"b"), (3, b"plain")]
        # Its writer fenced meanwhile: the transaction is aborted (its marker at 5).
        c = await writer()
        assert await offsets_once(reader, topic, (0, 6)) == (0, 6)
        with pytest.raises(Fenced):
            await commit(b, [])
        assert await commit(c, [rec(topic, b"c")], {(consumed, 0): 6}) == [6]
        assert await backend.committed(consumed, 6) == 6

        # A follower added at the end reads only what is committed after.
        follower = clients.follower(topic)
        await follower.start()
        try:
            await follower.add(0)
            assert await commit(c, [rec(topic, b"d")]) == [8]
            assert await polled(follower, 1) == [(8, b"d")]
        finally:
            await follower.stop()

        assert await reader.offsets(topic, 0) == (0, 10)
        assert await values(reader, topic) == [
            (0, b"a"),
            (1, b"b"),
            (3, b"plain"),
            (6, b"c"),
            (8, b"d"),
        ]
        assert await values(reader, topic, 4) == [(6, b"c"), (8, b"d")]
    finally:
        for w in writers:
            await w.stop()
        await publisher.stop()
        await reader.stop()


async def test_the_operators_admin_calls_agree_with_the_broker(backend: Backend) -> None:
    """The `Admin` port's calls of the operators' tools (a rebuild, the read-only commands):
    topics found without creating any, a log's offsets (the high watermark counts an open
    transaction), records deleted, a group's members and committed offsets, set back."""
    topic = await backend.topic()
    clients = backend.clients
    admin = clients.admin()
    group = f"{topic}.group"
    missing = f"{topic}-missing"
    where = backend.bootstrap if isinstance(backend, KafkaBackend) else backend.log.cluster_id
    assert where in admin.where()
    assert await admin.existing_topics([topic, missing]) == {topic: 1}
    assert missing not in await admin.topic_names(), "asking created the topic"
    publisher, writer = clients.publisher(), clients.transactional_writer(f"{topic}.txn")
    await publisher.start()
    await writer.start()
    try:
        for value in (b"a", b"b", b"c"):
            await publisher.send(topic, b"k", value, 0)
        assert await admin.log_offsets(topic, 1) == {0: (0, 3)}
        await backend.open_transaction(writer, [rec(topic, b"open")])
        assert await admin.log_offsets(topic, 1) == {0: (0, 4)}
    finally:
        await writer.stop()
        await publisher.stop()
    fencer = clients.transactional_writer(f"{topic}.txn")
    await fencer.start()  # aborts the open transaction: its marker at 4
    await fencer.stop()
    assert await admin.log_offsets(topic, 1) == {0: (0, 5)}

    assert await admin.delete_records(topic, {0: 2}) == {0: 2}
    assert await admin.log_offsets(topic, 1) == {0: (2, 5)}
    async with clients.reader() as reader:
        assert await values(reader, topic) == [(2, b"c")]

    assert await admin.group_members(group) == 0
    assert await admin.committed_offsets(group, [(topic, 0)]) == {(topic, 0): None}
    await admin.reset_group_offsets(group, topic, 1, 2)
    assert await admin.committed_offsets(group, [(topic, 0)]) == {(topic, 0): 2}
    await admin.reset_group_offsets(group, topic, 1, 0)
    assert await admin.committed_offsets(group, [(topic, 0)]) == {(topic, 0): 0}
    assert await admin.group_members(group) == 0
