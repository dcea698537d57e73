"""The Kafka edge: the only package that imports aiokafka. Producers (plain and one
transactional per partition), the group consumer, readers of whole partitions, admin
calls (topics, offsets, groups, the cluster id) and the broker watch.

May import: `app.errors`.
"""

from app.kafka.admin import (
    GroupOffsets,
    cluster_id,
    delete_records,
    ensure_topics,
    existing_topics,
    group_members,
    log_offsets,
    require_topic,
    require_topics,
    reset_group_offsets,
    topic_names,
)
from app.kafka.consumers import (
    GroupConsumer,
    PartitionReader,
    Reader,
    read_partitions,
    read_to_end,
    tail,
)
from app.kafka.producers import Producer, TransactionalProducer
from app.kafka.records import OutRecord, Record, TopicSpec

__all__ = [
    "GroupConsumer",
    "GroupOffsets",
    "OutRecord",
    "PartitionReader",
    "Producer",
    "Reader",
    "Record",
    "TopicSpec",
    "TransactionalProducer",
    "cluster_id",
    "delete_records",
    "ensure_topics",
    "existing_topics",
    "group_members",
    "log_offsets",
    "read_partitions",
    "read_to_end",
    "require_topic",
    "require_topics",
    "reset_group_offsets",
    "tail",
    "topic_names",
]
