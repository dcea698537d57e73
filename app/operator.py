"""Operators' retry and skip of parked timers, carried through Kafka to the timers' owners.

Any client may ask (`request_retry`, `request_skip`): it writes one `TimerOp` record to
every partition of the owner type's `<context>.<aggregate>.timer-ops` topic, because the
parked timers of one target can sit in any partition. The node that owns partition p of
that type (the same p of every topic: one consumer group, range assignment) reads the
record in its group and retries or skips the PARKED timers of partition p only
(`carry_out`), then commits the record's offset. The ledger entry is resolved by each;
resolving is idempotent.

Also here: reading the timer table from its changelog, for `tickwheel timers list`.
"""

from __future__ import annotations

import logging
import time
import uuid
from enum import StrEnum

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.kafka import OutRecord, Producer, TopicSpec, ensure_topics, read_partitions
from app.runner import TimerRunner
from app.topics import AggregateTopics, parse_aggregate_type
from app.wire import encode
from tables.refs import AggregateRef
from tables.timer import Timer, TimerStatus

__all__ = [
    "TimerAction",
    "TimerOp",
    "carry_out",
    "new_op",
    "op_records",
    "read_timers",
    "request_retry",
    "request_skip",
]

logger = logging.getLogger(__name__)


class TimerAction(StrEnum):
    RETRY = "retry"
    """The PARKED timers due now, their attempts reset."""
    SKIP = "skip"
    """The PARKED timers CANCELLED with the outcome SKIPPED."""


class TimerOp(BaseModel):
    """One operator's request on the PARKED timers of `target`, on the timer-ops topic.

    Unknown fields are kept, as on every other topic.
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    request_id: str = Field(min_length=1, max_length=200, description="unique per request")
    action: TimerAction
    target: AggregateRef = Field(description="the aggregate the parked timers send to")
    requested_at: int = Field(ge=0, description="epoch ms when the operator asked")


def new_op(action: TimerAction, target: AggregateRef, now: int | None = None) -> TimerOp:
    """A request with a fresh id, made `now` (epoch ms; the wall clock by default)."""
    return TimerOp(
        request_id=uuid.uuid4().hex,
        action=action,
        target=target,
        requested_at=time.time_ns() // 1_000_000 if now is None else now,
    )


def op_records(topic: str, op: TimerOp, partitions: int) -> list[OutRecord]:
    """The op once in each partition of `topic`: the owners of all of them act on it."""
    key = str(op.target).encode()
    value = encode(op)
    return [(topic, p, key, value) for p in range(partitions)]


async def request_retry(
    bootstrap: str, type_name: str, target: AggregateRef, partitions: int
) -> TimerOp:
    """Asks the owners of `type_name`'s timers to retry those PARKED on `target`."""
    return await _request(bootstrap, type_name, TimerAction.RETRY, target, partitions)


async def request_skip(
    bootstrap: str, type_name: str, target: AggregateRef, partitions: int
) -> TimerOp:
    """Asks the owners of `type_name`'s timers to skip those PARKED on `target`."""
    return await _request(bootstrap, type_name, TimerAction.SKIP, target, partitions)


async def _request(
    bootstrap: str, type_name: str, action: TimerAction, target: AggregateRef, partitions: int
) -> TimerOp:
    """Writes the op to every partition; returns once the broker acknowledged them all.

    `ConfigError` for a bad type name; `KafkaUnavailable` when the broker is not there or
    the topic has another partition count than `partitions`.
    """
    topic = parse_aggregate_type(type_name).timer_ops
    await ensure_topics(bootstrap, [TopicSpec(topic, partitions)])
    op = new_op(action, target)
    producer = Producer(bootstrap)
    try:
        await producer.start()
        await producer.send_many(op_records(topic, op, partitions))
    finally:
        await producer.stop()
    logger.info("%s of %s requested on %d partition(s) of %s", action, target, partitions, topic)
    return op


async def carry_out(runner: TimerRunner, op: TimerOp, partition: int) -> int:
    """What the owner of `partition` does with an op read from it: acts on the PARKED
    timers of that partition only (the owners of the others read their own copy)."""
    logger.info(
        "operator %s of %s (request %s) in partition %d",
        op.action,
        op.target,
        op.request_id,
        partition,
    )
    if op.action is TimerAction.RETRY:
        return await runner.retry(op.target, partitions={partition})
    return await runner.skip(op.target, partitions={partition})


async def read_timers(
    bootstrap: str, type_name: str, partitions: int, status: TimerStatus | None = None
) -> list[Timer]:
    """The timer table of `type_name` as its changelog has it: the latest row per key,
    deleted rows left out; only those in `status` if given. By partition, then due time.

    The changelog topic is created if it is not there yet, as for `read_ledger`.
    """
    topics: AggregateTopics = parse_aggregate_type(type_name)
    topic = topics.timers_changelog
    await ensure_topics(bootstrap, [TopicSpec(topic, partitions, compacted=True)])
    rows: dict[tuple[int, bytes], Timer] = {}
    async for batch in read_partitions(bootstrap, topic, range(partitions)):
        for r in batch:
            p = r.partition
            if r.key is None:
                continue
            if r.value is None:
                rows.pop((p, r.key), None)
                continue
            try:
                rows[(p, r.key)] = Timer.model_validate(orjson.loads(r.value))
            except (orjson.JSONDecodeError, ValidationError) as exc:
                logger.warning("unreadable row at %s[%d]@%d: %s", topic, p, r.offset, exc)
    timers = [t for t in rows.values() if status is None or t.status is status]
    return sorted(timers, key=lambda t: (t.partition, t.due_at, t.id))
