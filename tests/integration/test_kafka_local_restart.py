"""A local broker keeps its topics and records across a restart, on the same address.

Starts a broker of its own (``scripts/kafka_local.py`` in a tmp dir), not the session's.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import kafka_broker  # registered by tests/conftest.py
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

pytestmark = pytest.mark.kafka

script = kafka_broker.load_kafka_local()


async def _write(bootstrap: str, topic: str) -> None:
    await kafka_broker.create_topics(bootstrap, [topic], partitions=2)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"kept", key=b"order-1", partition=1)
    finally:
        await producer.stop()


async def _read(bootstrap: str, topic: str) -> tuple[set[str], list[tuple[bytes, bytes]]]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        topics = set(await admin.list_topics())
    finally:
        await admin.close()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        partition = TopicPartition(topic, 1)
        consumer.assign([partition])
        await consumer.seek_to_beginning(partition)
        records = await asyncio.wait_for(consumer.getmany(partition, timeout_ms=20_000), 30)
        return topics, [(r.key, r.value) for r in records.get(partition, [])]
    finally:
        await consumer.stop()


@pytest.mark.kafka_next
async def test_a_restarted_broker_keeps_its_data_and_address(tmp_path: Path) -> None:
    state = tmp_path / "kafka"
    topic = kafka_broker.unique_topic("kept")
    broker = await asyncio.to_thread(script.start, state, fresh=True)
    try:
        first, cluster, old_pid = broker.bootstrap, broker.cluster_id, broker.pid
        assert not broker.kept and cluster
        await _write(first, topic)
        began = time.monotonic()
        broker = await asyncio.to_thread(script.restart, state)
        restart_s = time.monotonic() - began
        assert broker.bootstrap == first
        assert broker.pid != old_pid
        assert broker.kept and broker.cluster_id == cluster == script.formatted_cluster_id(state)
        assert json.loads((state / "cluster.json").read_text())["port"] == int(first.split(":")[1])
        topics, records = await _read(broker.bootstrap, topic)
        assert topic in topics
        assert records == [(b"order-1", b"kept")]
        assert restart_s < 60
    finally:
        await asyncio.to_thread(broker.stop)
    assert script.status(state).running is False
