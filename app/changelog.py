"""The timer table's changelog on Kafka: the sink every store write goes through, and restore.

A store write is acknowledged by the broker before it is applied locally, so the
changelog is never behind the local table; a node that takes a partition over reads the
changelog from its local offset to the end before anything reads the partition.
"""

from __future__ import annotations

import logging
import time

from app.kafka import Producer, offset_range, read_to_end
from tables import ChangelogRecord, TimerStore

__all__ = ["KafkaChangelogSink", "restore_partition"]

logger = logging.getLogger(__name__)


class KafkaChangelogSink:
    """Writes a store operation's rows to `topic`, in the row's partition."""

    def __init__(self, producer: Producer, topic: str) -> None:
        self._producer = producer
        self.topic = topic

    async def __call__(self, records: list[ChangelogRecord]) -> None:
        await self._producer.send_many([(self.topic, r.partition, r.key, r.value) for r in records])


async def restore_partition(store: TimerStore, bootstrap: str, topic: str, partition: int) -> int:
    """Applies `topic[partition]` after the store's last applied offset; how many records."""
    held = store.changelog_offset(partition)
    begin, end = await offset_range(bootstrap, topic, partition)
    if held is None or held < begin or held >= end:
        # The local copy is unknown, or older than what the changelog still holds (a rebuild
        # deleted it), or ahead of it (the topic was recreated): start from the changelog alone.
        await store.drop(partition)
        await store.assign({partition})
        held = None
    start = 0 if held is None else held + 1
    began = time.monotonic()
    count = 0
    async for batch in read_to_end(bootstrap, topic, partition, start):
        if batch:
            rows = [(r.offset, r.key, r.value) for r in batch if r.key is not None]
            await store.apply_changelog(partition, rows)
            count += len(batch)
    logger.info(
        "restored %s[%d]: %d records from offset %d in %.3f s",
        topic,
        partition,
        count,
        start,
        time.monotonic() - began,
    )
    return count
