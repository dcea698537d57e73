"""Producers on a real broker leave no failed future or task of aiokafka's behind
unretrieved (which the event loop would only log, at collection): a transactional
producer fenced (a newer producer of its transactional id started) says `Fenced` and is
broken for good, aiokafka's and librdkafka's alike; the plain producer's refused sends are
all retrieved."""

from __future__ import annotations

import asyncio
import gc
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from writer_kinds import MakeWriter, each_writer

from app.errors import Fenced, KafkaUnavailable
from app.kafka import OutRecord, Producer

pytestmark = [pytest.mark.kafka, pytest.mark.kafka_next]

TopicFactory = Callable[..., Awaitable[str]]


@pytest.fixture
async def unretrieved() -> AsyncIterator[list[dict[str, Any]]]:
    """What reaches the event loop's exception handler (a future or task whose exception
    nobody retrieved, among others)."""
    loop = asyncio.get_running_loop()
    got: list[dict[str, Any]] = []
    before = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: got.append(context))
    yield got
    loop.set_exception_handler(before)


@each_writer
@pytest.mark.parametrize("records", [1, 0], ids=["with records", "offsets only"])
async def test_a_fenced_producer_says_so_and_leaves_nothing_unretrieved(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    unretrieved: list[dict[str, Any]],
    records: int,
    make: MakeWriter,
) -> None:
    topic = await topic_factory(partitions=1)
    tid = f"fenced-{uuid.uuid4().hex[:8]}"
    old = make(kafka_bootstrap, tid)
    await old.start()
    await old.commit([(topic, 0, b"k", b"v0")], {(topic, 0): 1}, "g")
    new = make(kafka_bootstrap, tid)
    await new.start()  # fences the old one
    try:
        batch: list[OutRecord] = [(topic, 0, b"k", b"v1")] * records
        with pytest.raises(Fenced):
            await old.commit(batch, {(topic, 0): 2}, "g")
        assert isinstance(old.broken, Fenced)
        with pytest.raises(Fenced):
            await old.commit([], {(topic, 0): 3}, "g")
        await old.stop()
        del old
        for _ in range(3):
            gc.collect()
            await asyncio.sleep(0)
        assert unretrieved == []
        assert await new.commit([(topic, 0, b"k", b"v2")], {(topic, 0): 2}, "g") != []
    finally:
        await new.stop()


async def test_a_refused_send_of_the_plain_producer_leaves_nothing_unretrieved(
    kafka_bootstrap: str, topic_factory: TopicFactory, unretrieved: list[dict[str, Any]]
) -> None:
    """Two records the broker refuses (over the topic's `max.message.bytes`), in two
    partitions: `send_many` says so (KafkaUnavailable) from the first, and the second's
    failure is retrieved too, not left for the event loop to log at collection."""
    topic = await topic_factory(partitions=2, configs={"max.message.bytes": "1024"})
    producer = Producer(kafka_bootstrap)
    await producer.start()
    try:
        with pytest.raises(KafkaUnavailable):
            await producer.send_many([(topic, p, b"k", bytes(4096)) for p in (0, 1)])
    finally:
        await producer.stop()
    del producer
    for _ in range(3):
        gc.collect()
        await asyncio.sleep(0)
    assert unretrieved == []
