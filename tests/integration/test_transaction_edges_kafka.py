"""A partition's transaction at two edges of aiokafka's, on a real broker.

- A topic created after the producer started (a node's first fire writes the events and
  commands topics its producer never wrote): aiokafka's client then asks the broker only
  for the topics it follows, and forgot one it knew from its bootstrap but never
  followed; a batch queued to that one waited 40 s and failed without a leader, and the
  transaction committed without it. Every topic written is followed before its records
  are queued: the transaction commits, all of it.
- A send the broker refuses (a record over its topic's limit): aiokafka commits the
  transaction without it, beside the offsets of the input it came from. The commit is
  aborted instead: nothing of the transaction is read, no offset moves, and the producer
  is broken (its partition is taken afresh).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from app.errors import KafkaUnavailable
from app.kafka import OutRecord, TransactionalProducer
from app.kafka.connection import client_options
from app.kafka.consumers import read_partitions

pytestmark = [pytest.mark.kafka, pytest.mark.kafka_next]

TopicFactory = Callable[..., Awaitable[str]]


async def _committed(bootstrap: str, topic: str) -> list[bytes | None]:
    """The committed records' values of `topic`'s partition 0 (a read_committed reader)."""
    return [r.value async for batch in read_partitions(bootstrap, topic, [0]) for r in batch]


async def _group_offset(bootstrap: str, group: str, topic: str) -> int | None:
    admin = AIOKafkaAdminClient(**client_options(bootstrap))
    await admin.start()
    try:
        got = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    meta = got.get(TopicPartition(topic, 0))
    return None if meta is None or meta.offset < 0 else meta.offset


async def test_a_topic_new_to_the_producer_leaves_the_others_it_writes_known(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    known = await topic_factory(partitions=1)
    producer = TransactionalProducer(kafka_bootstrap, f"edges-{uuid.uuid4().hex[:8]}")
    await producer.start()
    try:
        await producer.commit([(known, 0, b"k", b"before")], {}, "")
        later = [await topic_factory(partitions=1) for _ in range(2)]  # unknown to it
        records: list[OutRecord] = [
            (known, 0, b"k", b"first"),
            (later[0], 0, b"k", b"second"),
            (later[1], 0, b"k", b"third"),
        ]
        # Before: 40 s, then NotLeaderForPartition for `known`'s batch, after the commit.
        offsets = await asyncio.wait_for(producer.commit(records, {}, ""), 30)
        assert offsets[1:] == [0, 0]  # the first records of the later topics
        # And the producer goes on writing all of them.
        await producer.commit([(t, 0, b"k", b"again") for t in (known, *later)], {}, "")
    finally:
        await producer.stop()
    assert await _committed(kafka_bootstrap, known) == [b"before", b"first", b"again"]
    for topic, value in zip(later, (b"second", b"third"), strict=True):
        assert await _committed(kafka_bootstrap, topic) == [value, b"again"]


async def test_a_refused_send_aborts_its_transaction_and_moves_no_offset(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    small = await topic_factory(partitions=1, configs={"max.message.bytes": str(64 * 1024)})
    events = await topic_factory(partitions=1)
    source = await topic_factory(partitions=1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    producer = TransactionalProducer(kafka_bootstrap, f"edges-{uuid.uuid4().hex[:8]}")
    await producer.start()
    try:
        await producer.commit([(events, 0, b"k", b"kept")], {(source, 0): 1}, group)
        records: list[OutRecord] = [
            (events, 0, b"k", b"lost?"),
            (small, 0, b"k", bytes(256 * 1024)),  # over the topic's limit: refused
        ]
        with pytest.raises(KafkaUnavailable):
            await producer.commit(records, {(source, 0): 2}, group)
        # Before: "lost?" and the offset 2 were committed, the refused record left out.
        assert await _committed(kafka_bootstrap, events) == [b"kept"]
        assert await _committed(kafka_bootstrap, small) == []
        assert await _group_offset(kafka_bootstrap, group, source) == 1
        assert producer.broken is not None
        with pytest.raises(KafkaUnavailable):  # broken for good
            await producer.commit([(events, 0, b"k", b"after")], {}, group)
    finally:
        await producer.stop()
