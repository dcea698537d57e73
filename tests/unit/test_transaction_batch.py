"""A partition's transactional producer batches no more per partition than the smallest
`max.message.bytes` of the topics it writes takes (aiokafka never splits a batch, and a
broker's MESSAGE_SIZE_TOO_LARGE is not retried: one batch too large would fail every
commit of the partition for good), and never more than 512 KiB."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import RunningNode, wait_until
from hypothesis import given
from hypothesis import strategies as st
from test_node_memory import PARTITIONS, SERVICE, TOPICS

from app.kafka import TopicSpec, TransactionalProducer
from app.kafka.memory import MemoryLog
from app.kafka.memory_clients import MemoryWriter
from app.kafka.producers import (
    BATCH_HEADER_MARGIN,
    TRANSACTION_BATCH_BYTES,
    transaction_batch_bytes,
)
from app.protocol.topics import ContextTopics

KIB = 1024


@pytest.mark.parametrize(
    ("limits", "batch"),
    [
        ([], 512 * KIB),  # nothing described: the default
        ([1_048_588], 512 * KIB),  # Kafka's default topic limit
        ([4 * 1024 * KIB, 1_048_588], 512 * KIB),
        ([512 * KIB], 512 * KIB - BATCH_HEADER_MARGIN),
        ([1_048_588, 256 * KIB, 1_048_588], 256 * KIB - BATCH_HEADER_MARGIN),
        ([100 * KIB], 100 * KIB - BATCH_HEADER_MARGIN),
        ([BATCH_HEADER_MARGIN], 1),  # one record a batch (as large as the topic takes)
        ([10], 1),
    ],
)
def test_the_batch_size_as_the_topics_take_it(limits: list[int], batch: int) -> None:
    assert transaction_batch_bytes(limits) == batch


@given(st.lists(st.integers(min_value=1, max_value=64 * 1024 * KIB), max_size=8))
def test_a_batch_never_exceeds_a_topics_limit_less_the_margin_nor_512_kib(
    limits: list[int],
) -> None:
    batch = transaction_batch_bytes(limits)
    assert 1 <= batch <= TRANSACTION_BATCH_BYTES
    for limit in limits:
        assert batch <= max(1, limit - BATCH_HEADER_MARGIN)
    if all(limit - BATCH_HEADER_MARGIN >= TRANSACTION_BATCH_BYTES for limit in limits):
        assert batch == TRANSACTION_BATCH_BYTES


async def test_the_producer_batches_as_told() -> None:
    producer = TransactionalProducer("localhost:9", "t.0", max_batch_bytes=100 * KIB)
    default = TransactionalProducer("localhost:9", "t.1")
    try:
        assert producer._producer._message_accumulator._batch_size == 100 * KIB
        assert default._producer._message_accumulator._batch_size == TRANSACTION_BATCH_BYTES
    finally:
        await producer.stop()  # never started: closes it, no connection made
        await default.stop()


@pytest.mark.parametrize(
    ("topic", "limit", "batch"),
    [
        (None, None, TRANSACTION_BATCH_BYTES),
        (TOPICS.events, 200_000, 200_000 - BATCH_HEADER_MARGIN),
        (TOPICS.timers_changelog, 300 * KIB, 300 * KIB - BATCH_HEADER_MARGIN),
        (ContextTopics(TOPICS.context).results, 64 * KIB, 64 * KIB - BATCH_HEADER_MARGIN),
        (TOPICS.commands, 2 * 1024 * KIB, TRANSACTION_BATCH_BYTES),
    ],
)
async def test_a_partitions_producer_opens_with_the_batch_its_topics_take(
    tmp_path: Path, topic: str | None, limit: int | None, batch: int
) -> None:
    """A topic the partition's transaction writes was made (by its operator) with a lower
    `max.message.bytes`: the node reads it when it starts, and each partition's producer
    batches under it."""
    log = MemoryLog()
    if topic is not None:
        partitions = 1 if topic == ContextTopics(TOPICS.context).dead_letters else PARTITIONS
        log.ensure_topics([TopicSpec(topic, partitions, max_message_bytes=limit)])
    n = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(n.runs)
        kept = n.node.types[TOPICS.type_name]
        for p in range(PARTITIONS):
            txn = kept.transactions.of(p)
            writer = txn.producer
            assert isinstance(writer, MemoryWriter)
            assert writer.max_batch_bytes == batch
    finally:
        await n.stop()
