"""Whether the topics a node finds are replicated as configured. A topic is created with
as many replicas as the cluster had live brokers then, at most the configured factor
(`app.kafka.admin.replication_for`): one created while a broker was down, or made
beforehand with fewer, keeps its count for good, and a broker lost then loses records
the node was told were written. And a topic's `min.insync.replicas` (its own, else the
broker's default) of 1 with 3 replicas or more lets a write be acknowledged by one broker
alone, while one above its replicas fails every write.

`check_replication` reads them at the node's start, through the admin port (`replicas`,
`topic_configs`), logs a WARNING for each, saying how to fix it, and returns them (the
node's `/healthz` says them, as `topics`). On a cluster of fewer live brokers than the
factor, the topics it cannot hold more replicas of yet are one line, not one a topic.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from app.errors import KafkaUnavailable
from app.kafka.connection import Connectable, client_options
from app.kafka.ports import Admin
from app.kafka.records import Replication, explain

__all__ = ["check_replication", "insync_fault", "read_replicas", "replica_shortfall"]

logger = logging.getLogger(__name__)


def replica_shortfall(topic: str, replicas: int, asked: Replication) -> str | None:
    """Why `topic`, with `replicas` replicas (its partition with the fewest), is short of
    the configured factor (None: it is not)."""
    if replicas >= asked.factor:
        return None
    return (
        f"topic {topic} has {replicas} replica(s), fewer than the {asked.factor} configured "
        "(TICKWHEEL_REPLICATION_FACTOR): a broker lost can lose records the node was told "
        "were written, and it stays so (made beforehand, or while brokers were down). Raise "
        "it with kafka-reassign-partitions --execute, given a reassignment that lists "
        f"{asked.factor} brokers for each of its partitions"
    )


def insync_fault(topic: str, replicas: int, min_insync: int) -> str | None:
    """What is wrong with `topic`'s `min.insync.replicas` for its `replicas` (None:
    nothing): above them every write fails; 1 with 3 or more lets one broker alone
    acknowledge a write."""
    fix = (
        f"kafka-configs --alter --entity-type topics --entity-name {topic} --add-config "
        "min.insync.replicas="
    )
    if min_insync > replicas:
        return (
            f"topic {topic} has min.insync.replicas {min_insync}, more than its {replicas} "
            f"replica(s): every write to it fails (NOT_ENOUGH_REPLICAS). Lower it ({fix}"
            f"{max(1, replicas - 1)}) or add replicas (kafka-reassign-partitions)"
        )
    if min_insync == 1 and replicas >= 3:
        return (
            f"topic {topic} has min.insync.replicas 1 with {replicas} replicas: while the "
            "others lag, a write is acknowledged once one broker holds it, and lost with "
            f"that broker. Raise it ({fix}2)"
        )
    return None


async def check_replication(
    admin: Admin, topics: Sequence[str], asked: Replication
) -> dict[str, list[str]]:
    """What is wrong with the replication of each of `topics` the cluster has (logged,
    one WARNING each); `{}` when nothing is, or when they cannot be read (said in a
    WARNING: the node runs without knowing)."""
    try:
        brokers, replicas = await admin.replicas(topics)
        configs = await admin.topic_configs(list(replicas), ("min.insync.replicas",))
    except KafkaUnavailable as exc:
        logger.warning("cannot read the replication of the node's topics: %s", exc)
        return {}
    except Exception:  # a check that warns: an answer read wrong never stops a start
        logger.warning("cannot read the replication of the node's topics", exc_info=True)
        return {}
    found: dict[str, list[str]] = {}
    too_few_brokers: list[str] = []
    for topic, count in replicas.items():
        if (short := replica_shortfall(topic, count, asked)) is not None:
            found.setdefault(topic, []).append(short)
            if count < brokers:  # a reassignment can raise it now
                logger.warning("%s", short)
            else:
                too_few_brokers.append(topic)
        setting = configs.read.get(topic, {}).get("min.insync.replicas", "")
        if setting.isdigit() and (fault := insync_fault(topic, count, int(setting))):
            found.setdefault(topic, []).append(fault)
            logger.warning("%s", fault)
    if too_few_brokers:
        logger.warning(
            "%d topic(s) have fewer replicas than the %d configured "
            "(TICKWHEEL_REPLICATION_FACTOR), as many as the cluster's %d live broker(s): %s. "
            "Once it has the brokers, raise them with kafka-reassign-partitions (they stay so)",
            len(too_few_brokers),
            asked.factor,
            brokers,
            ", ".join(too_few_brokers),
        )
    return found


async def read_replicas(
    bootstrap: Connectable, topics: Sequence[str]
) -> tuple[int, dict[str, int]]:
    """(how many brokers the cluster has live, the replicas of each of `topics` it has:
    its partition's with the fewest); `KafkaUnavailable` when the cluster does not say."""
    admin = AIOKafkaAdminClient(**client_options(bootstrap), request_timeout_ms=30_000)
    try:
        await admin.start()
        brokers = len((await admin.describe_cluster()).get("brokers") or [])
        have = set(await admin.list_topics())  # naming a missing one could create it
        present = [t for t in topics if t in have]
        described = await admin.describe_topics(present) if present else []
        return brokers, {
            t["topic"]: min((len(p.get("replicas") or []) for p in t["partitions"]), default=0)
            for t in described
            if not t.get("error_code")
        }
    except KafkaError as exc:
        raise KafkaUnavailable(f"cannot read the topics' replicas: {explain(exc)}") from exc
    finally:
        await admin.close()
