"""What a node's start reads of the cluster before it opens a table (`check_cluster`: its
topics made or checked, their replication, its dead letters' size, what its written topics
take, its timer changelogs' tombstone retention, the cluster it keeps copies of) and the
followers each context's sends and parks depend on (`follow_contexts`). May import
`app.errors`, `app.kafka`, `app.node`'s copy_age, kept, local_state, metrics, opening and
settings, and `app.timers`."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from app.errors import KafkaUnavailable
from app.kafka.ports import Admin, Clients, PublisherClient
from app.kafka.records import TopicConfigs
from app.kafka.replication import check_replication
from app.node import polling
from app.node.copy_age import DELETE_RETENTION, UNKNOWN_DELETE_RETENTION_MS, margin_ms
from app.node.kept import node_topics
from app.node.local_state import keep_for_cluster
from app.node.metrics import NodeMetrics
from app.node.opening import dead_letter_limit, topic_record_bytes, written_limits
from app.node.settings import Settings
from app.protocol.topics import AggregateTopics, ContextTopics
from app.timers.ledger import KafkaFailureLedger
from app.timers.sender import ResultsReader

__all__ = ["ClusterChecked", "check_cluster", "follow_contexts"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ClusterChecked:
    """What the start found: each topic's replication faults (said in `/healthz`), how
    large a dead letter the dead-letter topics take, the timer changelogs'
    `delete.retention.ms` (`TopicPolicyWatch.kept_read`), the `max.message.bytes` of each
    topic the partitions' transactions write (`written`: their batches) and what those
    that take less than a topic of the broker's defaults take of a record (`record_bytes`:
    `InputLimits.topic_record_bytes`)."""

    topic_faults: dict[str, list[str]]
    dead_letter_bytes: int
    tombstones: TopicConfigs = field(default_factory=TopicConfigs)
    written: dict[str, int] = field(default_factory=dict)
    record_bytes: dict[str, int] = field(default_factory=dict)
    letters: dict[str, int] = field(default_factory=dict)
    """The dead-letter topics' `max.message.bytes` (`InputLimits.dead_letter_topic_bytes`)."""


async def check_cluster(
    admin: Admin, topics: Sequence[AggregateTopics], settings: Settings
) -> ClusterChecked:
    """The node's topics made (or checked: partitions, a table's policy), their
    replication warned about, the dead letters' size and what the topics its transactions
    write take read (a topic that takes less than its records may be warned about), and a
    local copy of another cluster's topics dropped before any store is opened."""
    specs = node_topics(list(topics), settings.partitions)
    await admin.ensure_topics(specs)
    # Short of replicas or of in-sync ones: warned about, and said in /healthz.
    faults = await check_replication(admin, [t.name for t in specs], settings.replication)
    dead_letter_bytes = await dead_letter_limit(admin, list(topics))
    tombstones = await _tombstones(admin, [t.timers_changelog for t in topics])
    written = await written_limits(admin, topics)
    record_bytes = topic_record_bytes(topics, written, settings.max_record_bytes)
    keep_for_cluster(Path(settings.data_dir), await admin.cluster_id())
    letter_topics = {ContextTopics(t.context).dead_letters for t in topics}
    letters = {topic: limit for topic, limit in written.items() if topic in letter_topics}
    return ClusterChecked(faults, dead_letter_bytes, tombstones, written, record_bytes, letters)


async def _tombstones(admin: Admin, changelogs: list[str]) -> TopicConfigs:
    """The changelogs' `delete.retention.ms`: how long a clean local copy of each is read
    on from (`app.node.copy_age`). Not read (no DescribeConfigs ACL, say) is no reason
    not to start: an hour is assumed, and read again every minute (`topic_watch`)."""
    try:
        configs = await admin.topic_configs(changelogs, (DELETE_RETENTION,))
    except KafkaUnavailable as exc:
        configs = TopicConfigs(unread=dict.fromkeys(changelogs, str(exc)))
    if configs.unread:
        logger.warning(
            "cannot read the %s of %s (%s): a clean local copy of them older than %d ms "
            "is restored whole",
            DELETE_RETENTION,
            ", ".join(configs.unread),
            "; ".join(sorted(set(configs.unread.values()))),
            UNKNOWN_DELETE_RETENTION_MS - margin_ms(UNKNOWN_DELETE_RETENTION_MS),
        )
    return configs


async def follow_contexts(
    clients: Clients,
    contexts: Sequence[str],
    *,
    settings: Settings,
    producer: PublisherClient,
    metrics: NodeMetrics,
    results: dict[str, ResultsReader],
    ledgers: dict[str, KafkaFailureLedger] | None,
    following: dict[str, ResultsReader | KafkaFailureLedger],
) -> None:
    """Starts each context's results reader, and its ledger's follower unless `ledgers` is
    None (a ledger given): each one put in `results` or `ledgers` and in `following` (by
    what `/healthz` calls it) as it starts, so that the node's stop stops what started
    before one that failed."""
    failing_s = polling.POLL_FAILING_S  # their polls' bound is the group's
    for ctx in contexts:
        unknown = metrics.unknown_result_codes.labels(context=ctx)
        reader = ResultsReader(
            clients.follower, ctx, failing_s=failing_s, on_unknown_code=unknown.inc
        )
        await reader.start()
        results[ctx] = following[f"the results reader of {ctx}"] = reader
        if ledgers is not None:
            ledger = KafkaFailureLedger(
                clients, ctx, settings.partitions, producer, failing_s=failing_s
            )
            await ledger.start()
            ledgers[ctx] = following[f"the ledger of {ctx}"] = ledger
