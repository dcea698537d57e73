"""Records deleted ahead of a running group member's position (a lagging or paused
partition, a retention or DeleteRecords) are read past loudly and counted, never silently:
aiokafka's `auto_offset_reset="earliest"` had moved such a partition to the start without
a word. The group consumer now resets nothing itself ("none"): its poll is told
(OffsetOutOfRangeError), reads on from the start with an ERROR naming how many records
were missed (`app.kafka.resume_offset.read_on_offset`), and counts them (`on_deleted`),
as the in-memory group's member does. A partition with no committed offset
(NoOffsetForPartitionError) is read from the start, no error: a fresh group never stalls.
On a broker: `tests/integration/test_poll_loop_kafka.py`."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest
from aiokafka.consumer.fetcher import (
    READ_COMMITTED,
    Fetcher,
    FetchError,
    FetchResult,
    PartitionRecords,
)
from aiokafka.errors import IllegalStateError, NoOffsetForPartitionError, OffsetOutOfRangeError
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import TopicPartition
from fakes import RunningNode, wait_until
from hypothesis import given
from hypothesis import strategies as st
from kafka_batches import batch
from test_node_memory import PARTITIONS, SERVICE, TOPICS

from app.errors import KafkaUnavailable
from app.kafka.fetch_watch import FetchWatch
from app.kafka.group_consumer import GroupConsumer
from app.kafka.in_log_refusals import InLogRefusals
from app.kafka.memory import MemoryLog
from app.kafka.read_positions import ReadPositions
from app.kafka.refused_topics import RefusedTopics
from app.kafka.resume_offset import deleted_unread, read_on_offset

TOPIC = "shop.order.events"
LOGGER = "app.kafka.resume_offset"
TP, OTHER = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)

Counted = list[tuple[str, int, int]]


@given(st.integers(0, 1_000), st.integers(0, 1_000), st.integers(0, 1_000))
def test_a_position_out_of_the_log_reads_on_from_a_record_it_holds(
    position: int, start: int, length: int
) -> None:
    end = start + length
    offset = read_on_offset(TOPIC, 0, position, start, end)
    assert offset == (position if start <= position <= end else start)
    assert deleted_unread(position, start) == max(0, start - position)


def test_records_deleted_ahead_and_a_log_cut_back_are_errors(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert read_on_offset(TOPIC, 3, 2, 6, 10) == 6
        assert read_on_offset(TOPIC, 3, 12, 0, 4) == 0
        # A leader behind: fetched again, said by its reader's `InLogRefusals`, bounded
        # (`tests/unit/test_in_log_refusals.py`).
        assert read_on_offset(TOPIC, 3, 7, 6, 10) == 7
    deleted, cut = caplog.records
    assert deleted.levelno == cut.levelno == logging.ERROR
    assert (
        f"{TOPIC}[3]: 4 records were deleted before this group read them (position 2"
        in deleted.getMessage()
    )
    assert "ends at 4, before this group's position 12" in cut.getMessage()
    assert deleted_unread(None, 6) == deleted_unread(-1, 6) == 0


async def nothing(_: set[tuple[str, int]]) -> None:
    return None


async def test_a_memory_member_paused_while_records_are_deleted_ahead_reads_on_loudly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = MemoryLog()
    log.create_topic(TOPIC, 2)
    for i in range(4):
        for p in (0, 1):
            await log.publisher().send(TOPIC, b"k", b"%d" % i, p)
    counted: Counted = []
    member = log.group_member(
        "g", [TOPIC], on_assigned=nothing, on_revoked=nothing, on_deleted=_count(counted)
    )
    await member.start()
    try:
        got = await member.poll(10)
        assert [r.offset for r in got[(TOPIC, 0)]] == [0, 1, 2, 3]
        member.pause([(TOPIC, 0)])  # restoring, or its worker's queue full
        for i in range(4, 10):
            await log.publisher().send(TOPIC, b"k", b"%d" % i, 0)
        await log.publisher().send(TOPIC, b"k", b"4", 1)
        log.delete_records(TOPIC, 0, 7)  # 4, 5 and 6 never read
        assert [r.offset for r in (await member.poll(10))[(TOPIC, 1)]] == [4]
        member.resume([(TOPIC, 0)])
        with caplog.at_level(logging.ERROR, logger=LOGGER):
            got = await member.poll(10)
        assert [r.offset for r in got[(TOPIC, 0)]] == [7, 8, 9]
        assert f"{TOPIC}[0]: 3 records were deleted before this group read them" in caplog.text
        assert counted == [(TOPIC, 0, 3)]
    finally:
        await member.stop()


async def test_a_memory_member_counts_records_deleted_before_its_take_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = MemoryLog()
    log.create_topic(TOPIC, 1)
    for i in range(10):
        await log.publisher().send(TOPIC, b"k", b"%d" % i, 0)
    log.commit_group_offsets("g", {(TOPIC, 0): 2})
    log.delete_records(TOPIC, 0, 6)
    counted: Counted = []

    async def paused(tps: set[tuple[str, int]]) -> None:
        member.pause(tps)  # as a node pauses what it is given until its take

    member = log.group_member(
        "g", [TOPIC], on_assigned=paused, on_revoked=nothing, on_deleted=_count(counted)
    )
    await member.start()
    try:
        assert counted == [], "given: not yet read from"
        with caplog.at_level(logging.ERROR, logger=LOGGER):
            assert await member.rewind([(TOPIC, 0)]) == {(TOPIC, 0): 6}
        member.resume([(TOPIC, 0)])
        assert [r.offset for r in (await member.poll(10))[(TOPIC, 0)]] == [6, 7, 8, 9]
        assert counted == [(TOPIC, 0, 4)]
        assert caplog.text.count("records were deleted") == 1
    finally:
        await member.stop()


async def test_a_memory_member_reads_a_topic_made_again_from_its_start() -> None:
    log = MemoryLog()
    log.create_topic(TOPIC, 1)
    for i in range(5):
        await log.publisher().send(TOPIC, b"k", b"%d" % i, 0)
    member = log.group_member("g", [TOPIC], on_assigned=nothing, on_revoked=nothing)
    await member.start()
    try:
        assert len((await member.poll(10))[(TOPIC, 0)]) == 5
        log.recreate(TOPIC)
        for i in range(2):
            await log.publisher().send(TOPIC, b"k", b"new %d" % i, 0)
        got = await member.poll(10)
        assert [r.value for r in got[(TOPIC, 0)]] == [b"new 0", b"new 1"]
    finally:
        await member.stop()


async def test_a_node_counts_the_commands_deleted_under_its_paused_partition(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = MemoryLog()
    node = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(node.runs, within=10)
        consumer = node.node._consumer
        assert consumer is not None
        consumer.pause([(TOPICS.commands, 0)])  # as its queue full, or a retake, pauses it
        for _ in range(3):
            await log.publisher().send(TOPICS.commands, b"k", b"never read", 0)
        log.delete_records(TOPICS.commands, 0, log.offsets(TOPICS.commands, 0)[1])
        registry, labels = node.node.metrics.registry, {"topic": TOPICS.commands}
        with caplog.at_level(logging.ERROR, logger=LOGGER):
            consumer.resume([(TOPICS.commands, 0)])
            await wait_until(
                lambda: (
                    registry.get_sample_value("tickwheel_records_deleted_unread_total", labels) == 3
                ),
                within=10,
            )
        assert f"{TOPICS.commands}[0]: 3 records were deleted" in caplog.text
    finally:
        await node.stop()


def _count(counted: Counted) -> Any:
    return lambda topic, partition, n: counted.append((topic, partition, n))


async def test_aiokafka_raises_a_partitions_fetch_error_only_with_nothing_taken() -> None:
    """What the fix stands on: a poll that raises a partition's OffsetOutOfRangeError took
    no record of the others (they wait for the next poll), whichever comes first."""
    for order in ((TP, OTHER), (OTHER, TP)):
        fetcher: Any = Fetcher.__new__(Fetcher)
        fetcher._subscriptions = _Subscriptions()
        fetcher._wait_consume_future = None
        results = {
            TP: FetchError(error=OffsetOutOfRangeError({TP: 2}), backoff=0),
            OTHER: _fetched(OTHER),
        }
        fetcher._records = {tp: results[tp] for tp in order}
        got: dict[TopicPartition, list[Any]] = {}
        for _ in range(2):
            try:
                got.update(await fetcher.fetched_records([], timeout=0, max_records=2_000))
            except OffsetOutOfRangeError as exc:
                assert exc.args[0] == {TP: 2}
        assert [r.offset for r in got[OTHER]] == [0, 1, 2]


class _Subscriptions:
    reassignment_in_progress = False


class _State:
    paused = False
    position = 0

    def consumed_to(self, offset: int) -> None:
        self.position = offset


class _Assignment:
    active = True

    def state_value(self, tp: TopicPartition) -> _State:
        return _State()


def _fetched(tp: TopicPartition) -> FetchResult:
    records = PartitionRecords(
        tp, MemoryRecords(batch(0, 3)), [], 0, None, None, True, READ_COMMITTED
    )
    return FetchResult(tp, assignment=_Assignment(), partition_records=records, backoff=0)


class _Consumer:
    """aiokafka's consumer with `auto_offset_reset="none"`, as the poll meets it: a fetch
    refused (`raises`), and the log's offsets."""

    def __init__(self, raises: Exception, start: int, end: int) -> None:
        self.raises: Exception | None = raises
        self.start, self.end = start, end
        self.positions: dict[TopicPartition, int] = {}
        self.during_offsets: Any = None  # what happens while they are read

    _fetcher = None

    def assignment(self) -> set[TopicPartition]:
        return {TP, OTHER}

    def paused(self) -> set[TopicPartition]:
        return set()

    def last_poll_timestamp(self, tp: TopicPartition) -> int | None:
        return None  # never answered: the watch's bound is far off in these tests

    async def position(self, tp: TopicPartition) -> int:
        return self.positions.get(tp, 0)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        if tp not in self.assignment():
            raise IllegalStateError("not assigned")
        self.positions[tp] = offset

    async def getmany(self, timeout_ms: int = 0) -> dict[TopicPartition, list[Any]]:
        raises, self.raises = self.raises, None
        if raises is not None:
            raise raises
        return {}

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        if self.during_offsets is not None:
            self.during_offsets()
        return dict.fromkeys(tps, self.start)

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return dict.fromkeys(tps, self.end)


def _group(consumer: _Consumer, counted: Counted) -> GroupConsumer:
    group = GroupConsumer.__new__(GroupConsumer)
    group._consumer = consumer
    group._read, group._refused, group._topics = ReadPositions(), RefusedTopics(), [TOPIC]
    group._on_deleted, group._clock = _count(counted), time.monotonic
    group._refusals = InLogRefusals()
    group._watch = FetchWatch(consumer, group._read.moves, time.monotonic)
    return group


async def test_a_group_poll_past_records_deleted_ahead_reads_on_from_the_start_loudly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    consumer = _Consumer(OffsetOutOfRangeError({TP: 2}), start=6, end=10)
    counted: Counted = []
    group = _group(consumer, counted)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        assert await group.poll() == {}, "nothing taken: the next poll reads every partition"
    assert consumer.positions == {TP: 6}
    assert counted == [(TOPIC, 0, 4)]
    assert f"{TOPIC}[0]: 4 records were deleted before this group read them" in caplog.text
    assert await group.poll() == {}  # and on
    assert counted == [(TOPIC, 0, 4)]


async def test_a_group_poll_reads_a_partition_with_no_offset_from_the_start_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    consumer = _Consumer(NoOffsetForPartitionError(OTHER), start=3, end=10)
    counted: Counted = []
    with caplog.at_level(logging.ERROR):
        assert await _group(consumer, counted).poll() == {}
    assert consumer.positions == {OTHER: 3}
    assert counted == [] and not caplog.records


async def test_a_partition_sought_while_its_offsets_are_read_stays_where_it_was_sought() -> None:
    """A take's rewind seeks the partition meanwhile: its offset stands."""
    consumer = _Consumer(OffsetOutOfRangeError({TP: 2}), start=6, end=10)
    counted: Counted = []
    group = _group(consumer, counted)
    consumer.during_offsets = lambda: group.seek(TOPIC, 0, 8)
    assert await group.poll() == {}
    assert consumer.positions == {TP: 8} and counted == []


async def test_a_group_poll_whose_offsets_cannot_be_read_fails_as_a_poll() -> None:
    consumer = _Consumer(OffsetOutOfRangeError({TP: 2}), start=6, end=10)

    def away() -> None:
        raise IllegalStateError("no broker")  # a KafkaError

    consumer.during_offsets = away
    with pytest.raises(KafkaUnavailable, match="poll failed"):
        await _group(consumer, []).poll()
    assert consumer.positions == {}


async def test_the_group_consumer_resets_no_position_itself() -> None:
    group = GroupConsumer("127.0.0.1:9092", "g", [TOPIC], on_assigned=nothing, on_revoked=nothing)
    try:
        assert group._consumer._auto_offset_reset == "none"
    finally:
        await group.stop()
