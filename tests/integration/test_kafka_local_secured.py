"""The local broker secured (SASL_SSL: TLS, SCRAM users, ACLs) and as a three-node cluster.

Brokers of their own (``scripts/kafka_local.py``), not the session's PLAINTEXT one: the
``kafka_secured`` and ``kafka_cluster`` fixtures (tests/conftest.py) start each once per
session, when a test asks for it (tests/kafka_broker.py's ``secured_kafka`` and
``kafka_cluster``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import kafka_broker  # registered by tests/conftest.py
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.conn import create_conn
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
)

pytestmark = pytest.mark.kafka

script = kafka_broker.load_kafka_local()


async def _produce(client: dict[str, Any], topic: str, value: bytes) -> None:
    producer = AIOKafkaProducer(acks="all", request_timeout_ms=20_000, **client)
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, partition=0)
    finally:
        await producer.stop()


async def _read(client: dict[str, Any], topic: str, count: int) -> list[bytes]:
    consumer = AIOKafkaConsumer(enable_auto_commit=False, **client)
    await consumer.start()
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        await consumer.seek_to_beginning(partition)
        values: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(values) < count and time.monotonic() < deadline:
            batch = await consumer.getmany(partition, timeout_ms=1_000)
            values += [record.value for record in batch.get(partition, []) if record.value]
        return values
    finally:
        await consumer.stop()


def _env_of(
    broker: kafka_broker.SecuredKafka, user: str, capsys: pytest.CaptureFixture[str]
) -> dict[str, str]:
    """What ``kafka-local env --user USER`` prints for a client, as a dict (after it: the
    lines for Kafka's kafka-acls.sh)."""
    capsys.readouterr()
    assert script.main(["env", "--dir", str(broker.state_dir), "--user", user]) == 0
    lines = capsys.readouterr().out.splitlines()
    state = broker.state_dir
    assert lines[-2:] == [
        f'export PATH={state / "bin"}:"$PATH"',
        f"export KAFKA_ADMIN_PROPERTIES={state / 'admin.properties'}",
    ]
    assert (state / "bin" / "kafka-acls.sh").is_file()
    assert all(line.startswith("export KAFKA_") for line in lines[:-2])
    return dict(line.removeprefix("export ").split("=", 1) for line in lines[:-2])


@pytest.mark.kafka_secured
async def test_sasl_ssl_authenticates_every_client_and_enforces_acls(
    kafka_secured: kafka_broker.SecuredKafka, capsys: pytest.CaptureFixture[str]
) -> None:
    broker = kafka_secured
    admin_env = _env_of(broker, "admin", capsys)
    assert admin_env == broker.env("admin")
    assert admin_env["KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert admin_env["KAFKA_SASL_MECHANISM"] == "SCRAM-SHA-512"
    assert admin_env["KAFKA_SASL_USERNAME"] == "admin"
    app_env = _env_of(broker, "tickwheel", capsys)
    assert app_env["KAFKA_SASL_USERNAME"] == "tickwheel"
    assert app_env["KAFKA_SASL_PASSWORD_FILE"] != admin_env["KAFKA_SASL_PASSWORD_FILE"]
    admin = kafka_broker.client_kwargs(admin_env)
    app = kafka_broker.client_kwargs(app_env)

    # The super user creates a topic, writes and reads a record over SASL_SSL.
    topic = kafka_broker.unique_topic("secured")
    await kafka_broker.create_topics_with(admin, [topic])
    await _produce(admin, topic, b"from-admin")
    assert await _read(admin, topic, 1) == [b"from-admin"]

    # A wrong password is an authentication error, not a silent retry loop.
    host, port = broker.bootstrap.rsplit(":", 1)
    wrong = {**admin, "sasl_plain_password": "not-the-password"}
    wrong.pop("bootstrap_servers")
    with pytest.raises(SaslAuthenticationFailed):
        await create_conn(host, int(port), request_timeout_ms=10_000, **wrong)
    producer = AIOKafkaProducer(**{**admin, "sasl_plain_password": "not-the-password"})
    with pytest.raises(KafkaConnectionError):
        await producer.start()
    await producer.stop()
    with pytest.raises(script.AuthenticationFailed):
        auth = broker.broker.client_auth("admin")
        script.broker_ids(broker.bootstrap, auth=type(auth)(**{**vars(auth), "password": "x"}))

    # tickwheel authenticates but has no ACL: refused, until it is granted exactly some.
    with pytest.raises(TopicAuthorizationFailedError):
        await _produce(app, topic, b"from-tickwheel")
    await asyncio.to_thread(broker.grant, "topic", topic, ["write", "describe"])
    await _produce(app, topic, b"from-tickwheel")
    with pytest.raises(TopicAuthorizationFailedError):
        await _read(app, topic, 2)  # no READ yet
    await asyncio.to_thread(broker.grant, "topic", topic, ["read"])
    assert await _read(app, topic, 2) == [b"from-admin", b"from-tickwheel"]
    other = kafka_broker.unique_topic("secured-other")
    await kafka_broker.create_topics_with(admin, [other])
    with pytest.raises(TopicAuthorizationFailedError):
        await _produce(app, other, b"elsewhere")  # the grant was for that topic only


async def _leader_other_than(
    client: dict[str, Any], topic: str, gone: int, seconds: float
) -> tuple[int, list[int]]:
    deadline = time.monotonic() + seconds
    while True:
        with contextlib.suppress(KafkaError, OSError):
            leader, isr = await kafka_broker.partition_state(client, topic)
            if leader not in (-1, gone):
                return leader, isr
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no leader other than node {gone} after {seconds:.0f} s")
        await asyncio.sleep(0.2)


async def _in_sync(client: dict[str, Any], topic: str, replicas: int, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while True:
        with contextlib.suppress(KafkaError, OSError):
            _, isr = await kafka_broker.partition_state(client, topic)
            if len(isr) == replicas:
                return isr
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{topic} not back to {replicas} in-sync replicas")
        await asyncio.sleep(0.2)


@pytest.mark.kafka_cluster
async def test_a_three_node_cluster_survives_its_leader_killed(
    kafka_cluster: kafka_broker.KafkaCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = kafka_cluster
    assert cluster.bootstrap.count(",") == 2 and cluster.running_nodes() == [1, 2, 3]
    client = cluster.client_kwargs()
    topic = kafka_broker.unique_topic("replicated")
    await kafka_broker.create_topics_with(client, [topic], partitions=1, replication=3)
    await _produce(client, topic, b"before")
    leader, isr = await kafka_broker.partition_state(client, topic)
    assert sorted(isr) == [1, 2, 3]
    state = str(cluster.state_dir)
    killed = False
    try:
        began = time.monotonic()
        assert (
            await asyncio.to_thread(script.main, ["kill", "--dir", state, "--node", str(leader)])
            == 0
        )
        killed = True
        assert f"node {leader} killed" in capsys.readouterr().out
        assert leader not in cluster.running_nodes()
        capsys.readouterr()
        assert script.main(["status", "--dir", state]) == 1
        out = capsys.readouterr().out
        assert out.startswith("degraded ") and f"node {leader} stopped" in out

        new_leader, new_isr = await _leader_other_than(client, topic, leader, 60)
        failover_s = time.monotonic() - began
        assert leader not in new_isr
        assert await _read(client, topic, 1) == [b"before"]
        await _produce(client, topic, b"after")  # acks=all: 2 in sync >= min.insync.replicas

        began = time.monotonic()
        assert (
            await asyncio.to_thread(script.main, ["start", "--dir", state, "--node", str(leader)])
            == 0
        )
        killed = False
        restart_s = time.monotonic() - began
        assert sorted(await _in_sync(client, topic, 3, 60)) == [1, 2, 3]
        assert await _read(client, topic, 2) == [b"before", b"after"]
        capsys.readouterr()
        assert script.main(["status", "--dir", state]) == 0
        assert capsys.readouterr().out.startswith("running ")
        assert failover_s < 45 and restart_s < 45, (failover_s, restart_s, new_leader)
    finally:
        if killed:  # the cluster is the session's: bring the node back for the next test
            await asyncio.to_thread(cluster.start_node, leader)
