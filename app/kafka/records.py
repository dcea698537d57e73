"""What the Kafka edge passes around: topic specs, records read, records to write; and
starting a client with its errors translated."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiokafka.errors import (
    KafkaError,
)

from app.errors import KafkaUnavailable

logger = logging.getLogger(__name__)


async def start_client(client: Any, what: str) -> None:
    """Starts an aiokafka client, its failure said in our terms."""
    try:
        await client.start()
    except KafkaError as exc:
        raise KafkaUnavailable(f"{what} cannot connect: {exc!r}") from exc


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    partitions: int
    compacted: bool = False


@dataclass(frozen=True, slots=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int


# Compacted, and never deleted by age or size; "delete" is in the policy only so that a
# rebuild may empty the topic with DeleteRecords (refused on a compact-only topic).

OutRecord = tuple[str, int | None, bytes | None, bytes | None]
"""(topic, partition or None for the key's default partition, key, value)."""


RestoreProgress = Callable[[int, int], None]
"""Told the offsets read so far and to read, as a restore goes."""
