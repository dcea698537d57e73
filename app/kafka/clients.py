"""The ports' factory over aiokafka: one cluster's clients from its bootstrap address.

`client="confluent"` makes the transactional writers and the readers over librdkafka
instead (`app.kafka.rdkafka_writer`, `app.kafka.rdkafka_reader`, the `confluent` extra);
every other client stays aiokafka's.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Sequence
from typing import Literal, get_args

from app.kafka import admin as kafka_admin
from app.kafka import group_admin
from app.kafka.admin import cluster_id, ensure_topics, max_message_bytes, topic_names
from app.kafka.connection import Connectable, address
from app.kafka.consumers import Reader
from app.kafka.group_consumer import GroupConsumer
from app.kafka.partition_reader import PartitionReader
from app.kafka.ports import Assigned, DeletedUnread, ReaderClient, TransactionalWriter
from app.kafka.probe import api_versions_probe, check_access
from app.kafka.producer_loop import OwnLoopProducer
from app.kafka.producers import TRANSACTION_BATCH_BYTES, Producer
from app.kafka.records import Replication, TopicConfigs, TopicSpec
from app.kafka.replication import read_replicas
from app.kafka.topic_policy import read_topic_configs
from app.kafka.transactional_producer import TransactionalProducer

__all__ = ["KafkaAdmin", "KafkaClient", "KafkaClients"]

KafkaClient = Literal["aiokafka", "confluent"]
"""Which library writes a partition's transactions: aiokafka (the default) or librdkafka
(confluent-kafka, the `confluent` extra)."""


class KafkaAdmin:
    """`app.kafka.ports.Admin` on a Kafka cluster."""

    def __init__(
        self,
        bootstrap: Connectable,
        probe_timeout: float = 2.0,
        replication: Replication | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self._probe_timeout = probe_timeout
        self._replication = replication

    async def ensure_topics(self, specs: Iterable[TopicSpec]) -> None:
        await ensure_topics(self.bootstrap, specs, self._replication)

    async def cluster_id(self) -> str:
        return await cluster_id(self.bootstrap)

    async def max_message_bytes(self, topic: str) -> int:
        return await max_message_bytes(self.bootstrap, topic)

    async def topic_names(self) -> set[str]:
        return await topic_names(self.bootstrap)

    async def topic_configs(self, topics: Sequence[str], names: Sequence[str]) -> TopicConfigs:
        return await read_topic_configs(self.bootstrap, topics, names)

    async def replicas(self, topics: Sequence[str]) -> tuple[int, dict[str, int]]:
        return await read_replicas(self.bootstrap, topics)

    async def probe(self) -> str | None:
        return await api_versions_probe(self.bootstrap, self._probe_timeout)

    async def check_access(self) -> None:
        await check_access(self.bootstrap)

    # The operators' calls: looked up in `app.kafka.admin` (and `app.kafka.group_admin`)
    # when called, so that a test standing in for one there (a read-only command creates
    # nothing) stands in here too.

    def where(self) -> str:
        return address(self.bootstrap)

    async def existing_topics(self, names: Iterable[str]) -> dict[str, int]:
        return await kafka_admin.existing_topics(self.bootstrap, names)

    async def group_members(self, group_id: str) -> int:
        return await group_admin.group_members(self.bootstrap, group_id)

    async def committed_offsets(
        self, group_id: str, partitions: Iterable[tuple[str, int]]
    ) -> dict[tuple[str, int], int | None]:
        async with group_admin.GroupOffsets(self.bootstrap, group_id) as offsets:
            return await offsets.fetch(partitions)

    async def log_offsets(self, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
        return await kafka_admin.log_offsets(self.bootstrap, topic, partitions)

    async def delete_records(self, topic: str, before: dict[int, int]) -> dict[int, int]:
        return await kafka_admin.delete_records(self.bootstrap, topic, before)

    async def reset_group_offsets(
        self, group_id: str, topic: str, partitions: int, offset: int = 0
    ) -> None:
        await group_admin.reset_group_offsets(self.bootstrap, group_id, topic, partitions, offset)


def client_missing(client: KafkaClient) -> str | None:
    """What `client` needs that is not installed (None: nothing): the check both the
    settings (`TICKWHEEL_KAFKA_CLIENT`) and `KafkaClients` make."""
    if client == "confluent" and importlib.util.find_spec("confluent_kafka") is None:
        return "needs confluent-kafka: pip install '.[confluent]' from a clone of Tickwheel"
    return None


class KafkaClients:
    """`app.kafka.ports.Clients` on a Kafka cluster: each call makes a new, unstarted client."""

    def __init__(
        self,
        bootstrap: Connectable,
        replication: Replication | None = None,
        *,
        client: KafkaClient = "aiokafka",
        producer_thread: bool = False,
    ) -> None:
        if client not in get_args(KafkaClient):
            raise ValueError(f"Kafka client {client!r}: aiokafka or confluent")
        missing = client_missing(client)
        if missing is not None:
            # said when the node is configured, not at its first partition's transaction
            raise ValueError(f"the {client} Kafka client {missing}")
        if producer_thread and client != "aiokafka":
            raise ValueError(f"a producers' thread is aiokafka's only, not {client}'s")
        self.bootstrap = bootstrap
        self.replication = replication
        self.client: KafkaClient = client
        # aiokafka's transactional producers on a loop of their own (`OwnLoopProducer`)
        self.producer_thread = producer_thread

    def transactional_writer(
        self,
        transactional_id: str,
        *,
        max_batch_bytes: int | None = None,
        topics: Iterable[str] = (),
    ) -> TransactionalWriter:
        size = TRANSACTION_BATCH_BYTES if max_batch_bytes is None else max_batch_bytes
        if self.client == "confluent":
            # imported here: confluent-kafka is an optional extra; librdkafka fetches the
            # metadata of the topics it writes on its own threads, off the node's loop
            from app.kafka.rdkafka_writer import RdkafkaTransactionalWriter

            return RdkafkaTransactionalWriter(
                self.bootstrap, transactional_id, max_batch_bytes=size
            )
        if self.producer_thread:
            # its client on a loop of its own: a commit's turns never wait for the node's
            return OwnLoopProducer(
                self.bootstrap, transactional_id, topics=topics, max_batch_bytes=size
            )
        return TransactionalProducer(
            self.bootstrap, transactional_id, topics=topics, max_batch_bytes=size
        )

    def reader(self) -> ReaderClient:
        if self.client == "confluent":
            # a restore's read decoded by C (`app.kafka.rdkafka_reader`)
            from app.kafka.rdkafka_reader import RdkafkaReader

            return RdkafkaReader(self.bootstrap)
        return Reader(self.bootstrap)

    def publisher(self) -> Producer:
        return Producer(self.bootstrap)

    def follower(self, topic: str) -> PartitionReader:
        return PartitionReader(self.bootstrap, topic)

    def admin(self) -> KafkaAdmin:
        return KafkaAdmin(self.bootstrap, replication=self.replication)

    def group_member(
        self,
        group_id: str,
        topics: Sequence[str],
        *,
        on_assigned: Assigned,
        on_revoked: Assigned,
        session_timeout_ms: int,
        group_instance_id: str | None = None,
        on_deleted: DeletedUnread | None = None,
    ) -> GroupConsumer:
        return GroupConsumer(
            self.bootstrap,
            group_id,
            topics,
            on_assigned=on_assigned,
            on_revoked=on_revoked,
            session_timeout_ms=session_timeout_ms,
            group_instance_id=group_instance_id,
            on_deleted=on_deleted,
        )
