"""Whether the compacted topics a node finds already there are kept as it would make them:
compacted, deleting nothing. A timer changelog (or any table's) whose policy deletes after
a retention loses its rows then, and every restore after that loses the timers with them,
quietly; an operator who made the topics beforehand with the broker's default policy would
find out weeks later. Read with the node's admin client at its start
(`app.kafka.admin.ensure_topics`). An aggregate's log made beforehand the same way (often by
the team that owns it) is only warned about: it is theirs, and a node reads it on as long
as it keeps what the node has not read yet (`app.kafka.resume_offset` says when it did
not); but a new node, a lost local copy or a rebuild folds the states from what is left.

A running node reads them again every minute (`app.node.topic_watch`, through the admin
port's `topic_configs`, which `read_topic_configs` is over aiokafka): a policy changed on a
running cluster is judged as the start judges it (`policy_findings`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError

from app.errors import KafkaUnavailable
from app.kafka.connection import Connectable, client_options
from app.kafka.records import TopicConfigs, explain

__all__ = [
    "POLICY_CONFIGS",
    "check_compacted",
    "describe_topic_configs",
    "log_warning",
    "policy_findings",
    "policy_refusal",
    "read_topic_configs",
]

logger = logging.getLogger(__name__)


POLICY_CONFIGS = ("cleanup.policy", "retention.ms", "retention.bytes")
"""What `policy_refusal` and `log_warning` judge a topic by."""
_READ = POLICY_CONFIGS
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


def policy_findings(
    configs: TopicConfigs, topics: Iterable[str], logs: Iterable[str] = ()
) -> tuple[str | None, dict[str, str]]:
    """The refusal of the first of `topics` (compacted tables) whose configs read delete
    rows (`policy_refusal`; None: none does), and the warning of each of `logs` (aggregates'
    logs) whose configs read drop records (`log_warning`). A topic not read is judged by
    neither (`configs.unread` says why)."""
    refusal = next(
        (
            why
            for topic in topics
            if topic in configs.read
            and (why := policy_refusal(topic, configs.read[topic])) is not None
        ),
        None,
    )
    warnings = {
        log: warning
        for log in logs
        if log in configs.read and (warning := log_warning(log, configs.read[log])) is not None
    }
    return refusal, warnings


async def describe_topic_configs(
    admin: AIOKafkaAdminClient, topics: Sequence[str], names: Sequence[str] = POLICY_CONFIGS
) -> TopicConfigs:
    """The configs `names` of `topics` (one DescribeConfigs); `KafkaError` when the call
    fails whole, a topic's own error (its ACL) said in `unread`."""
    read: dict[str, dict[str, str]] = {}
    unread: dict[str, str] = {}
    if not topics:
        return TopicConfigs(read, unread)
    responses = await admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, t, dict.fromkeys(names)) for t in topics]
    )
    for response in responses:
        for resource in response.resources:
            error_code, message, name, entries = resource[0], resource[1], resource[3], resource[4]
            if error_code:
                unread[name] = str(message or f"error code {error_code}")
            else:
                read[name] = {entry[0]: entry[1] or "" for entry in entries if entry[0] in names}
    return TopicConfigs(read, unread)


async def read_topic_configs(
    bootstrap: Connectable, topics: Sequence[str], names: Sequence[str] = POLICY_CONFIGS
) -> TopicConfigs:
    """`describe_topic_configs` on an admin client of its own; `KafkaUnavailable` when the
    call fails (the broker away, the client refused)."""
    admin = AIOKafkaAdminClient(**client_options(bootstrap), request_timeout_ms=30_000)
    try:
        await admin.start()
        return await describe_topic_configs(admin, topics, names)
    except KafkaError as exc:
        raise KafkaUnavailable(
            f"cannot read the configs of {', '.join(topics)}: {explain(exc)}"
        ) from exc
    finally:
        await admin.close()


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
        configs = await describe_topic_configs(admin, asked)
    except KafkaError as exc:
        logger.warning("cannot read the cleanup.policy of %s: %r", ", ".join(asked), exc)
        return
    for name, message in configs.unread.items():
        logger.warning("cannot read the cleanup.policy of %s: %s", name, message)
    refusal, warnings = policy_findings(configs, topics, logs)
    for warning in warnings.values():
        logger.warning("%s", warning)
    if refusal is not None:
        raise KafkaUnavailable(refusal)
