"""Whether the compacted topics a node finds already there are kept as it would make them:
compacted, deleting nothing. A timer changelog (or any table's) whose policy deletes after
a retention loses its rows then, and every restore after that loses the timers with them,
quietly; an operator who made the topics beforehand with the broker's default policy would
find out weeks later. Read with the node's admin client at its start
(`app.kafka.admin.ensure_topics`). An aggregate's log made beforehand the same way (often by
the team that owns it) is only warned about: it is theirs, and a node reads it on as long
as it keeps what the node has not read yet (`app.kafka.resume_offset` says when it did
not); but a new node, a lost local copy or a rebuild folds the states from what is left."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError

from app.errors import KafkaUnavailable

__all__ = ["check_compacted", "log_warning", "policy_refusal"]

logger = logging.getLogger(__name__)


_READ = ("cleanup.policy", "retention.ms", "retention.bytes")
# A retention that never deletes: -1, or the largest a broker takes (Long.MAX_VALUE).
_FOR_EVER = frozenset({"-1", str(2**63 - 1)})


def policy_refusal(topic: str, configs: Mapping[str, str]) -> str | None:
    """Why `topic`, kept compacted, cannot be used with `configs` (None: it can): its
    policy must compact, and may delete only what no retention ever reaches (-1, as the
    node makes its tables: `compact,delete` with both retentions -1)."""
    policy = configs.get("cleanup.policy", "")
    kinds = {part.strip() for part in policy.split(",")}
    retained = all(configs.get(name) in _FOR_EVER for name in ("retention.ms", "retention.bytes"))
    if "compact" in kinds and ("delete" not in kinds or retained):
        return None
    shown = ", ".join(f"{name}={configs.get(name)}" for name in _READ if name in configs)
    return (
        f"topic {topic} has {shown}: a compacted table's rows would be deleted (after "
        "retention.ms), and the timers or states with them. Set it as a node makes it "
        f"(kafka-configs --alter --entity-type topics --entity-name {topic} --add-config "
        "'cleanup.policy=[compact,delete],retention.ms=-1,retention.bytes=-1'; delete "
        "with no retention lets `tickwheel rebuild` empty it)"
    )


def log_warning(topic: str, configs: Mapping[str, str]) -> str | None:
    """What is wrong with `topic`, an aggregate's log the node folds its states from, kept
    with `configs` (None: nothing): it must keep every record, neither compacted (only the
    last event of each aggregate would be left) nor deleted after a retention."""
    kinds = {part.strip() for part in configs.get("cleanup.policy", "").split(",")}
    retained = all(configs.get(name) in _FOR_EVER for name in ("retention.ms", "retention.bytes"))
    if "compact" not in kinds and ("delete" not in kinds or retained):
        return None
    shown = ", ".join(f"{name}={configs.get(name)}" for name in _READ if name in configs)
    return (
        f"the log {topic} has {shown}: the events it drops are lost to every node that "
        "folds the aggregates' states from it again (a new node, a lost local copy, a "
        f"rebuild). Keep them all: kafka-configs --alter --entity-type topics --entity-name "
        f"{topic} --add-config 'cleanup.policy=delete,retention.ms=-1,retention.bytes=-1'"
    )


async def check_compacted(
    admin: AIOKafkaAdminClient, topics: Sequence[str], logs: Sequence[str] = ()
) -> None:
    """`KafkaUnavailable` naming the first of `topics` that deletes rows (`policy_refusal`);
    each of `logs` that does not keep every record is warned about (`log_warning`). A
    cluster that does not let this node read topic configs (no DescribeConfigs ACL) is
    only warned about: the node can run without it."""
    asked = [*topics, *logs]
    if not asked:
        return
    try:
        responses = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, t, dict.fromkeys(_READ)) for t in asked]
        )
    except KafkaError as exc:
        logger.warning("cannot read the cleanup.policy of %s: %r", ", ".join(asked), exc)
        return
    for response in responses:
        for resource in response.resources:
            error_code, message, name, entries = resource[0], resource[1], resource[3], resource[4]
            if error_code:
                logger.warning("cannot read the cleanup.policy of %s: %s", name, message)
                continue
            configs = {entry[0]: entry[1] or "" for entry in entries if entry[0] in _READ}
            if name not in topics:
                if (warning := log_warning(name, configs)) is not None:
                    logger.warning("%s", warning)
            elif (why := policy_refusal(name, configs)) is not None:
                raise KafkaUnavailable(why)
