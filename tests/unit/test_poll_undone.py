"""A poll that raises loses nothing (failure-path hunt, finding 1): aiokafka's `getmany`
moves each partition's position as it takes its records and raises on a later
partition's (a batch whose CRC does not match), so the records taken were lost with the
exception and the next poll read on past them; the commands among them were never
decided, and the next commit of their partition passed them for good. The group consumer
and the results reader now seek each partition back to where the records they handed out
ended (`app.kafka.read_positions`)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.consumer.fetcher import READ_COMMITTED, Fetcher, FetchResult, PartitionRecords
from aiokafka.errors import CorruptRecordException, IllegalStateError
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import ConsumerRecord, TopicPartition
from kafka_batches import batch

from app.errors import KafkaUnavailable
from app.kafka.fetch_watch import FetchWatch
from app.kafka.group_consumer import GroupConsumer
from app.kafka.partition_reader import PartitionReader
from app.kafka.read_positions import ReadPositions
from app.kafka.refused_topics import RefusedTopics

GOOD, BAD = TopicPartition("t.commands", 1), TopicPartition("t.commands", 0)


class _State:
    def __init__(self) -> None:
        self.paused = False
        self.position = 0

    def consumed_to(self, offset: int) -> None:
        self.position = offset


class _Assignment:
    active = True

    def __init__(self) -> None:
        self.states = {GOOD: _State(), BAD: _State()}

    def state_value(self, tp: TopicPartition) -> _State:
        return self.states[tp]


async def test_aiokafka_moves_a_partition_past_records_it_then_loses_to_anothers_error() -> None:
    """What the fix stands on: aiokafka's own fetcher, given a good batch and a corrupt one."""
    corrupt = bytearray(batch(0, 3))
    corrupt[-1] ^= 0xFF  # a bit flipped after the CRC was computed
    assignment = _Assignment()

    def fetched(tp: TopicPartition, raw: bytes) -> FetchResult:
        records = PartitionRecords(tp, MemoryRecords(raw), [], 0, None, None, True, READ_COMMITTED)
        return FetchResult(tp, assignment=assignment, partition_records=records, backoff=0)

    fetcher: Any = Fetcher.__new__(Fetcher)
    fetcher._subscriptions = SimpleNamespace(reassignment_in_progress=False)
    fetcher._wait_consume_future = None
    fetcher._records = {GOOD: fetched(GOOD, batch(0, 3)), BAD: fetched(BAD, bytes(corrupt))}
    with pytest.raises(CorruptRecordException):
        await fetcher.fetched_records([], timeout=0, max_records=2_000)
    assert assignment.states[GOOD].position == 3, "its three records taken, none returned"


class _Consumer:
    """An AIOKafkaConsumer as `getmany` behaves: each partition's records taken from its
    position, which moves past them, until a corrupt partition's raise."""

    def __init__(self, log: dict[TopicPartition, int]) -> None:
        self.log = log  # how many records each partition holds
        self.positions = dict.fromkeys(log, 0)
        self.corrupt: set[TopicPartition] = set()

    def assignment(self) -> set[TopicPartition]:
        return set(self.positions)

    def paused(self) -> set[TopicPartition]:
        return set()

    def last_poll_timestamp(self, tp: TopicPartition) -> int | None:
        return None  # never answered: the watch's bound is far off in these tests

    async def position(self, tp: TopicPartition) -> int:
        return self.positions[tp]

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.log[tp] for tp in tps}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        if tp not in self.positions:
            raise IllegalStateError("not assigned")
        self.positions[tp] = offset

    async def getmany(self, timeout_ms: int = 0) -> dict[TopicPartition, list[ConsumerRecord]]:
        got: dict[TopicPartition, list[ConsumerRecord]] = {}
        for tp in sorted(self.positions, key=lambda tp: tp.partition != GOOD.partition):
            if tp in self.corrupt:
                raise CorruptRecordException("Invalid CRC")
            start, end = self.positions[tp], self.log[tp]
            if start < end:
                got[tp] = [_record(tp, offset) for offset in range(start, end)]
                self.positions[tp] = end
        return got


def _record(tp: TopicPartition, offset: int) -> ConsumerRecord:
    return ConsumerRecord(tp.topic, tp.partition, offset, 0, 0, None, b"{}", None, 0, 2, [])


def _offsets(got: dict[tuple[str, int], list[Any]], tp: TopicPartition) -> list[int]:
    return [r.offset for r in got.get((tp.topic, tp.partition), [])]


async def test_a_group_poll_that_raises_leaves_every_partition_where_its_records_ended() -> None:
    group = GroupConsumer.__new__(GroupConsumer)
    consumer = _Consumer({GOOD: 2, BAD: 0})
    group._consumer, group._read = consumer, ReadPositions()
    group._topics, group._refused = [GOOD.topic], RefusedTopics()
    group._watch = FetchWatch(consumer, group._read.moves, time.monotonic)
    assert _offsets(await group.poll(), GOOD) == [0, 1]
    consumer.log[GOOD] = 5  # three more records of GOOD, and BAD's first batch corrupt
    consumer.log[BAD] = 1
    consumer.corrupt.add(BAD)
    with pytest.raises(KafkaUnavailable, match="Invalid CRC"):
        await group.poll()
    assert consumer.positions[GOOD] == 2, "read again from the last record handed out"
    consumer.corrupt.clear()
    assert _offsets(await group.poll(), GOOD) == [2, 3, 4]


async def test_a_group_seek_and_rewind_are_where_a_failed_poll_goes_back_to() -> None:
    group = GroupConsumer.__new__(GroupConsumer)
    consumer = _Consumer({GOOD: 4, BAD: 1})
    group._consumer, group._read = consumer, ReadPositions()
    group._topics, group._refused = [GOOD.topic], RefusedTopics()
    group._watch = FetchWatch(consumer, group._read.moves, time.monotonic)
    assert group.seek(GOOD.topic, GOOD.partition, 1)
    consumer.corrupt.add(BAD)
    with pytest.raises(KafkaUnavailable):
        await group.poll()
    assert consumer.positions == {GOOD: 1, BAD: 0}  # BAD never read nor moved: left
    group._read.forget([GOOD])  # as an assignment does: its take rewinds it
    with pytest.raises(KafkaUnavailable):
        await group.poll()
    assert consumer.positions[GOOD] == 4


async def test_a_results_poll_that_raises_reads_the_results_again() -> None:
    reader = PartitionReader.__new__(PartitionReader)
    consumer = _Consumer({GOOD: 2, BAD: 0})
    reader._consumer, reader._read = consumer, ReadPositions()
    reader._lock, reader.topic = asyncio.Lock(), GOOD.topic
    reader._watch = FetchWatch(consumer, reader._read.moves, time.monotonic)
    assert [r.offset for r in await reader.poll()] == [0, 1]
    consumer.log[GOOD], consumer.log[BAD] = 3, 1
    consumer.corrupt.add(BAD)
    with pytest.raises(KafkaUnavailable):
        await reader.poll()
    consumer.corrupt.clear()
    assert [(r.partition, r.offset) for r in await reader.poll()] == [(1, 2), (0, 0)]
