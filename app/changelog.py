"""The timer table's changelog on Kafka: transactional, fenced per partition, and restore.

Each owned partition p writes its changelog through a transactional producer of its own
(transactional id `<group>.<type>.timers.<p>`). Starting it fences p's previous owner: a
node that lost p but has not noticed yet (a zombie) can write, but never commit, so no
reader and no compaction ever sees its writes. A store write joins p's open transaction
and is applied locally at once; the transaction is committed with the timers
subscription's log offsets after each batch, and every `commit_interval` for the
runner's writes. A local copy that may hold writes that were never committed (the node
stopped uncleanly, or a commit failed) is thrown away and restored from the changelog.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from pathlib import Path

from app.kafka import KafkaUnavailable, Reader, TransactionalProducer
from tables import ChangelogRecord, TimerStore

__all__ = ["CleanMarks", "TransactionalChangelog", "restore_partition"]

logger = logging.getLogger(__name__)


class TransactionalChangelog:
    """The store's changelog sink: routes each row to its partition's open transaction."""

    def __init__(self, bootstrap: str, topic: str, group_id: str) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.group_id = group_id
        self._producers: dict[int, TransactionalProducer] = {}

    async def open(self, partition: int) -> None:
        """Starts the partition's producer, fencing its previous owner's."""
        producer = TransactionalProducer(
            self.bootstrap, f"{self.group_id}.{self.topic}.{partition}"
        )
        await producer.start()
        self._producers[partition] = producer

    async def close(self, partition: int) -> bool | None:
        """Commits what is pending and stops the producer; whether everything was committed
        (None: the partition was not open)."""
        producer = self._producers.pop(partition, None)
        if producer is None:
            return None
        try:
            await producer.flush()
            return True
        except KafkaUnavailable as exc:
            logger.warning("%s[%d]: last commit failed: %s", self.topic, partition, exc)
            return False
        finally:
            await producer.stop()

    def owns(self, partition: int) -> bool:
        return partition in self._producers

    async def __call__(self, records: list[ChangelogRecord]) -> None:
        by_partition: dict[int, list[ChangelogRecord]] = defaultdict(list)
        for r in records:
            by_partition[r.partition].append(r)
        for p, rows in by_partition.items():
            producer = self._producers.get(p)
            if producer is None:
                raise KafkaUnavailable(f"{self.topic}[{p}] is not owned by this node")
            await producer.append([(self.topic, p, r.key, r.value) for r in rows])

    async def commit(
        self, partition: int, offsets: dict[tuple[str, int], int] | None = None
    ) -> None:
        """Commits the partition's open transaction, with the given log `offsets` if any."""
        producer = self._producers.get(partition)
        if producer is None:
            raise KafkaUnavailable(f"{self.topic}[{partition}] is not owned by this node")
        await producer.flush(offsets, self.group_id)

    def pending(self) -> list[int]:
        """The partitions with writes waiting to be committed."""
        return [p for p, producer in self._producers.items() if producer.pending]


class CleanMarks:
    """Which partitions' local copies hold committed writes only (files beside the store).

    A mark is removed when the node takes a partition and written back only after its last
    transaction committed when it lets the partition go; a partition without a mark is
    restored from the changelog alone.
    """

    def __init__(self, directory: Path) -> None:
        self._dir = directory

    def _path(self, partition: int) -> Path:
        return self._dir / f"clean-p{partition}"

    def take(self, partition: int) -> bool:
        """Whether the local copy was clean; it is not from now on."""
        path = self._path(partition)
        clean = path.exists()
        path.unlink(missing_ok=True)
        return clean

    def mark(self, partition: int) -> None:
        self._path(partition).touch()


async def restore_partition(
    store: TimerStore, reader: Reader, topic: str, partition: int, *, clean: bool = True
) -> int:
    """Applies `topic[partition]` after the store's last applied offset; how many records."""
    held = store.changelog_offset(partition)
    begin, end = await reader.offsets(topic, partition)
    if not clean or held is None or held < begin or held >= end:
        # The local copy may hold uncommitted writes, or is unknown, or older than what the
        # changelog still holds (a rebuild deleted it), or ahead of it (the topic was
        # recreated): start from the changelog alone.
        await store.drop(partition)
        await store.assign({partition})
        held = None
    start = 0 if held is None else held + 1
    began = time.monotonic()
    count = 0
    async for batch in reader.read(topic, partition, start):
        rows = [(r.offset, r.key, r.value) for r in batch if r.key is not None]
        if rows:
            await store.apply_changelog(partition, rows)
            count += len(rows)
    logger.info(
        "restored %s[%d]: %d records from offset %d in %.3f s",
        topic,
        partition,
        count,
        start,
        time.monotonic() - began,
    )
    return count
