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
factor, the topics it cannot hold more replicas of yet are one line, not one a topic. A
running node judges them again every minute (`app.node.topic_watch`, with
`replication_findings`), warning about those that appear (`warn_replication`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Final

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from app.errors import KafkaUnavailable
from app.kafka.connection import Connectable, client_options
from app.kafka.ports import Admin
from app.kafka.records import Replication, TopicConfigs, explain

__all__ = [
    "MIN_INSYNC",
    "check_replication",
    "insync_fault",
    "read_replicas",
    "replica_shortfall",
    "replication_findings",
    "warn_replication",
]

logger = logging.getLogger(__name__)

MIN_INSYNC: Final = "min.insync.replicas"
"""The config `replication_findings` reads of each topic."""


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


def replication_findings(
    replicas: Mapping[str, int], configs: TopicConfigs, asked: Replication
) -> dict[str, list[str]]:
    """What is wrong with the replication of each topic of `replicas` (its count), given
    its `min.insync.replicas` read in `configs` (one not read is judged by its count
    alone); only the topics something is wrong with."""
    found: dict[str, list[str]] = {}
    for topic, count in replicas.items():
        if (short := replica_shortfall(topic, count, asked)) is not None:
            found.setdefault(topic, []).append(short)
        setting = configs.read.get(topic, {}).get(MIN_INSYNC, "")
        if setting.isdigit() and (fault := insync_fault(topic, count, int(setting))):
            found.setdefault(topic, []).append(fault)
    return found


def warn_replication(
    found: Mapping[str, Sequence[str]],
    brokers: int,
    replicas: Mapping[str, int],
    asked: Replication,
) -> None:
    """One WARNING for each of `found` (`replication_findings`, or some of them); the
    topics short of replicas on a cluster of no more live brokers than they have replicas
    (it cannot hold more yet) are one line."""
    too_few_brokers: list[str] = []
    for topic, faults in found.items():
        count = replicas.get(topic, 0)
        short = replica_shortfall(topic, count, asked)
        for fault in faults:
            if fault == short and count >= brokers:
                too_few_brokers.append(topic)
            else:  # a reassignment can raise it now, or a config fix it
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


async def check_replication(
    admin: Admin, topics: Sequence[str], asked: Replication
) -> dict[str, list[str]]:
    """What is wrong with the replication of each of `topics` the cluster has (logged,
    one WARNING each); `{}` when nothing is, or when they cannot be read (said in a
    WARNING: the node runs without knowing)."""
    try:
        brokers, replicas = await admin.replicas(topics)
        configs = await admin.topic_configs(list(replicas), (MIN_INSYNC,))
    except KafkaUnavailable as exc:
        logger.warning("cannot read the replication of the node's topics: %s", exc)
        return {}
    except Exception:  # a check that warns: an answer read wrong never stops a start
        logger.warning("cannot read the replication of the node's topics", exc_info=True)
        return {}
    found = replication_findings(replicas, configs, asked)
    warn_replication(found, brokers, replicas, asked)
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
