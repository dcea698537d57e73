"""What the runtime needs of Kafka, as Protocols: the ports at the Kafka edge.

Derived from how the runtime uses its clients, and no more:

- `TransactionalWriter`: one partition's transactional producer (`PartitionTransaction`):
  `start` fences the previous writer of the same transactional id, `commit` writes records
  and a group's consumer offsets in one transaction, `broken` says it failed for good.
- `LogReader`: reads a partition's committed records to its end (restores, read_committed).
- `Publisher`: sends records outside any transaction (the timers' commands, the ledger);
  a `PublisherClient`'s `failed` ends when it can send no more (its sender gone).
- `Follower`: follows a changing set of one topic's partitions from their ends (the
  results of this node's sends, the ledger).
- `GroupMember`: the consumer-group member whose assignment is the node's ownership.
- `Admin`: topics created and their configs read, the cluster's id, one look at the
  broker; and what the operators' tools ask (topics found, creating none; a group's
  members and committed offsets, set back by a rebuild; a log's offsets and records
  deleted).
- `Clients`: makes all of those; one per cluster (`KafkaClients` over aiokafka, or
  `app.kafka.memory.MemoryLog`).

`app.kafka`'s classes implement them over aiokafka (`TransactionalProducer`, `Reader`,
`Producer`, `PartitionReader`), over librdkafka (`RdkafkaTransactionalWriter`,
`RdkafkaReader`: `KafkaClients(client="confluent")`), and `app.kafka.memory.MemoryLog` in
memory, with the same transactions, fencing and read-committed visibility (its module
checks both for mypy).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Sequence
from typing import Final, Protocol, Self

from app.errors import KafkaUnavailable
from app.kafka.records import OutRecord, Record, TopicConfigs, TopicSpec

__all__ = [
    "POLL_FAILING_S",
    "Admin",
    "Assigned",
    "Clients",
    "DeletedUnread",
    "Follower",
    "FollowerFactory",
    "GroupMember",
    "LogReader",
    "Publisher",
    "PublisherClient",
    "ReaderClient",
    "TransactionalWriter",
    "WriterFactory",
]

POLL_FAILING_S: Final = 60.0
"""Polls failing this long, none passing, fail for good: a batch corrupt on a broker's disk
fails every poll that fetches it (a `GroupMember`'s, a `Follower`'s), and a reader that
retried it for ever would read nothing while its node said it was ready. A broker or a
group in flux passes well within it. The node's readers stop it, loudly, past it
(`app.node.polling`, `app.timers.sender.FollowerPolls`); and so does a partition whose
fetches went unanswered that long while records wait (an error the client only logs, its
polls passing: `app.kafka.fetch_stalls`); the group's offset commits
failing, none landing, stop it after a bound of their own (`app.node.polling`)."""


class TransactionalWriter(Protocol):
    """A partition's transactional producer: its records and consumer offsets commit
    together or not at all, and a newer writer of its transactional id fences it."""

    @property
    def transactional_id(self) -> str: ...

    @property
    def broken(self) -> KafkaUnavailable | None:
        """What broke it for good (`Fenced` when a newer writer started): every later call
        raises it at once."""
        ...

    async def start(self) -> None:
        """Registers the transactional id, fencing its previous writer (whose open
        transaction is aborted)."""
        ...

    async def stop(self) -> None:
        """Closes it; never raises. An open transaction is not committed."""
        ...

    async def commit(
        self,
        records: Sequence[OutRecord],
        offsets: dict[tuple[str, int], int],
        group_id: str,
    ) -> list[int]:
        """Writes `records` and commits `offsets` for `group_id` in one transaction; the
        records' offsets. `Fenced` when a newer writer started; any other failure aborts
        the transaction and raises `KafkaUnavailable`; either breaks the writer."""
        ...


WriterFactory = Callable[[str], TransactionalWriter]
"""A transactional id → its writer, not started yet."""


class LogReader(Protocol):
    """Reads whole partitions, committed records only (read_committed)."""

    async def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        """(first offset still held, last stable offset) of the partition."""
        ...

    def read(self, topic: str, partition: int, start: int) -> AsyncGenerator[list[Record], None]:
        """The committed records from `start` to the partition's last stable offset as it
        is now, in batches (transaction markers and aborted records take offsets but are
        never returned).

        A reader reads one partition at a time: a read holds it (its lock, its consumer's
        assignment) until it ends or is closed, and the next read or `offsets` waits for
        that. A loop that may be left early (a return, a break, an exception) reads it in
        `contextlib.aclosing`: a generator left unclosed is closed only once collected,
        by the event loop's finalizer, later and not at all while anything (a traceback's
        frame) still holds it."""
        ...


class ReaderClient(LogReader, Protocol):
    """A `LogReader` with its lifecycle (`async with`: started, and stopped after)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc: object) -> None: ...


class Publisher(Protocol):
    """Sends records outside any transaction; returns once the broker has them all."""

    async def send(
        self, topic: str, key: bytes | None, value: bytes | None, partition: int | None = None
    ) -> int: ...

    async def send_many(self, records: Sequence[OutRecord]) -> list[int]:
        """Sends (topic, partition or None for the key's default, key, value) records;
        their offsets once acknowledged."""
        ...


class PublisherClient(Publisher, Protocol):
    """A `Publisher` with its lifecycle."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def failed(self) -> None:
        """Runs (after `start`) while the publisher can send; raises `KafkaUnavailable`,
        saying why, once it can send no more, for good (aiokafka's sender task ended: every
        later send would raise its error, or wait for ever). Never returns; its owner
        cancels it before `stop`, which ends the publisher's sending too."""
        ...


class Follower(Protocol):
    """Follows a changing set of one topic's partitions, each from its end when added
    (committed records only)."""

    @property
    def topic(self) -> str: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def add(self, partition: int) -> None: ...

    async def remove(self, partition: int) -> None: ...

    async def poll(self, timeout_ms: int = 200) -> list[Record]:
        """The records committed since the last poll; [] after `timeout_ms` without any.
        One that raises hands nothing out and skips nothing: the next reads it again.
        `FetchRefused` (for good, `app.kafka.fetch_stalls.FetchStalled`) when a partition's
        fetches went unanswered for `POLL_FAILING_S` while records wait behind its position
        (an error the client only logs): every other poll passes meanwhile."""
        ...


FollowerFactory = Callable[[str], Follower]
"""A topic → a follower of it, not started yet."""


Assigned = Callable[[set[tuple[str, int]]], Awaitable[None]]
"""A rebalance callback: told the (topic, partition)s assigned or revoked."""

DeletedUnread = Callable[[str, int, int], None]
"""Told (topic, partition, how many) of records a group member read past because they
were deleted (retention, DeleteRecords) before it read them: at a take, or while it ran."""


class GroupMember(Protocol):
    """A consumer-group member whose assignment is the node's partition ownership: the
    range assignor gives partition p of every topic to one member (co-partitioning), and
    the callbacks are awaited before fetching resumes; read_committed."""

    async def start(self) -> None:
        """Joins the group (the callbacks tell the assignment)."""
        ...

    async def stop(self) -> None: ...

    async def poll(self, timeout_ms: int = 500) -> dict[tuple[str, int], list[Record]]:
        """The records fetched of the assigned, unpaused partitions; `KafkaUnavailable`
        when the broker or the group does not answer. One that raises hands nothing out
        and moves no partition past a record it did not hand out. A partition whose
        records were deleted ahead of its position reads on from its start, said and
        counted (`on_deleted`), never silently. `FetchRefused` (for good: the node stops)
        when a partition reads nothing for too long though its log holds its position:
        refused as out of range (`app.kafka.in_log_refusals`), or its fetches unanswered
        while records wait (`app.kafka.fetch_stalls.FetchStalled`, after `POLL_FAILING_S`)."""
        ...

    async def commit(self, offsets: dict[tuple[str, int], int]) -> None:
        """Commits the next offsets to read; `KafkaUnavailable` when the group moved on."""
        ...

    async def backlog(self, topic: str, partition: int) -> int:
        """How many records of the partition wait behind what was fetched."""
        ...

    def pause(self, partitions: Iterable[tuple[str, int]]) -> None: ...

    def resume(self, partitions: Iterable[tuple[str, int]]) -> None: ...

    async def rewind(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Reads these partitions again from the group's committed offsets (the start
        where none is committed); the offset each assigned one reads from now."""
        ...

    def seek(self, topic: str, partition: int, offset: int) -> bool:
        """Reads the partition again from `offset`; False when it is no longer assigned."""
        ...

    def assignment(self) -> set[tuple[str, int]]: ...


class Admin(Protocol):
    """What a node asks of the cluster itself."""

    async def ensure_topics(self, specs: Iterable[TopicSpec]) -> None:
        """Creates the topics not there yet; one with another partition count is an error."""
        ...

    async def cluster_id(self) -> str: ...

    async def topic_names(self) -> set[str]:
        """The names of all the cluster's topics (a request naming none: creates none)."""
        ...

    async def max_message_bytes(self, topic: str) -> int:
        """The largest record `topic` accepts (its `max.message.bytes`)."""
        ...

    async def topic_configs(self, topics: Sequence[str], names: Sequence[str]) -> TopicConfigs:
        """The configs `names` of `topics`, each the topic's own value else the broker's
        default (one DescribeConfigs); `KafkaUnavailable` when the call fails whole, a
        topic's own refusal (its ACL) said in `unread`."""
        ...

    async def replicas(self, topics: Sequence[str]) -> tuple[int, dict[str, int]]:
        """(how many brokers the cluster has live, the replicas of each of `topics` it has:
        its partition's with the fewest); creates none."""
        ...

    async def probe(self) -> str | None:
        """One look at the broker (the `BrokerWatch`'s): None when it answered, else why not."""
        ...

    async def check_access(self) -> None:
        """`KafkaUnavailable` at once when the cluster refuses this client (its TLS
        handshake, its SASL login): before the clients start, so that it is said once."""
        ...

    # What the operators' tools ask (`app.kafka.cluster`, `app.ops`, `app.timers`).

    def where(self) -> str:
        """Where the cluster is (and how it is reached), for messages."""
        ...

    async def existing_topics(self, names: Iterable[str]) -> dict[str, int]:
        """The partition counts of those of `names` the cluster has; creates none."""
        ...

    async def group_members(self, group_id: str) -> int:
        """How many members the consumer group has now."""
        ...

    async def committed_offsets(
        self, group_id: str, partitions: Iterable[tuple[str, int]]
    ) -> dict[tuple[str, int], int | None]:
        """The group's committed offset of each (topic, partition); None where it has none.
        Joins nothing: the group's members are not disturbed."""
        ...

    async def log_offsets(self, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
        """Per partition of an existing `topic`: (first offset held, high watermark; the
        high watermark counts the records of transactions still open)."""
        ...

    async def delete_records(self, topic: str, before: dict[int, int]) -> dict[int, int]:
        """Deletes the records of `topic` before `before[p]` in each partition p given; the
        new first offset per partition."""
        ...

    async def reset_group_offsets(
        self, group_id: str, topic: str, partitions: int, offset: int = 0
    ) -> None:
        """Sets the group's committed offset of every partition of `topic` to `offset`
        (the group must have no member)."""
        ...


class Clients(Protocol):
    """Makes the clients of one cluster (none of them started)."""

    def transactional_writer(
        self,
        transactional_id: str,
        *,
        max_batch_bytes: int | None = None,
        topics: Iterable[str] = (),
    ) -> TransactionalWriter:
        """`max_batch_bytes`: its batches' largest size per partition (None: 512 KiB),
        under the `max.message.bytes` of the topics it writes. `topics`: those it will write
        for sure, whose metadata its start fetches (so that its first commit need not)."""
        ...

    def reader(self) -> ReaderClient: ...

    def publisher(self) -> PublisherClient: ...

    def follower(self, topic: str) -> Follower: ...

    def admin(self) -> Admin: ...

    def group_member(
        self,
        group_id: str,
        topics: Sequence[str],
        *,
        on_assigned: Assigned,
        on_revoked: Assigned,
        session_timeout_ms: int,
        group_instance_id: str | None = None,
        on_deleted: DeletedUnread | None = None,
    ) -> GroupMember:
        """`group_instance_id`: a static member (KIP-345), whose stop leaves its partitions
        to it for a session; a second member of the same id fences the first, whose poll
        then raises `KafkaUnavailable` (`app.kafka.records.instance_fenced`); None: a
        dynamic member. `on_deleted`: told of records it reads past, deleted before it
        read them (each also logged as an error)."""
        ...
