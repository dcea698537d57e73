"""The Kafka edge: the only package that imports aiokafka (and confluent-kafka, the
optional extra). Producers (plain and one transactional per partition), the group
consumer, readers of whole partitions, admin calls (topics, offsets, groups, the cluster
id) and the broker watch.

The ports (`ports`): Protocols for what the runtime needs of Kafka (a transactional
writer per partition, a log reader, a publisher, a follower, and `Clients` making them),
implemented over aiokafka (`KafkaClients`), in memory (`memory.MemoryLog`, for tests),
and, for the transactional writer and the changelog reader, over librdkafka
(`rdkafka_writer`, `rdkafka_reader`, chosen with `KafkaClients(client="confluent")`, each
writer's and reader's calls on a `call_thread.CallThread`).

May import: `app.errors`, `app.backoff`, `app.log_limit`.
"""

from app.kafka.admin import (
    cluster_id,
    delete_records,
    ensure_topics,
    existing_topics,
    log_offsets,
    require_topic,
    require_topics,
    topic_names,
)
from app.kafka.clients import KafkaClients
from app.kafka.consumers import Reader, read_partitions, read_to_end, tail
from app.kafka.group_admin import GroupOffsets, group_members, reset_group_offsets
from app.kafka.group_consumer import GroupConsumer
from app.kafka.partition_reader import PartitionReader
from app.kafka.ports import (
    Clients,
    Follower,
    FollowerFactory,
    LogReader,
    Publisher,
    PublisherClient,
    ReaderClient,
    TransactionalWriter,
    WriterFactory,
)
from app.kafka.producers import Producer
from app.kafka.records import Headers, OutRecord, Record, TopicSpec, headers_of, refused
from app.kafka.transactional_producer import TransactionalProducer

__all__ = [
    "Clients",
    "Follower",
    "FollowerFactory",
    "GroupConsumer",
    "GroupOffsets",
    "Headers",
    "KafkaClients",
    "LogReader",
    "OutRecord",
    "PartitionReader",
    "Producer",
    "Publisher",
    "PublisherClient",
    "Reader",
    "ReaderClient",
    "Record",
    "TopicSpec",
    "TransactionalProducer",
    "TransactionalWriter",
    "WriterFactory",
    "cluster_id",
    "delete_records",
    "ensure_topics",
    "existing_topics",
    "group_members",
    "headers_of",
    "log_offsets",
    "read_partitions",
    "read_to_end",
    "refused",
    "require_topic",
    "require_topics",
    "reset_group_offsets",
    "tail",
    "topic_names",
]
