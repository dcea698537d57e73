"""The whole-partition readers (`LogReader`) on a real broker, aiokafka's and librdkafka's
(`KafkaClients(client="confluent")`), each held to the same contract: a read across
many batches returns every committed record once, in order, from any start; and each
failure (no such topic, the topic deleted after a read, no broker) ends in
`KafkaUnavailable`. The port's scenario with transactions (markers, aborted records, an
open transaction's stable end) runs on both in `tests/unit/test_kafka_contract_memory.py`."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from harness import kcat_produce

from app.errors import KafkaUnavailable
from app.kafka import Producer, Reader, ReaderClient
from app.kafka.rdkafka_reader import RdkafkaReader

TopicFactory = Callable[..., Awaitable[str]]
MakeReader = Callable[..., ReaderClient]

READERS: dict[str, MakeReader] = {"aiokafka": Reader, "confluent": RdkafkaReader}
each_reader = pytest.mark.parametrize("make", list(READERS.values()), ids=list(READERS))


def reader_of(make: MakeReader, bootstrap: str, **options: Any) -> ReaderClient:
    """A reader of small batches (a read of a few records takes several)."""
    return make(bootstrap, batch=2, **options)


async def written(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer(bootstrap)
    await producer.start()
    try:
        await producer.send_many([(topic, 0, b"k%d" % i, b"v%d" % i) for i in range(count)])
    finally:
        await producer.stop()


async def read(reader: ReaderClient, topic: str, start: int) -> list[tuple[int, bytes]]:
    return [(r.offset, r.value or b"") async for b in reader.read(topic, 0, start) for r in b]


@pytest.mark.kafka
@pytest.mark.kafka_next
@each_reader
async def test_a_read_returns_each_record_once_in_order_from_any_start(
    make: MakeReader, kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = await topic_factory(partitions=1)
    await written(kafka_bootstrap, topic, 7)
    async with reader_of(make, kafka_bootstrap) as reader:
        assert await reader.offsets(topic, 0) == (0, 7)
        assert await read(reader, topic, 0) == [(i, b"v%d" % i) for i in range(7)]
        assert await read(reader, topic, 5) == [(5, b"v5"), (6, b"v6")]
        assert await read(reader, topic, 7) == []  # at the end: nothing, at once
        # a read left half way (a restore that failed) leaves the reader to read again
        async for _ in reader.read(topic, 0, 0):
            break
        assert await read(reader, topic, 3) == [(i, b"v%d" % i) for i in range(3, 7)]


@pytest.mark.kafka
@pytest.mark.kafka_next
@each_reader
async def test_a_header_key_that_is_not_utf8_is_read_past(
    make: MakeReader, kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    """aiokafka's reader gives the key as Java's clients do (the replacement character);
    librdkafka's Python client cannot give it, so that record is read without headers."""
    topic = await topic_factory(partitions=1)
    await written(kafka_bootstrap, topic, 1)
    kcat_produce(kafka_bootstrap, topic, 0, b"bad", b"v1")
    await written(kafka_bootstrap, topic, 1)
    async with reader_of(make, kafka_bootstrap) as reader:
        got = [r async for b in reader.read(topic, 0, 0) for r in b]
    assert [(r.offset, r.value) for r in got] == [(0, b"v0"), (1, b"v1"), (2, b"v0")]
    lenient = (("\ufffd\ufffd", b"team-a"),) if make is Reader else ()
    assert [r.headers for r in got] == [(), lenient, ()]


@pytest.mark.kafka
@pytest.mark.kafka_next
@each_reader
async def test_no_such_topic_is_unavailable(make: MakeReader, kafka_bootstrap: str) -> None:
    async with reader_of(make, kafka_bootstrap, **_short(make)) as reader:
        with pytest.raises(KafkaUnavailable, match=r"nosuchtopic\[0\]"):
            await reader.offsets("nosuchtopic", 0)
        with pytest.raises(KafkaUnavailable, match=r"nosuchtopic\[0\]"):
            await read(reader, "nosuchtopic", 0)


@pytest.mark.kafka
@pytest.mark.kafka_next
@each_reader
async def test_a_topic_deleted_after_a_read_is_unavailable(
    make: MakeReader, kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = await topic_factory(partitions=1)
    await written(kafka_bootstrap, topic, 50)
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        async with reader_of(make, kafka_bootstrap, **_short(make)) as reader:
            assert len(await read(reader, topic, 0)) == 50  # the reader knows the topic
            await admin.delete_topics([topic])
            await asyncio.sleep(1)  # the deletion reaches the broker's metadata
            with pytest.raises(KafkaUnavailable, match=rf"{topic}\[0\]"):
                await read(reader, topic, 0)
    finally:
        await admin.close()


@pytest.mark.kafka
@pytest.mark.kafka_next
@each_reader
async def test_no_broker_is_unavailable(make: MakeReader) -> None:
    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        where = f"127.0.0.1:{closed.getsockname()[1]}"
        reader = reader_of(make, where, **_short(make))
        with pytest.raises(KafkaUnavailable):
            await reader.start()
            await reader.offsets("t", 0)
        await reader.stop()


def _short(make: MakeReader) -> dict[str, Any]:
    """Either reader given up after 3 s without an answer (aiokafka's default waits 40 s
    for a missing topic's metadata, twice)."""
    return {"timeout": 3.0}
