"""What the runtime needs of Kafka, as Protocols: the ports at the Kafka edge.

Derived from how the runtime uses its clients, and no more:

- `TransactionalWriter`: one partition's transactional producer (`TransactionalChangelog`):
  `start` fences the previous writer of the same transactional id, `commit` writes records
  and a group's consumer offsets in one transaction, `broken` says it failed for good.
- `LogReader`: reads a partition's committed records to its end (restores, read_committed).
- `Publisher`: sends records outside any transaction (the timers' commands, the ledger).
- `Follower`: follows a changing set of one topic's partitions from their ends (the
  results of this node's sends, the ledger).
- `Clients`: makes all of those; one per cluster (`KafkaClients` over aiokafka, or
  `app.kafka.memory.MemoryLog`).

`app.kafka`'s classes implement them over aiokafka (`TransactionalProducer`, `Reader`,
`Producer`, `PartitionReader`), and `app.kafka.memory.MemoryLog` in memory, with the same
transactions, fencing and read-committed visibility (its module checks both for mypy).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol

from app.errors import KafkaUnavailable
from app.kafka.records import OutRecord, Record

__all__ = [
    "Clients",
    "Follower",
    "FollowerFactory",
    "LogReader",
    "Publisher",
    "PublisherClient",
    "ReaderClient",
    "TransactionalWriter",
    "WriterFactory",
]


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

    def read(self, topic: str, partition: int, start: int) -> AsyncIterator[list[Record]]:
        """The committed records from `start` to the partition's last stable offset as it
        is now, in batches (transaction markers and aborted records take offsets but are
        never returned)."""
        ...


class ReaderClient(LogReader, Protocol):
    """A `LogReader` with its lifecycle."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


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
        """The records committed since the last poll; [] after `timeout_ms` without any."""
        ...


FollowerFactory = Callable[[str], Follower]
"""A topic → a follower of it, not started yet."""


class Clients(Protocol):
    """Makes the clients of one cluster (none of them started)."""

    def transactional_writer(self, transactional_id: str) -> TransactionalWriter: ...

    def reader(self) -> ReaderClient: ...

    def publisher(self) -> PublisherClient: ...

    def follower(self, topic: str) -> Follower: ...
