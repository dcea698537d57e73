"""Operators' retry and skip of parked timers, carried through Kafka to the timers' owners.

Any client may ask (`request_retry`, `request_skip`): it writes one `TimerOp` record to
every partition of the owner type's `<context>.<aggregate>.timer-ops` topic, because the
parked timers of one target can sit in any partition. The node that owns partition p of
that type (the same p of every topic: one consumer group, range assignment) reads the
record in its group and retries or skips the PARKED timers of partition p only
(`carry_out`), then commits the record's offset: once per request id in the node's
de-duplication window (`app.timers.applied_ops`), so a request sent again under its id
(after a send that failed) changes nothing more. The ledger entry is resolved by each,
by its partition's next timer round once the rows are settled (a cycle calls no ledger);
resolving is idempotent.

Also here: reading the timer table from its changelog, for `tickwheel timers list` and
`tickwheel timers show`. Those reads create no topic: one that is not there is a
`MissingTopic` error naming it.

Everything here reaches the cluster through its clients (`app.kafka.ports.Clients`): the
CLI's are Kafka's, a node's page hands its own, the tests a `MemoryLog`.
"""

from __future__ import annotations

import logging
import time
import uuid
from contextlib import aclosing

from pydantic import BaseModel, ConfigDict, Field

from app.errors import (
    KafkaUnavailable,
    MissingTopic,
    NoTimers,
)
from app.kafka.cluster import count_differs, existing_topics, require_topic
from app.kafka.ports import Clients
from app.kafka.records import OutRecord, Record
from app.protocol.topics import parse_aggregate_type
from app.protocol.wire import TimerAction, TimerOp, encode
from app.timers.runner import TimerRunner
from app.timers.runner.operating import Operated
from tables.keys import owner_prefix, restored_row
from tables.owners import TableOwners
from tables.partitioner import partition_of
from tables.refs import AggregateRef
from tables.timer import Timer, TimerStatus
from tables.tombstones import DELETED_KEY, is_deletion_mark

__all__ = [
    "NoTimers",
    "TimerAction",
    "TimerHistory",
    "TimerOp",
    "TimerVersion",
    "carry_out",
    "new_op",
    "op_records",
    "read_timer_history",
    "read_timers",
    "request_retry",
    "request_skip",
    "send_op",
]

logger = logging.getLogger(__name__)


def new_op(
    action: TimerAction,
    target: AggregateRef,
    now: int | None = None,
    *,
    request_id: str | None = None,
    past_window: bool = False,
) -> TimerOp:
    """A request under `request_id` (a fresh one by default: the same id sent again within
    the node's de-duplication window is carried out once), made `now` (epoch ms; the wall
    clock by default); `past_window`: a retry of timers whose slot its target may have
    forgotten too (`TimerOp.past_window`)."""
    return TimerOp(
        request_id=request_id or uuid.uuid4().hex,
        action=action,
        target=target,
        requested_at=time.time_ns() // 1_000_000 if now is None else now,
        past_window=past_window,
    )


def op_records(topic: str, op: TimerOp, partitions: int) -> list[OutRecord]:
    """The op once in each partition of `topic`: the owners of all of them act on it."""
    key = str(op.target).encode()
    value = encode(op)
    return [(topic, p, key, value) for p in range(partitions)]


async def request_retry(
    clients: Clients,
    type_name: str,
    target: AggregateRef,
    partitions: int,
    *,
    request_id: str | None = None,
    past_window: bool = False,
) -> TimerOp:
    """Asks the owners of `type_name`'s timers to retry those PARKED on `target`; under
    `request_id` (fresh by default), which a copy sent again shares (its DUPLICATE);
    `past_window`: those whose slot is past the request-id window too (`retry_parked`)."""
    return await _request(
        clients, type_name, TimerAction.RETRY, target, partitions, request_id, past_window
    )


async def request_skip(
    clients: Clients,
    type_name: str,
    target: AggregateRef,
    partitions: int,
    *,
    request_id: str | None = None,
) -> TimerOp:
    """Asks the owners of `type_name`'s timers to skip those PARKED on `target`; under
    `request_id` as for `request_retry`."""
    return await _request(clients, type_name, TimerAction.SKIP, target, partitions, request_id)


async def _request(
    clients: Clients,
    type_name: str,
    action: TimerAction,
    target: AggregateRef,
    partitions: int,
    request_id: str | None,
    past_window: bool = False,
) -> TimerOp:
    """Writes the op to every partition; returns once the broker acknowledged them all.

    `ConfigError` for a bad type name; `KafkaUnavailable` when the broker is not there or
    the topic has another partition count than `partitions`.
    """
    op = new_op(action, target, request_id=request_id, past_window=past_window)
    await send_op(clients, type_name, op, partitions)
    return op


async def send_op(clients: Clients, type_name: str, op: TimerOp, partitions: int) -> list[int]:
    """Writes `op` to every partition of `type_name`'s timer-ops topic; its offsets there,
    by partition, once the broker acknowledged them all. `ConfigError` and
    `KafkaUnavailable` as `_request` says; `MissingTopic` (nothing written) when the topic
    is not there: the workers make it, and an operator's request makes no topic (a
    mistyped type made one of 12 partitions, and said the request was sent)."""
    topics = parse_aggregate_type(type_name)
    topic = topics.timer_ops
    admin = clients.admin()
    found = await existing_topics(admin, [topics.events, topic])
    if topic not in found:
        said = (
            f"unknown type {type_name}: topics {topics.events} and {topic} do not exist"
            if not found
            else f"topic {topic} of {type_name} does not exist"
        )
        raise MissingTopic(
            f"{said} at {admin.where()} (no worker of {type_name} has run against this "
            "cluster?); nothing was created or sent"
        )
    if found[topic] != partitions:
        raise count_differs(topic, found[topic], partitions)
    producer = clients.publisher()
    try:
        await producer.start()
        offsets = await producer.send_many(op_records(topic, op, partitions))
    finally:
        await producer.stop()
    logger.info(
        "%s of %s requested on %d partition(s) of %s", op.action, op.target, partitions, topic
    )
    return offsets


async def carry_out(
    runner: TimerRunner, op: TimerOp, partition: int, *, resolve_later: bool = False
) -> Operated:
    """What the owner of `partition` does with an op read from it: acts on the PARKED
    timers of that partition only (the owners of the others read their own copy); what it
    changed, and the retries it refused (`TimerOp.past_window`). `resolve_later`: the
    ledger entry is resolved by the partition's next round, not here (its cycle calls no
    ledger)."""
    logger.info(
        "operator %s of %s (request %s%s) in partition %d",
        op.action,
        op.target,
        op.request_id,
        ", past the request-id window" if op.past_window else "",
        partition,
    )
    if op.action is TimerAction.RETRY:
        return await runner.retry_counted(
            op.target, {partition}, resolve_later=resolve_later, past_window=op.past_window
        )
    skipped = await runner.skip(op.target, {partition}, resolve_later=resolve_later)
    return Operated(skipped)


async def read_timers(
    clients: Clients,
    type_name: str,
    partitions: int | None = None,
    status: TimerStatus | None = None,
) -> list[Timer]:
    """The timer table of `type_name` as its changelog has it: the latest row per key,
    deleted rows left out; only those in `status` if given. By partition, then due time.

    Creates no topic: `MissingTopic` when the changelog is not there. `partitions`, when
    given, is the count the topic must have (`KafkaUnavailable` otherwise).
    """
    topics = parse_aggregate_type(type_name)
    topic = topics.timers_changelog
    why = f"no worker has kept timers of {type_name} there"
    have = await require_topic(clients.admin(), topic, why)
    if partitions is not None and have != partitions:
        raise KafkaUnavailable(f"topic {topic} has {have} partitions, expected {partitions}")
    owners = TableOwners(topics.context, topics.aggregate, have)
    rows: dict[tuple[int, bytes], Timer] = {}
    async with clients.reader() as reader:
        for p in range(have):
            async with aclosing(reader.read(topic, p, 0)) as batches:
                async for batch in batches:
                    for r in batch:
                        if r.key is None:
                            continue
                        if r.value is None:
                            rows.pop((r.partition, r.key), None)
                            continue
                        row = _row(r, owners)
                        if row is not None:  # else the key's earlier row stays, as restored
                            rows[(r.partition, r.key)] = row
    # An owner's deletion mark is no timer (`tables.tombstones`); a tombstone is a key
    # cancelled before any set of it was read: a CANCELLED row, shown as one.
    timers = [
        t
        for t in rows.values()
        if (status is None or t.status is status) and not is_deletion_mark(t)
    ]
    return sorted(timers, key=lambda t: (t.partition, t.due_at, t.id))


def _row(r: Record, owners: TableOwners) -> Timer | None:
    """The row a changelog record holds, as a node's restore takes it (`restored_row`);
    None (logged) when it is none: garbage, a row under another key than its own, of
    another partition, or of an owner `owners` does not put there."""
    if r.value is None or r.key is None:
        return None
    try:
        return restored_row(r.partition, r.key, r.value, owners)
    except ValueError as exc:
        reason = str(exc).replace("\n", "; ")
        logger.warning("unreadable row at %s[%d]@%d: %s", r.topic, r.partition, r.offset, reason)
        return None


class TimerVersion(BaseModel):
    """One record of a timer in its changelog: the row as written then, None when it was
    deleted."""

    model_config = ConfigDict(frozen=True)

    key: str
    partition: int
    offset: int
    timestamp: int = Field(description="the record's timestamp, epoch ms")
    row: Timer | None


class TimerHistory(BaseModel):
    """An owner's timers as the changelog holds them, per key in log order."""

    model_config = ConfigDict(frozen=True)

    topic: str
    partition: int
    owner: AggregateRef
    versions: dict[str, list[TimerVersion]]

    def current(self, key: str) -> Timer | None:
        """The key's row now: its last version (None: deleted)."""
        return self.versions[key][-1].row


async def read_timer_history(
    clients: Clients, owner: AggregateRef, key: str | None = None
) -> TimerHistory:
    """Every version of `owner`'s timers (of `key` only, if given) that the changelog's
    committed records still hold. Compaction keeps at least each key's last version; the
    older ones are there until the broker compacts them away.

    Creates nothing. `MissingTopic` when the type is unknown to the cluster or has no
    changelog; `NoTimers` when the owner (or the key) has no record in it.
    """
    topics = parse_aggregate_type(owner.type_name)
    topic = topics.timers_changelog
    admin = clients.admin()
    found = await existing_topics(admin, [topics.events, topic])
    if not found:
        raise MissingTopic(
            f"unknown type {owner.type_name}: topics {topics.events} and {topic} do not exist "
            f"at {admin.where()} (no worker has run against this cluster?); "
            "nothing was created"
        )
    if topic not in found:
        raise MissingTopic(
            f"topic {topic} does not exist at {admin.where()} (no worker has kept timers of "
            f"{owner.type_name} there?); nothing was created"
        )
    # An owner's rows all sit in its partition: the one its id is keyed to.
    partition = partition_of(owner.id, found[topic])
    prefix = owner_prefix(owner)
    owners = TableOwners(owner.context, owner.aggregate, found[topic])
    versions: dict[str, list[TimerVersion]] = {}
    async with (
        clients.reader() as reader,
        aclosing(reader.read(topic, partition, 0)) as batches,
    ):
        async for batch in batches:
            for r in batch:
                version = _version(r, prefix, partition, owners)
                if version is not None:
                    versions.setdefault(version.key, []).append(version)
    where = f"{topic}[{partition}]"
    if not versions:
        raise NoTimers(f"{owner} has no timers in {where}")
    if key is not None:
        if key not in versions:
            raise NoTimers(
                f"{owner} has no timer {key!r} in {where} (its timers: "
                f"{', '.join(sorted(versions))})"
            )
        versions = {key: versions[key]}
    return TimerHistory(topic=topic, partition=partition, owner=owner, versions=versions)


def _version(r: Record, prefix: bytes, partition: int, owners: TableOwners) -> TimerVersion | None:
    """The version of one of the owner's timers `r` holds; None for a record of another
    owner's, or one a restore passes over (its key's earlier version stays current)."""
    if r.key is None or not r.key.startswith(prefix):
        return None
    name = _key_of(r.key, len(prefix))
    if name is None or name == DELETED_KEY:  # a deletion mark is no timer
        return None
    row = _row(r, owners)
    if r.value is not None and row is None:
        return None
    return TimerVersion(
        key=name, partition=partition, offset=r.offset, timestamp=r.timestamp, row=row
    )


def _key_of(raw: bytes, start: int) -> str | None:
    """The timer key a row key holds after its owner's prefix (`tables.keys.row_key`);
    None for bytes that are not one (a foreign writer's record)."""
    rest = raw[start:]
    if len(rest) < 2 or int.from_bytes(rest[:2], "big") != len(rest) - 2:
        return None
    try:
        return rest[2:].decode()
    except UnicodeDecodeError:
        return None
