"""What the Kafka edge passes around: topic specs, records read, records to write; and
starting a client with its errors translated."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from aiokafka import errors as aiokafka_errors
from aiokafka.errors import (
    AuthenticationFailedError,
    BrokerResponseError,
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    InconsistentGroupProtocolError,
    InvalidGroupIdError,
    InvalidProducerEpoch,
    InvalidSessionTimeoutError,
    KafkaError,
    MessageSizeTooLargeError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    ProducerFenced,
    RecordListTooLargeError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)

from app.errors import KafkaUnavailable
from app.kafka.connection import Connectable, connection

logger = logging.getLogger(__name__)


_DENIED: tuple[tuple[type[KafkaError], str], ...] = (
    (TopicAuthorizationFailedError, "a topic (Describe, Read, Write or Create on it)"),
    (GroupAuthorizationFailedError, "the consumer group (Read, Describe)"),
    (TransactionalIdAuthorizationFailed, "a transactional id (Write, Describe)"),
    (ClusterAuthorizationFailedError, "the cluster (IdempotentWrite)"),
)


def explain(exc: BaseException) -> str:
    """A client library error in a user's terms: what was refused and what to check."""
    for kind, what in _DENIED:
        if isinstance(exc, kind):
            return (
                f"not authorized on {what}: {exc!r}; the principal needs the ACLs the "
                "README's 'Connecting to your Kafka' lists"
            )
    if isinstance(exc, SaslAuthenticationFailed | AuthenticationFailedError):
        return (
            f"authentication failed: {exc!r}; check KAFKA_SASL_MECHANISM, "
            "KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD (OAUTHBEARER: its "
            "KAFKA_SASL_OAUTHBEARER_* settings)"
        )
    return repr(exc)


_NEVER_JOINS = (InvalidSessionTimeoutError, InvalidGroupIdError, InconsistentGroupProtocolError)

_ACL_DENIED = tuple(kind for kind, _ in _DENIED)

_REFUSED = (*_ACL_DENIED, SaslAuthenticationFailed, AuthenticationFailedError)


def never_joins(exc: BaseException | None) -> bool:
    """Whether `exc` (or what it wraps) is the group turning this member's join down for
    good: a session timeout outside the broker's `group.min/max.session.timeout.ms`, a
    group id it does not take, a protocol its other members do not share. Retrying does
    not help; the node's settings or the group must change."""
    return _caused_by(exc, _NEVER_JOINS)


def refused(exc: BaseException | None) -> bool:
    """Whether `exc` (or what it wraps) is the cluster refusing this principal: an ACL
    missing or credentials wrong. Retrying does not help; an operator must act."""
    return _caused_by(exc, _REFUSED)


_TOO_LARGE = (MessageSizeTooLargeError, RecordListTooLargeError)


def too_large(exc: BaseException | None) -> bool:
    """Whether `exc` (or what it wraps) is the broker refusing a record or a batch as over
    its topic's `max.message.bytes` (either writer's: `rdkafka_errors.aiokafka_cause`)."""
    return _caused_by(exc, _TOO_LARGE)


_SHORT_OF_REPLICAS = (NotEnoughReplicasError, NotEnoughReplicasAfterAppendError)


def short_of_replicas(exc: BaseException | None) -> bool:
    """Whether `exc` (or what it wraps) is a partition with fewer in-sync replicas than its
    `min.insync.replicas` refusing a write: the cluster's state, not this node's, which
    passes by itself once the replicas are back."""
    return _caused_by(exc, _SHORT_OF_REPLICAS)


_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


def causes(exc: BaseException | None) -> Iterator[BaseException]:
    """`exc` and what it came from (`__cause__`), each once: a chain that loops back (an
    exception raised from itself) ends where it would."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__


def refused_topics(exc: BaseException | None) -> frozenset[str] | None:
    """The topics a topic refusal down `exc`'s chain of causes names (aiokafka's sender
    gives the set it was refused, its client one topic; librdkafka's only a message, so
    none), None when no topic was refused (a group, a transactional id, the cluster or
    the login was)."""
    for cause in causes(exc):
        if isinstance(cause, TopicAuthorizationFailedError):
            said = cause.args[0] if cause.args else ()
            named = [said] if isinstance(said, str) else said
            if not isinstance(named, (set, frozenset, list, tuple)):
                return frozenset()
            return frozenset(t for t in named if isinstance(t, str) and _TOPIC_NAME.fullmatch(t))
    return None


@dataclass(slots=True)
class TxnWork:
    """What a partition's open transaction has done, kept by its writer (either client's)
    for a refusal's message (`refused_work`): `wrote` its records' topics, `committing`
    then `offsets_sent` its consumed offsets, `ended` at its commit."""

    transactional_id: str
    written: set[str] = field(default_factory=set)
    """The topics its records went to."""
    group_id: str = ""
    offsets: tuple[tuple[str, int], ...] = ()
    """The partitions whose consumed offsets it commits for `group_id`."""
    at_offsets: bool = False
    """Refused while it committed the offsets (TxnOffsetCommit, AddOffsetsToTxn)."""

    def wrote(self, topics: Iterable[str]) -> None:
        self.written.update(topics)

    def committing(self, group_id: str, offsets: Iterable[tuple[str, int]]) -> None:
        self.group_id, self.offsets, self.at_offsets = group_id, tuple(offsets), True

    def offsets_sent(self) -> None:
        self.at_offsets = False

    def ended(self) -> None:
        self.written, self.offsets = set(), ()

    def refusal(
        self, exc: BaseException | None, principal: str, said: Callable[[KafkaError], str]
    ) -> str | None:
        """The ACL refusal down `exc`'s causes, said as `refused_work` says it (`said`: the
        client's own words for it); None for any other failure."""
        refusal = acl_refusal(exc)
        return None if refusal is None else refused_work(refusal, self, principal, said(refusal))


def acl_refusal(exc: BaseException | None) -> KafkaError | None:
    """The ACL refusal down `exc`'s chain of causes (a topic, the group, a transactional
    id, the cluster), None when there is none (a login refused is no ACL's)."""
    return next((c for c in causes(exc) if isinstance(c, _ACL_DENIED)), None)


def refused_work(refusal: KafkaError, work: TxnWork, principal: str, said: str) -> str:
    """What of `work` the ACL `refusal` refused, `said` (the client's refusal in a user's
    terms: `explain`), and the `kafka-acls.sh` command adding the ACL missing. A topic's
    refusal of an offsets commit names no topic (aiokafka's, librdkafka's): each topic of
    the offsets is named, and Read asked on each (TxnOffsetCommit's ACL)."""
    add = f"kafka-acls.sh --add --allow-principal {principal}"
    group = work.group_id or "<group id>"
    parts = ", ".join(f"{t}[{p}]" for t, p in sorted(work.offsets))
    offsets = f"committing group {group}'s offsets" + (f" of {parts}" if parts else "")
    if isinstance(refusal, TransactionalIdAuthorizationFailed):
        tid = work.transactional_id
        doing, acl = f"its transactional id {tid}", f"Write --transactional-id {tid}"
    elif isinstance(refusal, GroupAuthorizationFailedError):
        doing, acl = offsets, f"Read --group {group}"
    elif isinstance(refusal, ClusterAuthorizationFailedError):
        doing, acl = "writing as an idempotent producer", "IdempotentWrite --cluster"
    else:
        # aiokafka names the topics of records refused (AddPartitionsToTxn, Produce)
        named = refused_topics(refusal) or frozenset()
        reading = not named and (work.at_offsets or not work.written)
        topics = sorted(named or ({t for t, _ in work.offsets} if reading else work.written))
        doing = offsets if reading else f"writing to {', '.join(topics) or 'its topics'}"
        acl = ("Read" if reading else "Write") + (
            "".join(f" --topic {t}" for t in topics) or " --topic <topic>"
        )
    return f"{doing} was refused: {said}; add the ACL missing: {add} --operation {acl}"


def principal_of(where: Connectable) -> str:
    """The principal the cluster knows this node by, as `kafka-acls.sh` takes it: its
    SASL user; a certificate's principal is the broker's mapping of it, not known here."""
    user = connection(where).sasl_username
    return f"User:{user}" if user else "User:<principal>"


def _caused_by(exc: BaseException | None, kinds: tuple[type[BaseException], ...]) -> bool:
    """Whether `exc` or any exception down its chain of causes is one of `kinds`."""
    return any(isinstance(cause, kinds) for cause in causes(exc))


async def start_client(
    client: Any, what: str, said: Callable[[BaseException], str] = explain
) -> None:
    """Starts an aiokafka client, its failure said in our terms (`said`)."""
    try:
        await client.start()
    except KafkaError as exc:
        raise KafkaUnavailable(f"{what} cannot connect: {said(exc)}") from exc


TRANSACTION_TIMEOUT_MS = 60_000
"""The partitions' transactional producers' `transaction.timeout.ms`: a transaction the
broker sees open longer is aborted, and its producer fenced. Nothing may hold one open
near that long: the commit deadline (30 s) and the handler timeout (at most half of it)
are bounded by it."""

BROKER_MAX_MESSAGE_BYTES = 1_048_588
"""Kafka's default `message.max.bytes`: the largest record batch a topic takes unless set."""

RECORD_FRAMING = 512
"""What a record takes besides its key and value in a batch of its own: the batch's header
(61 bytes), the record's (its lengths and deltas) and the node's headers on it, with room."""

TOPIC_RECORD_BYTES = BROKER_MAX_MESSAGE_BYTES - RECORD_FRAMING
"""A record's key and value together, at most, that the node writes in a partition's
transaction: what a topic of the broker's defaults takes (the events, commands and timers
topics a node creates are so). Larger, the broker refuses it (MESSAGE_SIZE_TOO_LARGE, not
retried) and the transaction fails at every retake of the partition."""


def topic_takes(limit: int, topic: str | None = None) -> str:
    """What a record's bound `limit` is, said in an error: what its topic takes (`topic`
    named, with the bound, when given), its `max.message.bytes` less `RECORD_FRAMING`, for
    one that takes less than `TOPIC_RECORD_BYTES`; else what a topic of the broker's
    defaults takes."""
    if limit >= TOPIC_RECORD_BYTES:
        return "what a topic of the broker's defaults takes"
    which = "the topic takes" if topic is None else f"{topic} takes, {limit} bytes"
    return f"what {which}: its max.message.bytes less a record's framing"


@dataclass(frozen=True, slots=True)
class Replication:
    """How many brokers hold each partition of a topic the node creates, and how many must
    have a write before it is acknowledged (`min.insync.replicas`)."""

    factor: int = 3
    min_insync: int = 2


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    partitions: int
    compacted: bool = False
    max_message_bytes: int | None = None
    """The topic's `max.message.bytes` when created; None: the broker's default."""
    retained: bool = False
    """Every record kept for ever (`retention.ms=-1`, `retention.bytes=-1`): a log the node
    folds its states from again (a new node, a lost local copy) must hold it all."""
    segment_ms: int | None = None
    """The topic's `segment.ms` when created; None: the broker's default (7 days)."""
    delete_retention_ms: int | None = None
    """The topic's `delete.retention.ms` when created (how long compaction keeps a
    tombstone); None: the broker's default (a day)."""


@dataclass(frozen=True, slots=True)
class TopicConfigs:
    """Some topics' configs as the cluster told them: each one's values read (its own, else
    the broker's default), and why each other one could not be read (no DescribeConfigs
    ACL on it, say)."""

    read: dict[str, dict[str, str]] = field(default_factory=dict)
    unread: dict[str, str] = field(default_factory=dict)


class Record(NamedTuple):
    """One record read. A named tuple, not a frozen dataclass: one is made for every record
    a node reads (events, commands, changelog rows), and a tuple is made in a third of the
    time (~0.3 against ~0.8 µs; a frozen dataclass sets each field through
    `object.__setattr__`). Never compared with other tuples."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: Headers = ()


# Compacted, and never deleted by age or size; "delete" is in the policy only so that a
# rebuild may empty the topic with DeleteRecords (refused on a compact-only topic).

Headers = tuple[tuple[str, bytes | None], ...]
"""A record's headers, in order (a value may be null)."""

OutRecord = (
    tuple[str, int | None, bytes | None, bytes | None]
    | tuple[str, int | None, bytes | None, bytes | None, Headers]
)
"""(topic, partition or None for the key's default partition, key, value[, headers])."""


def headers_of(record: OutRecord) -> Headers:
    """An outgoing record's headers (none unless it has a fifth element)."""
    return record[4] if len(record) == 5 else ()


RestoreProgress = Callable[[int, int], None]
"""Told the offsets read so far and to read, as a restore goes."""


class ProducerFencedCode(BrokerResponseError):  # type: ignore[misc]  # aiokafka's is untyped
    """Kafka's PRODUCER_FENCED (90), which aiokafka does not know: a broker answers it to a
    transactional request of a newer version than aiokafka's fence handling expects (seen
    from Kafka 4.1's AddPartitionsToTxn), and aiokafka's sender dies on it as on an
    unknown error ("Unexpected error during batch delivery")."""

    errno = 90
    message = "PRODUCER_FENCED"
    description = "There is a newer producer with the same transactional id."


aiokafka_errors.kafka_errors.setdefault(ProducerFencedCode.errno, ProducerFencedCode)

_FENCES = (ProducerFenced, InvalidProducerEpoch, ProducerFencedCode)


def fenced_by(exc: BaseException | None) -> bool:
    """Whether `exc`, or what it came from (aiokafka's sender wraps what killed it), is
    a fence: a newer producer of the transactional id."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, _FENCES):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


class FencedInstanceIdCode(BrokerResponseError):  # type: ignore[misc]  # aiokafka's is untyped
    """Kafka's FENCED_INSTANCE_ID (82), which aiokafka does not know: the group's
    coordinator refuses a static member (`group.instance.id`) whose id another member
    joined with since. aiokafka wraps it in a bare `KafkaError` carrying its repr only."""

    errno = 82
    message = "FENCED_INSTANCE_ID"
    description = "Another member joined the group with this member's group.instance.id."


aiokafka_errors.kafka_errors.setdefault(FencedInstanceIdCode.errno, FencedInstanceIdCode)

_FENCED_INSTANCE_SAID = f"{FencedInstanceIdCode.__name__}("


def instance_fenced(exc: BaseException | None) -> bool:
    """Whether `exc` (or what it came from) is the coordinator fencing this static member:
    another worker runs with its `group.instance.id`. aiokafka raises what a join, a sync or
    a heartbeat answered as `KafkaError(repr(error))`: the repr is all that is left of it."""
    return any(
        isinstance(cause, FencedInstanceIdCode) or _FENCED_INSTANCE_SAID in str(cause)
        for cause in causes(exc)
    )
