"""The ports' factory over aiokafka: one cluster's clients from its bootstrap address."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from app.kafka import admin as kafka_admin
from app.kafka.admin import cluster_id, ensure_topics, max_message_bytes, topic_names
from app.kafka.connection import Connectable, address
from app.kafka.consumers import GroupConsumer, PartitionReader, Reader
from app.kafka.ports import Assigned
from app.kafka.probe import api_versions_probe, check_access
from app.kafka.producers import Producer, TransactionalProducer
from app.kafka.records import Replication, TopicSpec

__all__ = ["KafkaAdmin", "KafkaClients"]


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

    async def probe(self) -> str | None:
        return await api_versions_probe(self.bootstrap, self._probe_timeout)

    async def check_access(self) -> None:
        await check_access(self.bootstrap)

    # The operators' calls: looked up in `app.kafka.admin` when called, so that a test
    # standing in for one there (a read-only command creates nothing) stands in here too.

    def where(self) -> str:
        return address(self.bootstrap)

    async def existing_topics(self, names: Iterable[str]) -> dict[str, int]:
        return await kafka_admin.existing_topics(self.bootstrap, names)

    async def group_members(self, group_id: str) -> int:
        return await kafka_admin.group_members(self.bootstrap, group_id)

    async def committed_offsets(
        self, group_id: str, partitions: Iterable[tuple[str, int]]
    ) -> dict[tuple[str, int], int | None]:
        async with kafka_admin.GroupOffsets(self.bootstrap, group_id) as offsets:
            return await offsets.fetch(partitions)

    async def log_offsets(self, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
        return await kafka_admin.log_offsets(self.bootstrap, topic, partitions)

    async def delete_records(self, topic: str, before: dict[int, int]) -> dict[int, int]:
        return await kafka_admin.delete_records(self.bootstrap, topic, before)

    async def reset_group_offsets(
        self, group_id: str, topic: str, partitions: int, offset: int = 0
    ) -> None:
        await kafka_admin.reset_group_offsets(self.bootstrap, group_id, topic, partitions, offset)


class KafkaClients:
    """`app.kafka.ports.Clients` on a Kafka cluster: each call makes a new, unstarted client."""

    def __init__(self, bootstrap: Connectable, replication: Replication | None = None) -> None:
        self.bootstrap = bootstrap
        self.replication = replication

    def transactional_writer(
        self, transactional_id: str, *, max_batch_bytes: int | None = None
    ) -> TransactionalProducer:
        if max_batch_bytes is None:
            return TransactionalProducer(self.bootstrap, transactional_id)
        return TransactionalProducer(
            self.bootstrap, transactional_id, max_batch_bytes=max_batch_bytes
        )

    def reader(self) -> Reader:
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
    ) -> GroupConsumer:
        return GroupConsumer(
            self.bootstrap,
            group_id,
            topics,
            on_assigned=on_assigned,
            on_revoked=on_revoked,
            session_timeout_ms=session_timeout_ms,
        )
