"""What a node's start reads of the cluster before it opens a table (`check_cluster`: its
topics made or checked, their replication, its dead letters' size, the cluster it keeps
copies of) and the followers each context's sends and parks depend on (`follow_contexts`).
May import `app.kafka`, `app.node`'s kept, local_state, metrics, opening and settings, and
`app.timers`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from app.kafka.ports import Admin, Clients, PublisherClient
from app.kafka.replication import check_replication
from app.node import polling
from app.node.kept import node_topics
from app.node.local_state import keep_for_cluster
from app.node.metrics import NodeMetrics
from app.node.opening import dead_letter_limit
from app.node.settings import Settings
from app.protocol.topics import AggregateTopics
from app.timers.ledger import KafkaFailureLedger
from app.timers.sender import ResultsReader

__all__ = ["ClusterChecked", "check_cluster", "follow_contexts"]


@dataclass(frozen=True, slots=True)
class ClusterChecked:
    """What the start found: each topic's replication faults (said in `/healthz`), and
    how large a dead letter the dead-letter topics take."""

    topic_faults: dict[str, list[str]]
    dead_letter_bytes: int


async def check_cluster(
    admin: Admin, topics: Sequence[AggregateTopics], settings: Settings
) -> ClusterChecked:
    """The node's topics made (or checked: partitions, a table's policy), their
    replication warned about, the dead letters' size read, and a local copy of another
    cluster's topics dropped before any store is opened."""
    specs = node_topics(list(topics), settings.partitions)
    await admin.ensure_topics(specs)
    # Short of replicas or of in-sync ones: warned about, and said in /healthz.
    faults = await check_replication(admin, [t.name for t in specs], settings.replication)
    dead_letter_bytes = await dead_letter_limit(admin, list(topics))
    keep_for_cluster(Path(settings.data_dir), await admin.cluster_id())
    return ClusterChecked(faults, dead_letter_bytes)


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
