"""A partition's transaction against a topic whose `max.message.bytes` is below the
producer's 512 KiB batches, on a real broker: with the default batch size every commit
fails (the broker refuses the batch, aiokafka neither splits nor retries it); with the
batch size the topic's limit gives (`transaction_batch_bytes`), it commits."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

import pytest

from app.errors import KafkaUnavailable
from app.kafka import OutRecord, TransactionalProducer
from app.kafka.clients import KafkaAdmin
from app.kafka.producers import transaction_batch_bytes

pytestmark = pytest.mark.kafka

TopicFactory = Callable[..., Awaitable[str]]
LIMIT = 64 * 1024


async def _commit(bootstrap: str, records: list[OutRecord], batch: int | None) -> list[int]:
    tid = f"batch-{uuid.uuid4().hex[:8]}"
    producer = (
        TransactionalProducer(bootstrap, tid)
        if batch is None
        else TransactionalProducer(bootstrap, tid, max_batch_bytes=batch)
    )
    await producer.start()
    try:
        return await producer.commit(records, {}, "g")
    finally:
        await producer.stop()


async def test_a_transaction_commits_under_a_topics_smaller_limit(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = await topic_factory(configs={"max.message.bytes": str(LIMIT)})
    takes = await KafkaAdmin(kafka_bootstrap).max_message_bytes(topic)
    assert takes == LIMIT
    # 256 records of 1 KiB to one partition: 4 times what one batch of the topic may hold.
    records: list[OutRecord] = [(topic, 0, b"k%d" % i, bytes(1024)) for i in range(256)]
    with pytest.raises(KafkaUnavailable):
        await _commit(kafka_bootstrap, records, None)  # 512 KiB batches: refused
    offsets = await _commit(kafka_bootstrap, records, transaction_batch_bytes([takes]))
    assert len(offsets) == 256 and offsets == sorted(offsets)
