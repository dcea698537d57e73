"""The session's broker is real Apache Kafka: keyed partitioning, groups and transactions."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.partitioner import murmur2
from aiokafka.structs import OffsetAndMetadata

from app.errors import KafkaUnavailable
from app.kafka import TopicSpec, ensure_topics

pytestmark = [pytest.mark.kafka, pytest.mark.kafka_next]

TopicFactory = Callable[..., Awaitable[str]]
Record = tuple[int, bytes | None, bytes | None]  # partition, key, value


async def _collect(consumer: AIOKafkaConsumer, count: int, within_s: float = 60.0) -> list[Record]:
    """Poll until ``count`` records came, then once more to catch any extra ones."""
    out: list[Record] = []

    async def poll(timeout_ms: int) -> None:
        for tp, records in (await consumer.getmany(timeout_ms=timeout_ms)).items():
            out.extend((tp.partition, r.key, r.value) for r in records)

    async with asyncio.timeout(within_s):
        while len(out) < count:
            await poll(500)
    await poll(300)
    return out


def _consumer(bootstrap: str, topic: str, **options: object) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **options,
    )


async def test_keyed_records_round_trip_on_four_partitions(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = await topic_factory(partitions=4)
    keys = [f"order-{i}".encode() for i in range(24)]
    sent: dict[bytes, list[bytes]] = defaultdict(list)
    placed: dict[bytes, set[int]] = defaultdict(set)

    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        for seq in range(5):
            for key in keys:
                value = f"{key.decode()}#{seq}".encode()
                meta = await producer.send_and_wait(topic, value, key=key)
                sent[key].append(value)
                placed[key].add(meta.partition)
    finally:
        await producer.stop()

    # The Java client's partitioner, which every producer in any language must agree with.
    for key, parts in placed.items():
        assert parts == {(murmur2(key) & 0x7FFFFFFF) % 4}
    assert set().union(*placed.values()) == {0, 1, 2, 3}

    consumer = _consumer(kafka_bootstrap, topic, group_id=f"g-{uuid.uuid4().hex}")
    await consumer.start()
    try:
        got = await _collect(consumer, len(keys) * 5)
        await consumer.commit()
        committed = [await consumer.committed(tp) for tp in consumer.assignment()]
    finally:
        await consumer.stop()

    received: dict[bytes, list[bytes]] = defaultdict(list)
    for partition, got_key, got_value in got:
        assert got_key is not None and got_value is not None
        assert {partition} == placed[got_key]
        received[got_key].append(got_value)
    assert received == sent  # every record exactly once, in order per key
    assert sum(offset or 0 for offset in committed) == len(keys) * 5


async def test_read_committed_sees_committed_transactions_only(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = await topic_factory(partitions=2)
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap,
        transactional_id=f"tx-{uuid.uuid4().hex}",
        enable_idempotence=True,
        acks="all",
    )
    await producer.start()
    try:
        async with producer.transaction():
            for i in range(5):
                await producer.send(topic, f"c{i}".encode(), key=f"k{i % 2}".encode())
        await producer.begin_transaction()
        for i in range(5):
            await producer.send(topic, f"a{i}".encode(), key=f"k{i % 2}".encode())
        await producer.abort_transaction()
        async with producer.transaction():  # both keys again, after the aborted records
            for i in range(5, 10):
                await producer.send(topic, f"c{i}".encode(), key=f"k{i % 2}".encode())
    finally:
        await producer.stop()

    committed_only = [f"c{i}".encode() for i in range(10)]
    aborted = [f"a{i}".encode() for i in range(5)]

    consumer = _consumer(kafka_bootstrap, topic, isolation_level="read_committed")
    await consumer.start()
    try:
        seen = [value for _, _, value in await _collect(consumer, len(committed_only))]
    finally:
        await consumer.stop()
    assert sorted(v or b"" for v in seen) == sorted(committed_only)
    for parity in (0, 1):  # in order within each key
        mine = [int((v or b"c-1")[1:]) for v in seen if int((v or b"c-1")[1:]) % 2 == parity]
        assert mine == sorted(mine)

    consumer = _consumer(kafka_bootstrap, topic, isolation_level="read_uncommitted")
    await consumer.start()
    try:
        raw = [value for _, _, value in await _collect(consumer, 15)]
    finally:
        await consumer.stop()
    assert sorted(v or b"" for v in raw) == sorted(committed_only + aborted)


async def test_consume_transform_produce_is_exactly_once(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    source = await topic_factory(partitions=1, prefix="src")
    sink = await topic_factory(partitions=1, prefix="sink")
    group = f"g-{uuid.uuid4().hex}"
    tp = TopicPartition(source, 0)

    seed = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await seed.start()
    try:
        for i in range(6):
            await seed.send_and_wait(source, str(i).encode(), key=b"k")
    finally:
        await seed.stop()

    consumer = _consumer(kafka_bootstrap, source, group_id=group)
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap,
        transactional_id=f"tx-{uuid.uuid4().hex}",
        enable_idempotence=True,
    )
    await consumer.start()
    await producer.start()
    try:
        # A first pass is aborted (as if the node died before committing) and replayed.
        first = (await consumer.getmany(tp, timeout_ms=10_000)).get(tp, [])
        assert first
        await producer.begin_transaction()
        for r in first:
            await producer.send(sink, (r.value or b"") + b"!", key=r.key)
        await producer.send_offsets_to_transaction(
            {tp: OffsetAndMetadata(first[-1].offset + 1, "")}, group
        )
        await producer.abort_transaction()
        consumer.seek(tp, 0)

        done = 0
        async with asyncio.timeout(60):
            while done < 6:
                records = (await consumer.getmany(tp, timeout_ms=500)).get(tp, [])
                if not records:
                    continue
                async with producer.transaction():
                    for r in records:
                        await producer.send(sink, (r.value or b"") + b"!", key=r.key)
                    await producer.send_offsets_to_transaction(
                        {tp: OffsetAndMetadata(records[-1].offset + 1, "")}, group
                    )
                done = records[-1].offset + 1
            # The offsets become visible once the commit markers are written.
            while (offset := await consumer.committed(tp)) != 6:
                assert offset is None or offset <= 6
                await asyncio.sleep(0.05)
    finally:
        await producer.stop()
        await consumer.stop()

    reader = _consumer(kafka_bootstrap, sink, isolation_level="read_committed")
    await reader.start()
    try:
        out = [value for _, _, value in await _collect(reader, 6)]
    finally:
        await reader.stop()
    assert out == [f"{i}!".encode() for i in range(6)]


async def test_the_cluster_id_is_the_brokers_own_and_stable(kafka_bootstrap: str) -> None:
    """What a node's data directory is marked with (app.node.local_state)."""
    from app.errors import KafkaUnavailable
    from app.kafka import cluster_id

    first = await cluster_id(kafka_bootstrap)
    assert first and first == await cluster_id(kafka_bootstrap)
    with pytest.raises(KafkaUnavailable):
        await cluster_id("127.0.0.1:1")


async def test_a_compacted_table_found_with_a_deleting_policy_stops_the_start(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    """Made beforehand with the broker's default policy (delete after 7 days), a timer
    changelog would lose its rows quietly: the node refuses it at its start, and takes one
    made compacted, or made by a node (compact,delete, retentions -1)."""
    deleting = await topic_factory(2, configs={"cleanup.policy": "delete"})
    compacted = await topic_factory(2, configs={"cleanup.policy": "compact"})
    made = f"{compacted}.made"
    specs = [TopicSpec(compacted, 2, compacted=True), TopicSpec(made, 2, compacted=True)]
    await ensure_topics(kafka_bootstrap, specs)  # the second made here, as a node does
    await ensure_topics(kafka_bootstrap, specs)  # and found
    with pytest.raises(KafkaUnavailable, match=rf"{deleting} has cleanup\.policy=delete"):
        await ensure_topics(kafka_bootstrap, [TopicSpec(deleting, 2, compacted=True)])


async def test_a_log_found_dropping_records_is_warned_about_and_one_made_is_not(
    kafka_bootstrap: str, topic_factory: TopicFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """An aggregate's log made beforehand with the broker's default retention (7 days)
    loses its events for every node that folds it again: said at the start, not refused
    (the log is its team's). One the node makes keeps every record: nothing said."""
    found = await topic_factory(2, configs={"cleanup.policy": "delete"})
    made = f"{found}.made"
    specs = [TopicSpec(found, 2, retained=True), TopicSpec(made, 2, retained=True)]
    await ensure_topics(kafka_bootstrap, specs)  # the second made here, as a node does
    with caplog.at_level(logging.WARNING, logger="app.kafka.topic_policy"):
        await ensure_topics(kafka_bootstrap, specs)  # and both found
    assert f"the log {found} has cleanup.policy=delete, retention.ms=604800000" in caplog.text
    assert f"the log {made} has" not in caplog.text
