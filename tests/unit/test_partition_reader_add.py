"""A results or ledger partition with no leader while a partition is taken: asking its end
offset takes the client's whole request timeout (40 s). It held the reader's lock all the
while, so every other partition's results waited, and it raised aiokafka's own
`KafkaTimeoutError`, which a take logs as a bug and a ledger's start let out raw."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaTimeoutError

from app.errors import KafkaUnavailable
from app.kafka.fetch_watch import FetchWatch
from app.kafka.partition_reader import PartitionReader
from app.kafka.read_positions import ReadPositions


class _Consumer:
    """What `PartitionReader` uses of aiokafka's consumer: partition 1 has no leader."""

    def __init__(self) -> None:
        self.assigned: list[TopicPartition] = [TopicPartition("ctx.results", 0)]
        self.asked = asyncio.Event()
        self.answer: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    def paused(self) -> set[TopicPartition]:
        return set()

    def last_poll_timestamp(self, tp: TopicPartition) -> int | None:
        return None  # never answered: the watch's bound is far off in these tests

    async def position(self, tp: TopicPartition) -> int:
        return 5

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        self.asked.set()
        await self.answer
        raise KafkaTimeoutError()

    async def getmany(self, timeout_ms: int = 0) -> dict[TopicPartition, list[Any]]:
        return {}

    def assign(self, tps: list[TopicPartition]) -> None:
        self.assigned = list(tps)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        pass


def reader_over(consumer: _Consumer) -> tuple[PartitionReader, _Consumer]:
    reader = PartitionReader.__new__(PartitionReader)
    reader.topic = "ctx.results"
    reader._consumer = consumer
    reader._lock, reader._changed, reader._read = asyncio.Lock(), asyncio.Event(), ReadPositions()
    reader._wanted = set()
    reader._watch = FetchWatch(consumer, reader._read.moves, time.monotonic)
    return reader, consumer


async def test_a_partition_without_a_leader_is_unavailable_and_holds_no_other_read() -> None:
    reader, consumer = reader_over(_Consumer())
    adding = asyncio.create_task(reader.add(1))
    await consumer.asked.wait()
    assert await asyncio.wait_for(reader.poll(timeout_ms=10), 1) == [], "partition 0 read on"
    consumer.answer.set_result(None)
    with pytest.raises(KafkaUnavailable, match=r"ctx\.results\[1\]: no end offset"):
        await adding
    assert consumer.assigned == [TopicPartition("ctx.results", 0)]


async def test_a_partition_let_go_while_its_end_was_asked_is_not_read() -> None:
    """`remove` while `add` waits for the end offset (outside the lock): the calls keep
    their order, and a partition released is not read on."""
    reader, consumer = reader_over(_Consumer())

    async def end_offsets(tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        consumer.asked.set()
        await consumer.answer
        return {tp: 3 for tp in tps}

    consumer.end_offsets = end_offsets  # type: ignore[method-assign]
    adding = asyncio.create_task(reader.add(1))
    await consumer.asked.wait()
    await reader.remove(1)
    consumer.answer.set_result(None)
    await adding
    assert consumer.assigned == [TopicPartition("ctx.results", 0)]
