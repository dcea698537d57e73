"""The records the command path reads and writes: where each belongs (`misrouted`, and a
restore's count of those out of place, `Misplaced`), the keys it keeps aggregates and
request ids under, and the records it writes beside the events (commands sent and whether
their topics exist, results, dead letters)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from app.errors import MissingTopic, RecordTooLarge
from app.kafka import OutRecord, Record
from app.kafka.catalog import TopicCatalog, no_target_message, refused_message, takes_at_most
from app.kafka.records import topic_takes
from app.model.decide import Decided
from app.protocol.dead_letters import Stage, dead_letter, error_message
from app.protocol.limits import InputLimits
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import (
    IN_PROCESS_HEADER,
    CommandEnvelope,
    CommandResult,
    EventEnvelope,
    ResultCode,
    encode,
)
from tables import AggregateRef
from tables.partitioner import key_partition, partition_of

__all__ = [
    "Misplaced",
    "Reply",
    "applied_id",
    "check_sizes",
    "command_record",
    "dead_letter_record",
    "letter_bytes",
    "misrouted",
    "result_record",
    "state_key",
    "targeted",
    "unreachable",
    "written_in_process",
]

logger = logging.getLogger(__name__)


class Reply(Protocol):
    """What a command's answer is addressed by: a command read (`CommandEnvelope`), or of
    one that does not read, what does (`app.commands.intake.ReplyAddress`)."""

    @property
    def request_id(self) -> str: ...
    @property
    def aggregate(self) -> AggregateRef: ...
    @property
    def reply_to(self) -> str | None: ...
    @property
    def reply_partition(self) -> int | None: ...


def letter_bytes(limits: InputLimits, context: str) -> int:
    """What a dead letter to `context`'s topic may take: what the dead-letter topics took
    at the node's start (`InputLimits.dead_letter_bytes`), or what that topic takes as
    read since (`dead_letter_topic_bytes`), when less. One lowered while the node runs is
    read again after its first refusal (`TopicCatalog.read_again`): its letters are cut to
    fit, and the partition goes on."""
    now = limits.dead_letter_topic_bytes.get(ContextTopics(context).dead_letters)
    return limits.dead_letter_bytes if now is None else min(limits.dead_letter_bytes, now)


def dead_letter_record(
    record: Record,
    error: BaseException | str,
    stage: Stage,
    now: int,
    limits: InputLimits,
) -> OutRecord:
    """The dead letter of `record` on its context's dead-letter topic: its bytes whole, why
    in its headers (`app.protocol.dead_letters`)."""
    logger.error(
        "dead-lettering %s[%d]@%d (%s): %s",
        record.topic,
        record.partition,
        record.offset,
        stage.value,
        (error if isinstance(error, str) else error_message(error))[:500],
    )
    limit = letter_bytes(limits, record.topic.split(".", 1)[0])
    return dead_letter(record, error, stage, now, limit=limit)


@dataclass
class Misplaced:
    """The events a restore found outside their aggregate's partition (`misrouted`), not
    folded: how many, and the first's offset, key and why."""

    count: int = 0
    offset: int = -1
    key: bytes | None = None
    why: str = ""

    def add(self, record: Record, why: str) -> None:
        if not self.count:
            self.offset, self.key, self.why = record.offset, record.key, why
        self.count += 1

    def log(self, events_topic: str, partition: int, partitions: int) -> None:
        logger.error(
            "%s[%d]: %d events are not in their aggregate's partition (murmur2 over %d "
            "partitions), not folded into its state; the first at offset %d, key %s: %s. "
            "Were partitions added to the topics? Aggregates do not move with them "
            "(docs/operations.md, Scaling)",
            events_topic,
            partition,
            self.count,
            partitions,
            self.offset,
            "none" if self.key is None else repr(self.key[:100]),
            self.why[:300],
        )


def misrouted(record: Record, aggregate: AggregateRef, partitions: int) -> str | None:
    """Why `record` of `aggregate` is not where Kafka's default partitioner puts it, or
    None. An aggregate's records are keyed by its id, in murmur2(id)'s partition: one
    written elsewhere would split its log (or its commands) across two owners."""
    if record.key is None:
        return f"no key: records of {aggregate.id!r} are keyed by the aggregate id"
    if record.key != aggregate.id.encode():
        return f"key {record.key!r} is not the aggregate id {aggregate.id!r}"
    expected = key_partition(record.key, partitions)  # the key is the id, encoded
    if record.partition != expected:
        return (
            f"{aggregate.id!r} belongs in partition {expected} (murmur2, Kafka's default "
            f"partitioner), not {record.partition}"
        )
    return None


def applied_id(event: EventEnvelope) -> str:
    """What marks an event as folded: its command's request id, or its own id."""
    return event.request_id or f"event:{event.id}"


def state_key(ref: AggregateRef) -> str:
    """Where the state store keeps an aggregate: its tenant and id, which two tenants'
    aggregates may share (the tenant is length-prefixed, so no pair is ambiguous)."""
    return f"{len(ref.tenant)}:{ref.tenant}/{ref.id}"


def command_record(cmd: CommandEnvelope) -> OutRecord:
    """A command a decision sends, on its target's command topic."""
    # The target's own partition count decides: the key picks it, as any producer's would.
    topic = AggregateTopics(cmd.aggregate.context, cmd.aggregate.aggregate).commands
    return (topic, None, cmd.aggregate.id.encode(), encode(cmd))


def result_record(
    cmd: Reply,
    result: CommandResult,
    topic: str,
    partitions: int,
    *,
    own: bool = False,
) -> OutRecord:
    """`result` of `cmd` on the context's results topic `topic`: in the command's reply
    partition (checked by the processor), or with `own` (or none asked) in the request
    id's partition."""
    partition = (
        cmd.reply_partition
        if cmd.reply_partition is not None and not own
        else partition_of(cmd.request_id, partitions)
    )
    return (topic, partition, cmd.request_id.encode(), encode(result))


def check_sizes(
    out: list[OutRecord], limits: InputLimits, catalog: TopicCatalog | None = None
) -> None:
    """`RecordTooLarge` when a record a decision writes is over the node's
    `max_record_bytes`: larger, this node's own reader would refuse it; or when, with its
    key, it is over what its topic takes (`InputLimits.topic_record_bytes`: one of the
    node's own made with a smaller `max.message.bytes`; else what a topic of the broker's
    defaults takes, `TOPIC_RECORD_BYTES`: with a bound near its 1 MiB most, a record
    within it and a long key), which fails the transaction at every retake. Not the
    aggregate it stores: no record holds that (it is folded from the events), and one
    grown past the bound before must still take commands. With `catalog`, a topic also
    takes at most what it said the topic takes when last read (`TopicCatalog.takes`:
    another context's commands topic made smaller, or one of the node's own lowered
    since its start)."""
    bound, takes = limits.max_record_bytes, limits.topic_record_bytes
    # Each topic's limit once a call: a decision's records share one or two topics.
    seen: dict[str, int] = {}
    for record in out:
        if (value := record[3]) is None:
            continue
        if len(value) > bound:
            raise RecordTooLarge(
                f"the decision writes a record of {len(value)} bytes to {record[0]}, over "
                f"{bound} (TICKWHEEL_MAX_RECORD_BYTES): nothing of it is written"
            )
        size = len(value) + len(record[2] or b"")
        if (limit := seen.get(topic := record[0])) is None:
            limit = seen[topic] = takes_at_most(topic, takes, catalog)
        if size > limit:
            raise RecordTooLarge(
                f"the decision writes a record of {size} bytes with its key to {record[0]}, "
                f"over {limit} ({topic_takes(limit)}): nothing of it is written"
            )


def written_in_process(record: Record) -> bool:
    """Whether a command record carries the header a node writes with a command it
    decided in-process (`IN_PROCESS_HEADER`): its own record of what it sent."""
    return any(name == IN_PROCESS_HEADER for name, _ in record.headers)


def unreachable(targets: TopicCatalog, target: AggregateRef) -> str | None:
    """Why a command to `target` cannot be sent (`Decision.send` raises it), or None."""
    return _unsent(targets, AggregateTopics(target.context, target.aggregate).commands)


def _unsent(targets: TopicCatalog, topic: str) -> str | None:
    """Why a record to `topic` is not written: the cluster has no such topic, or it
    refused this node's writes a moment ago (`TopicCatalog.refuses`); else None."""
    if targets.missing(topic):
        return no_target_message(topic)
    if (why := targets.refuses(topic)) is not None:
        return refused_message(topic, why)
    return None


def targeted(targets: TopicCatalog | None, d: Decided, where: str) -> Decided:
    """`d`, or ERROR (dead-lettered, not applied: a retry decides it again) when a
    command it sends goes to a topic the cluster does not have: the backstop of
    `Decision.send`'s check, for commands a handler put in `Decision.commands` itself."""
    if targets is None or not d.commands:
        return d
    for topic in dict.fromkeys(command_record(c)[0] for c in d.commands):
        if (message := _unsent(targets, topic)) is not None:
            logger.warning("%s: %s", where, message)
            return Decided(ResultCode.ERROR, message, [], None, error=MissingTopic(message))
    return d
