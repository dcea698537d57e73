"""The in-memory log's partitions (`app.kafka.memory`): a partition's records (`Entry`),
its offsets, and the transactions that wrote to it (`Txn`), open ones holding its last
stable offset back; and the broker's topic config defaults it models. May import
`app.kafka.records` only."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from app.kafka.records import Headers

__all__ = ["BROKER_DEFAULTS", "Entry", "Key", "Partition", "Txn"]

Key = tuple[str, int]

BROKER_DEFAULTS = {
    "cleanup.policy": "delete",
    "retention.ms": "604800000",
    "retention.bytes": "-1",
    "min.insync.replicas": "1",
    "delete.retention.ms": "86400000",
}


@dataclass(eq=False, slots=True)
class Txn:
    """One transaction of a transactional id's epoch."""

    transactional_id: str
    epoch: int
    state: Literal["open", "committed", "aborted"] = "open"
    # The partitions written to, each with the transaction's first offset there.
    first: dict[Key, int] = field(default_factory=dict)
    # Consumer-group offsets sent to the transaction, per group.
    offsets: dict[str, dict[Key, int]] = field(default_factory=dict)


@dataclass(slots=True)
class Entry:
    key: bytes | None
    value: bytes | None
    timestamp: int
    txn: Txn | None = None
    marker: bool = False
    headers: Headers = ()


@dataclass(slots=True)
class Partition:
    entries: list[Entry] = field(default_factory=list)
    start: int = 0
    # The open transactions that wrote here, each with its first offset here.
    open: dict[Txn, int] = field(default_factory=dict)

    @property
    def end(self) -> int:
        """The high watermark: the offset the next record takes."""
        return len(self.entries)

    @property
    def stable_end(self) -> int:
        """The last stable offset: the end as read-committed readers see it."""
        return min(self.open.values(), default=self.end)
