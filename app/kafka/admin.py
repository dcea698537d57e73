"""Admin calls: topics (created, found, their offsets, records deleted) and the cluster id.
A consumer group's (its members, its committed offsets, their reset) are in
`app.kafka.group_admin`."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic, RecordsToDelete
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaError, TopicAlreadyExistsError
from aiokafka.protocol.metadata import MetadataRequest

from app.errors import KafkaUnavailable
from app.kafka.cluster import count_differs, missing_topics
from app.kafka.connection import Connectable, address, client_options
from app.kafka.records import Replication, TopicSpec, explain
from app.kafka.topic_creation import check_created, creation_errors
from app.kafka.topic_policy import check_compacted

logger = logging.getLogger(__name__)


_COMPACTED = {"cleanup.policy": "compact,delete", "retention.ms": "-1", "retention.bytes": "-1"}


def topic_configs(spec: TopicSpec, replication: Replication) -> dict[str, str]:
    """The configs a topic is created with (docs/configuration.md lists them)."""
    configs = dict(_COMPACTED) if spec.compacted else {}
    if spec.retained:
        configs |= {"retention.ms": "-1", "retention.bytes": "-1"}
    configs["min.insync.replicas"] = str(replication.min_insync)
    if spec.max_message_bytes is not None:
        configs["max.message.bytes"] = str(spec.max_message_bytes)
    if spec.segment_ms is not None:
        configs["segment.ms"] = str(spec.segment_ms)
    if spec.delete_retention_ms is not None:
        configs["delete.retention.ms"] = str(spec.delete_retention_ms)
    return configs


async def max_message_bytes(bootstrap: Connectable, topic: str) -> int:
    """The largest record batch `topic` accepts (its `max.message.bytes`, default or set)."""
    admin = AIOKafkaAdminClient(**client_options(bootstrap), request_timeout_ms=30_000)
    try:
        await admin.start()
        [response] = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, {"max.message.bytes": None})]
        )
        for resource in response.resources:
            error_code, message = resource[0], resource[1]
            if error_code:
                raise KafkaUnavailable(f"cannot read the configs of {topic}: {message}")
            for entry in resource[4]:
                if entry[0] == "max.message.bytes":
                    return int(entry[1])
        raise KafkaUnavailable(f"the broker did not say {topic}'s max.message.bytes")
    except KafkaError as exc:
        raise KafkaUnavailable(f"cannot read the configs of {topic}: {explain(exc)}") from exc
    finally:
        await admin.close()


def replication_for(asked: Replication, brokers: int) -> Replication:
    """What a cluster of `brokers` can hold of `asked`: as asked where it has the brokers;
    else one replica per broker, and `min.insync.replicas` below that (so that a write
    still succeeds with one broker down), 1 on a single broker."""
    if asked.factor <= brokers:
        return asked
    factor = max(1, brokers)
    return Replication(factor, max(1, min(asked.min_insync, factor - 1)))


async def ensure_topics(
    bootstrap: Connectable, specs: Iterable[TopicSpec], replication: Replication | None = None
) -> None:
    """Creates the topics that do not exist, with `replication` as far as the cluster's
    brokers allow (a warning when capped); checks that existing ones have the partitions
    (and compacted ones their policy: `check_compacted`). A node's start checks their
    replication after (`app.kafka.replication`)."""
    specs = list(specs)
    asked = replication or Replication(1, 1)
    admin = AIOKafkaAdminClient(**client_options(bootstrap), request_timeout_ms=30_000)
    try:
        await admin.start()
        brokers = len((await admin.describe_cluster()).get("brokers") or []) or 1
        used = replication_for(asked, brokers)
        if used != asked:
            logger.warning(
                "the cluster at %s has %d broker(s): topics are created with %d replica(s) "
                "and min.insync.replicas %d, not the %d and %d asked "
                "(TICKWHEEL_REPLICATION_FACTOR, TICKWHEEL_MIN_INSYNC_REPLICAS)",
                address(bootstrap),
                brokers,
                used.factor,
                used.min_insync,
                asked.factor,
                asked.min_insync,
            )
        new = [
            NewTopic(
                s.name,
                num_partitions=s.partitions,
                replication_factor=used.factor,
                topic_configs=topic_configs(s, used),
            )
            for s in specs
        ]
        # The client library does not look at each topic's error: a refusal (no Create
        # ACL) would pass unseen, and the clients then wait for the topics till they time
        # out. A topic that exists is fine whatever its error (Create is refused for
        # topics that exist too: an operator may have created them beforehand).
        failed: dict[str, tuple[type[KafkaError], str | None]] = {}
        with contextlib.suppress(TopicAlreadyExistsError):
            failed = creation_errors(await admin.create_topics(new))
        described = await admin.describe_topics([s.name for s in specs])
        found = {t["topic"]: t["partitions"] for t in described if not t.get("error_code")}
        # A retriable error (the creation timed out, the controller moved) is tried again
        # one by one below; the second answer counts.
        check_created(
            bootstrap,
            {t: e for t, e in failed.items() if t not in found and not e[0].retriable},
        )
        for s in specs:
            if s.name not in found:
                # Created one by one when a batch failed part-way.
                with contextlib.suppress(TopicAlreadyExistsError):
                    one = await admin.create_topics([n for n in new if n.name == s.name])
                    check_created(bootstrap, creation_errors(one))
                continue
            if len(found[s.name]) != s.partitions:
                raise count_differs(s.name, len(found[s.name]), s.partitions)
        await check_compacted(
            admin,
            [s.name for s in specs if s.compacted and s.name in found],
            [s.name for s in specs if s.retained and s.name in found],
        )
    except KafkaError as exc:
        raise KafkaUnavailable(
            f"cannot create topics at {address(bootstrap)}: {explain(exc)}"
        ) from exc
    finally:
        await admin.close()


async def cluster_id(bootstrap: Connectable) -> str:
    """The id of the Kafka cluster at `bootstrap` (what its metadata says)."""
    client = AIOKafkaClient(**client_options(bootstrap))
    try:
        await client.bootstrap()
        response = await client.send(
            client.get_random_node(), MetadataRequest(topics=[], allow_auto_topic_creation=False)
        )
    except KafkaError as exc:
        raise KafkaUnavailable(f"cannot read the cluster id: {explain(exc)}") from exc
    finally:
        await client.close()
    found = getattr(response, "cluster_id", None)
    if not isinstance(found, str) or not found:
        raise KafkaUnavailable("the broker told no cluster id")
    return found


async def existing_topics(bootstrap: Connectable, names: Iterable[str]) -> dict[str, int]:
    """The partition counts of those of `names` the broker has; never creates a topic.

    The broker is first asked for all of its topics: a metadata request that names a
    topic creates it on a broker with `auto.create.topics.enable`. Only the topics found
    are then described.
    """
    wanted = list(names)
    admin = AIOKafkaAdminClient(**client_options(bootstrap), request_timeout_ms=30_000)
    try:
        await admin.start()
        have = set(await admin.list_topics())
        present = [n for n in wanted if n in have]
        if not present:
            return {}
        described = await admin.describe_topics(present)
        return {t["topic"]: len(t["partitions"]) for t in described if not t.get("error_code")}
    except KafkaError as exc:
        raise KafkaUnavailable(
            f"cannot read the topics at {address(bootstrap)}: {explain(exc)}"
        ) from exc
    finally:
        await admin.close()


async def topic_names(bootstrap: Connectable) -> set[str]:
    """The names of all the broker's topics (one metadata request that names none)."""
    admin = AIOKafkaAdminClient(**client_options(bootstrap), request_timeout_ms=30_000)
    try:
        await admin.start()
        return set(await admin.list_topics())
    except KafkaError as exc:
        raise KafkaUnavailable(
            f"cannot read the topics at {address(bootstrap)}: {explain(exc)}"
        ) from exc
    finally:
        await admin.close()


async def require_topics(bootstrap: Connectable, topics: dict[str, str]) -> dict[str, int]:
    """The partition count of each topic of `topics` (topic -> why it may be missing);
    `MissingTopic` naming every one the broker does not have. Creates nothing."""
    found = await existing_topics(bootstrap, topics)
    error = missing_topics(address(bootstrap), topics, found)
    if error is not None:
        raise error
    return found


async def require_topic(bootstrap: Connectable, topic: str, why: str) -> int:
    """The partition count of `topic`; `MissingTopic` (saying `why` it may be missing) when
    the broker does not have it. Creates nothing."""
    return (await require_topics(bootstrap, {topic: why}))[topic]


async def log_offsets(
    bootstrap: Connectable, topic: str, partitions: int
) -> dict[int, tuple[int, int]]:
    """Per partition of an existing `topic`: (first offset held, high watermark).

    The high watermark counts records of transactions still open: it is what a
    DeleteRecords up to "now" deletes before.
    """
    consumer = AIOKafkaConsumer(**client_options(bootstrap), group_id=None)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    try:
        await consumer.start()
        begins = await consumer.beginning_offsets(tps)
        ends = await consumer.end_offsets(tps)
        return {tp.partition: (int(begins[tp]), int(ends[tp])) for tp in tps}
    except KafkaError as exc:
        raise KafkaUnavailable(f"cannot read the offsets of {topic}: {explain(exc)}") from exc
    finally:
        await consumer.stop()


async def delete_records(
    bootstrap: Connectable, topic: str, before: dict[int, int]
) -> dict[int, int]:
    """Deletes the records of `topic` before `before[p]` in each partition p given; the
    new start offset per partition."""
    admin = AIOKafkaAdminClient(**client_options(bootstrap), request_timeout_ms=30_000)
    try:
        await admin.start()
        done = await admin.delete_records(
            {TopicPartition(topic, p): RecordsToDelete(o) for p, o in before.items()}
        )
        return {tp.partition: int(o) for tp, o in done.items()}
    except KafkaError as exc:
        hint = (
            " (the topic must allow deletes: cleanup.policy=compact,delete, as created here)"
            if "PolicyViolation" in repr(exc)
            else ""
        )
        raise KafkaUnavailable(
            f"cannot delete the records of {topic}: {explain(exc)}{hint}"
        ) from exc
    finally:
        await admin.close()
