"""The ports' factory over aiokafka: one cluster's clients from its bootstrap address."""

from __future__ import annotations

from app.kafka.consumers import PartitionReader, Reader
from app.kafka.producers import Producer, TransactionalProducer

__all__ = ["KafkaClients"]


class KafkaClients:
    """`app.kafka.ports.Clients` on a Kafka cluster: each call makes a new, unstarted client."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap

    def transactional_writer(self, transactional_id: str) -> TransactionalProducer:
        return TransactionalProducer(self.bootstrap, transactional_id)

    def reader(self) -> Reader:
        return Reader(self.bootstrap)

    def publisher(self) -> Producer:
        return Producer(self.bootstrap)

    def follower(self, topic: str) -> PartitionReader:
        return PartitionReader(self.bootstrap, topic)
