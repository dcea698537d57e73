"""What a node opens for each aggregate type it keeps (its timer store and transactions,
its aggregate states, its timer runner and loop), how large its dead letters may be, and
what the topics its transactions write take (`written_limits`: its producers' batches,
`transaction_batch_limits`, and the records it refuses as too large, `topic_record_bytes`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from app.errors import KafkaUnavailable
from app.kafka.catalog import TopicCatalog
from app.kafka.ports import Admin, Clients, PublisherClient, TransactionalWriter
from app.kafka.producers import TRANSACTION_BATCH_BYTES, transaction_batch_bytes
from app.kafka.records import BROKER_MAX_MESSAGE_BYTES, RECORD_FRAMING, TOPIC_RECORD_BYTES
from app.model.aggregate import AggregateType
from app.node.commits import Commits
from app.node.cycles import PartitionCycles
from app.node.in_process import NodeTimerLoop, TypeLoops
from app.node.kept import KeptType
from app.node.local_state import CleanMarks
from app.node.metrics import NodeMetrics
from app.node.row_limit import RowLimit
from app.node.settings import Settings
from app.node.type_transactions import TypeTransactions
from app.protocol.dead_letters import DEAD_LETTER_TOPIC_BYTES
from app.protocol.limits import InputLimits
from app.protocol.topics import AggregateTopics, ContextTopics
from app.timers.runner import Clock, TimerOptions, TimerRunner
from app.timers.sender import KafkaSender, ResultsReader
from tables import open_timer_store
from tables.aggregate_store import RocksAggregateStore
from tables.ledger import FailureLedger

if TYPE_CHECKING:
    from app.node.partition_tasks import PartitionTasks

__all__ = [
    "Keeping",
    "dead_letter_limit",
    "open_type",
    "topic_record_bytes",
    "transaction_batch_limits",
    "written_limits",
    "written_topics",
]

logger = logging.getLogger(__name__)


async def dead_letter_limit(admin: Admin, topics: list[AggregateTopics]) -> int:
    """Dead letters as large as the dead-letter topics take (an older one may take less
    than Tickwheel creates them with: its letters of larger records are cut)."""
    limit = DEAD_LETTER_TOPIC_BYTES
    for ctx in sorted({t.context for t in topics}):
        topic = ContextTopics(ctx).dead_letters
        try:
            takes = await admin.max_message_bytes(topic)
        except KafkaUnavailable as exc:
            # Not allowed to describe its configs (an ACL): assume the broker's default.
            logger.warning("%s: %s; its letters are cut to 1 MiB", topic, exc)
            takes = BROKER_MAX_MESSAGE_BYTES
        if takes < limit:
            logger.warning(
                "%s takes records of %d bytes at most (max.message.bytes), not %d: dead "
                "letters of larger records are cut to fit; raise it to keep them whole",
                topic,
                takes,
                DEAD_LETTER_TOPIC_BYTES,
            )
            limit = takes
    return limit


def written_topics(t: AggregateTopics) -> list[str]:
    """The topics the partition transactions of type `t` write."""
    c = ContextTopics(t.context)
    return [t.timers_changelog, t.events, t.commands, c.results, c.dead_letters]


async def written_limits(admin: Admin, topics: Sequence[AggregateTopics]) -> dict[str, int]:
    """The `max.message.bytes` of each topic the types' partition transactions write, each
    read once (a context's results and dead letters are its types' all)."""
    written = list(dict.fromkeys(w for t in topics for w in written_topics(t)))
    limits = await asyncio.gather(*(_max_message_bytes(admin, topic) for topic in written))
    return dict(zip(written, limits, strict=True))


def transaction_batch_limits(
    t: AggregateTopics,
    record_bytes: Mapping[str, int],
    also: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """The `max.message.bytes` of each topic the partition transactions of type `t` write
    (`written_topics`) as the node's checks last read them (`InputLimits.
    topic_record_bytes`: what a topic takes of a record, for those that take less than a
    topic of the broker's defaults), and of those in `also` (what each takes of a record:
    `TopicCatalog.takes`). Its producers' batches go under the smallest
    (`transaction_batch_bytes`; a topic made by its operator may take less than Kafka's
    1 MiB default, or be lowered while the node runs)."""
    limits = {
        topic: record_bytes.get(topic, TOPIC_RECORD_BYTES) + RECORD_FRAMING
        for topic in written_topics(t)
    }
    for topic, takes in (also or {}).items():
        limit = takes + RECORD_FRAMING
        limits[topic] = min(limits.get(topic, limit), limit)
    return limits


def _batch_size_noted(t: AggregateTopics, limits: Mapping[str, int], batch: int) -> None:
    """Logs a change of its producers' batch size, and which topic makes it so."""
    if batch >= TRANSACTION_BATCH_BYTES:
        logger.info("%s's transactions are sent in batches of %d bytes", t.type_name, batch)
        return
    limit, topic = min((limit, topic) for topic, limit in limits.items())
    logger.info(
        "%s takes records of %d bytes at most (max.message.bytes): %s's transactions are "
        "sent in batches of %d bytes",
        topic,
        limit,
        t.type_name,
        batch,
    )


def topic_record_bytes(
    topics: Sequence[AggregateTopics], read: Mapping[str, int], max_record_bytes: int
) -> dict[str, int]:
    """What each topic the types' transactions write takes of a record (its key and value:
    its `max.message.bytes`, as `read`, less `RECORD_FRAMING`), for those that take less
    than a topic of the broker's defaults (`TOPIC_RECORD_BYTES`, what is assumed of any
    other): `InputLimits.topic_record_bytes`. A decision or a timer whose record one would
    refuse is refused as too large, not written (it would fail its partition's
    transaction at every retake). Warned about, once: a type's events, commands or
    changelog that takes less than `TICKWHEEL_MAX_RECORD_BYTES` lets through."""
    takes = {
        topic: limit - RECORD_FRAMING
        for topic, limit in read.items()
        if limit - RECORD_FRAMING < TOPIC_RECORD_BYTES
    }
    for topic in dict.fromkeys(
        w for t in topics for w in (t.events, t.commands, t.timers_changelog)
    ):
        if topic in takes and takes[topic] < max_record_bytes:
            logger.warning(
                "%s takes records of %d bytes at most (max.message.bytes %d, less %d of "
                "framing), less than TICKWHEEL_MAX_RECORD_BYTES %d lets through: a "
                "decision writing a larger record to it, or setting a timer whose command "
                "or row would be, is answered ERROR and dead-lettered; raise the topic's "
                "max.message.bytes to take them",
                topic,
                takes[topic],
                read[topic],
                RECORD_FRAMING,
                max_record_bytes,
            )
    return takes


async def _max_message_bytes(admin: Admin, topic: str) -> int:
    try:
        return await admin.max_message_bytes(topic)
    except KafkaUnavailable as exc:
        # Not allowed to describe its configs (an ACL): assume the broker's default.
        logger.warning("%s: %s; assumed to take 1 MiB", topic, exc)
        return BROKER_MAX_MESSAGE_BYTES


class Keeping(Protocol):
    """What opening a type uses of the node (`Node` is one)."""

    settings: Settings
    clients: Clients
    producer: PublisherClient
    clock: Clock
    options: TimerOptions
    metrics: NodeMetrics
    commits: Commits
    cycles: PartitionCycles
    types: dict[str, KeptType]
    targets: TopicCatalog
    tasks: PartitionTasks
    limits: InputLimits


def open_type(
    t: AggregateTopics,
    agg: AggregateType[Any] | None,
    node: Keeping,
    *,
    results: ResultsReader,
    ledger: FailureLedger,
) -> KeptType:
    """Opens what the node keeps for type `t` (`agg`: None when its commands are decided
    elsewhere); its loop finds it in `node.types` once it is kept there."""
    s, clock, metrics, types = node.settings, node.clock, node.metrics, node.types
    directory = Path(s.data_dir) / t.type_name
    (directory / "timers").mkdir(parents=True, exist_ok=True)
    clients = node.clients

    # What a partition's transactions write for sure (all made at the node's start): their
    # metadata fetched when its producer starts, at the take, not by the burst's first
    # commit (one request for them all).
    written = (t.events, t.commands, t.timers_changelog, ContextTopics(t.context).results)

    # Each producer's batch size as the limits read last say (the catalog keeps them
    # current): one opened at a take after an operator lowered a topic's
    # `max.message.bytes` under the batch size batches under it. The broker refuses a batch
    # over it whole, not retried, so that producer's partition failed at every retake.
    # Other topics its transactions wrote that refused a batch count too (`batch_topics`).
    batch_sizes = [TRANSACTION_BATCH_BYTES]
    batch_topics: set[str] = set()

    def writer(transactional_id: str) -> TransactionalWriter:
        also = {topic: node.targets.takes(topic) for topic in batch_topics}
        limits = transaction_batch_limits(t, node.limits.topic_record_bytes, also)
        size = transaction_batch_bytes(limits.values())
        if size != batch_sizes[-1]:
            _batch_size_noted(t, limits, size)
            batch_sizes[-1] = size
        return clients.transactional_writer(transactional_id, max_batch_bytes=size, topics=written)

    transactions = TypeTransactions(
        writer,
        t.timers_changelog,
        s.group_id,
        on_commit=metrics.commit_duration.labels(t.type_name).observe,
    )
    store = open_timer_store(
        f"rocksdb://{(directory / 'timers').resolve()}",
        partitions=s.partitions,
        changelog=transactions,
        # A restore takes no row of another type's owner, nor of one keyed elsewhere.
        owner_type=(t.context, t.aggregate),
    )
    sender = KafkaSender(node.producer, results, t.context, clock.now, node.targets)

    # The node's window is its targets' (this context's aggregates, by convention those of
    # every context it sends to): it bounds an operator's retry of a slot.
    runner = TimerRunner(
        store, sender, clock, ledger, node.options, request_id_window=s.request_id_window_ms
    )
    states = RocksAggregateStore(directory / "states") if agg is not None else None
    marks = CleanMarks(directory / "timers")
    loop = NodeTimerLoop(
        TypeLoops(
            runner,
            type_name=t.type_name,
            types=types,
            commits=node.commits,
            cycles=node.cycles,
            running=node.tasks.running,
            on_round=lambda stats: metrics.round(t.type_name, stats),
        )
    )
    # The limits' own mapping, not a copy: the catalog keeps it current.
    row_limit = RowLimit(t.timers_changelog, node.limits.topic_record_bytes, node.targets)
    return KeptType(
        t, agg, store, runner, loop, states, transactions, marks, row_limit, batch_topics
    )
