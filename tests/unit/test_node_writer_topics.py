"""A partition's producers are made knowing the topics their transactions write, so that
their metadata is fetched when the task takes the partition, not by the first commit of a
burst (#20: a producer fetching it then held the burst's first fire for seconds)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fakes import RunningNode, wait_until
from test_node_memory import PARTITIONS, SERVICE, TOPICS

from app.kafka.memory import MemoryLog, MemoryWriter
from app.protocol.topics import ContextTopics


class RecordingLog(MemoryLog):
    """A memory log that keeps the topics each transactional writer was made with."""

    def __init__(self) -> None:
        super().__init__()
        self.writers: dict[str, tuple[str, ...]] = {}

    def transactional_writer(
        self, transactional_id: str, *, max_batch_bytes: int | None = None, topics: Any = ()
    ) -> MemoryWriter:
        self.writers[transactional_id] = tuple(topics)
        return super().transactional_writer(transactional_id, max_batch_bytes=max_batch_bytes)


async def test_every_partition_writer_is_made_with_the_topics_it_writes(tmp_path: Path) -> None:
    log = RecordingLog()
    node = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(node.runs)
        assert len(log.writers) >= PARTITIONS
        expected = {
            TOPICS.events,
            TOPICS.commands,
            TOPICS.timers_changelog,
            ContextTopics(TOPICS.context).results,
        }
        assert {frozenset(t) for t in log.writers.values()} == {frozenset(expected)}
    finally:
        await node.stop()
