"""A broker refusing as out of range, again and again, a fetch at a position its log holds
(its bug, an unclean leader election mid-way, a follower behind the high watermark after a
leader change): the poll fetched that partition again each time, with an INFO line each,
for ever, while the other partitions went on and the node said it was ready. Now the
repeats are followed per partition (`app.kafka.in_log_refusals`): a burst (a leader
catching up) passes, said once; the repeats are a WARNING at most every `SAY_EVERY_S`; and
past `STUCK_S` (and `STUCK_REFUSALS`) at one position, the poll raises `FetchRefused`,
which stops the node loudly (`app.node.polling`). Anything that moves the partition (its
reading past the position, a seek, a new assignment) starts the count over."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any, cast

import pytest
from aiokafka.errors import OffsetOutOfRangeError
from aiokafka.structs import TopicPartition
from fakes import RunningNode, wait_until
from fakes_fetch import unwatched
from fakes_poll import NoOffsets
from hypothesis import given
from hypothesis import strategies as st
from test_node_memory import PARTITIONS, SERVICE, TOPICS, results, schedule

from app.errors import KafkaUnavailable, NodeFailed
from app.kafka.group_consumer import GroupConsumer
from app.kafka.in_log_refusals import (
    GAP_S,
    SAY_EVERY_S,
    STUCK_REFUSALS,
    STUCK_S,
    FetchRefused,
    InLogRefusals,
    Refusals,
    Verdict,
    refusal,
)
from app.kafka.memory import MemoryLog
from app.kafka.memory_group import MemoryGroupMember
from app.kafka.ports import GroupMember
from app.kafka.read_positions import ReadPositions
from app.kafka.refused_topics import RefusedTopics
from app.node.polling import poll_loop
from tables.partitioner import partition_of

TOPIC = "shop.order.events"
LOGGER = "app.kafka.in_log_refusals"
TP = TopicPartition(TOPIC, 0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# The decision, pure.


@given(st.lists(st.floats(0, 20, allow_nan=False), min_size=1, max_size=200))
def test_one_position_refused_is_stuck_only_past_the_bound_and_said_within_its_rate(
    gaps: list[float],
) -> None:
    """Refusals at one position, nothing moving it, `gaps` apart: a gap over `GAP_S`
    starts the count over (a first refusal, INFO); stuck at the first that is both
    `STUCK_S` after the count's first and its `STUCK_REFUSALS`th or later; said (WARNING)
    at most once per `SAY_EVERY_S`."""
    last: Refusals | None = None
    now, first, said, n = 0.0, 0.0, 0.0, 0
    for i, gap in enumerate(gaps):
        now += gap
        last, verdict = refusal(last, 7, 3, now)
        n = 1 if i == 0 or gap > GAP_S else n + 1
        first = now if n == 1 else first
        assert last.count == n and last.first == first
        should_stick = n >= STUCK_REFUSALS and now - first >= STUCK_S
        assert (verdict is Verdict.STUCK) == should_stick
        if should_stick:
            return
        assert (verdict is Verdict.FIRST) == (n == 1)
        assert (verdict is Verdict.SAY) == (n > 1 and now - said >= SAY_EVERY_S)
        said = now if verdict is not Verdict.QUIET else said


def test_a_burst_of_refusals_then_one_hours_later_is_a_first_refusal() -> None:
    """An idle partition refused for a second at a leader change (then served: its position
    stays), refused once more six hours later: not stuck, a first refusal."""
    last: Refusals | None = None
    for k in range(STUCK_REFUSALS * 2):
        last, _ = refusal(last, 7, 3, k * 0.05)
    last, verdict = refusal(last, 7, 3, 6 * 3600.0)
    assert verdict is Verdict.FIRST and last.count == 1


@given(st.integers(0, 100), st.integers(0, 5), st.floats(0, 1_000, allow_nan=False))
def test_a_partition_moved_or_refused_elsewhere_starts_over(
    position: int, moves: int, later: float
) -> None:
    """Refused at `STUCK_S` and more, `STUCK_REFUSALS` times and more: stuck at that
    position, but a first refusal after a move (its reading past the position, a seek, an
    assignment) or at another position, or with the clock gone back."""
    now = STUCK_S + later
    last = Refusals(position, moves, 0.0, STUCK_REFUSALS, 0.0, now - 1)
    assert refusal(last, position, moves, now)[1] is Verdict.STUCK
    for again in (
        refusal(last, position + 1, moves, now),
        refusal(last, position, moves + 1, now),
        refusal(Refusals(position, moves, 10.0, 50, 10.0, 10.0), position, moves, 9.0),
    ):
        assert again[1] is Verdict.FIRST and again[0].count == 1


# The group consumer over aiokafka.


class _Consumer:
    """aiokafka's consumer with `auto_offset_reset="none"` over a broker that refuses the
    fetch at `refused` (its log holding 0 to 10) while `refusing`, else hands its record."""

    def __init__(self, refused: int) -> None:
        self.refused = refused
        self.refusing = True
        self.sought: list[int] = []

    def assignment(self) -> set[TopicPartition]:
        return {TP}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.sought.append(offset)

    async def getmany(self, timeout_ms: int = 0) -> dict[TopicPartition, list[Any]]:
        if self.refusing:
            raise OffsetOutOfRangeError({TP: self.refused})
        return {}

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return dict.fromkeys(tps, 0)

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return dict.fromkeys(tps, 10)


def _group(consumer: _Consumer, clock: Clock) -> GroupConsumer:
    group = GroupConsumer.__new__(GroupConsumer)
    group._consumer = consumer
    group._read, group._refused, group._topics = ReadPositions(), RefusedTopics(), [TOPIC]
    group._on_deleted, group._clock, group._refusals = None, clock, InLogRefusals()
    group._watch = unwatched()
    return group


async def test_a_group_poll_refused_inside_the_log_stops_past_the_bound_said_rarely(
    caplog: pytest.LogCaptureFixture,
) -> None:
    consumer, clock = _Consumer(refused=7), Clock()
    group = _group(consumer, clock)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for _ in range(int(STUCK_S / 0.5)):  # a poll every 0.5 s, for a minute
            assert await group.poll() == {}
            clock.now += 0.5
        with pytest.raises(FetchRefused, match=r"a fetch at 7 was refused .* 121 times in 60 s"):
            await group.poll()
    assert consumer.sought == [], "left where it is: fetched again at 7"
    info = [r for r in caplog.records if r.levelno == logging.INFO]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(info) == 1 and "(a leader not caught up yet): fetched again" in info[0].message
    assert len(warnings) == int(STUCK_S / SAY_EVERY_S) - 1, "one every 10 s, not each poll"
    assert "refused as out of the log 21 times in 10 s, though it holds 0 to 10" in (
        warnings[0].message
    )


async def test_a_group_poll_moved_meanwhile_starts_over() -> None:
    """A leader catching up, then another burst at the same position after a rewind (a
    retake), minutes later: two bursts, never stuck; at another position, the same."""
    consumer, clock = _Consumer(refused=7), Clock()
    group = _group(consumer, clock)
    for _ in range(STUCK_REFUSALS):
        assert await group.poll() == {}
    clock.now += 2 * STUCK_S
    assert group.seek(TOPIC, 0, 4)  # a take's rewind: read from 4, up to 7 again
    for _ in range(STUCK_REFUSALS):
        assert await group.poll() == {}
    clock.now += 2 * STUCK_S
    consumer.refused = 9  # read on past 7, then refused at 9, every few seconds for a minute
    assert await group.poll() == {}
    step = STUCK_S / (STUCK_REFUSALS - 1)
    for _ in range(STUCK_REFUSALS - 2):
        clock.now += step
        assert await group.poll() == {}
    clock.now += step
    with pytest.raises(FetchRefused, match="a fetch at 9"):
        await group.poll()


# The in-memory member, and the node.


async def nothing(_: set[tuple[str, int]]) -> None:
    return None


async def test_a_memory_member_refused_inside_the_log_reads_on_once_served() -> None:
    """Refused: the other partition read on; served again and read past the position, the
    count starts over; refused too long at one, `FetchRefused` with nothing taken."""
    log = MemoryLog()
    log.create_topic(TOPIC, 2)
    member = log.group_member("g", [TOPIC], on_assigned=nothing, on_revoked=nothing)
    clock = Clock()
    member.clock = clock
    await member.start()
    try:
        member.refuse_fetches([(TOPIC, 0)])
        for i in range(3):
            await log.publisher().send(TOPIC, b"k", b"%d" % i, 0)
        await log.publisher().send(TOPIC, b"k", b"x", 1)
        for _ in range(STUCK_REFUSALS):
            assert list(await member.poll(0)) in ([(TOPIC, 1)], [])
            clock.now += STUCK_S / STUCK_REFUSALS - 1
        member.serve_fetches([(TOPIC, 0)])
        assert [r.offset for r in (await member.poll(0))[(TOPIC, 0)]] == [0, 1, 2]
        member.refuse_fetches([(TOPIC, 0)])  # at 3, its end: a new count
        for _ in range(STUCK_REFUSALS):
            assert await member.poll(0) == {}
            clock.now += STUCK_S / STUCK_REFUSALS
        await log.publisher().send(TOPIC, b"k", b"y", 1)
        with pytest.raises(FetchRefused, match=rf"{TOPIC}\[0\]: a fetch at 3 was refused"):
            await member.poll(0)
        member.serve_fetches([(TOPIC, 0)])
        assert [r.value for r in (await member.poll(0))[(TOPIC, 1)]] == [b"y"], (
            "what raised took nothing"
        )
    finally:
        await member.stop()


class _Refused:
    """A group member whose every poll raises `FetchRefused`."""

    def __init__(self) -> None:
        self.polls = 0

    def assignment(self) -> set[tuple[str, int]]:
        return set()

    async def poll(self, timeout_ms: int = 500) -> dict[tuple[str, int], list[Any]]:
        self.polls += 1
        raise FetchRefused("t[0]: a fetch at 7 was refused as out of the log")

    async def commit(self, offsets: dict[tuple[str, int], int]) -> None:
        pass


async def test_the_poll_loop_stops_the_node_at_once_on_a_fetch_refused_for_good() -> None:
    """Not retried as a broker in flux: the polls of the other partitions pass, and no
    bound of failing polls would ever end it."""
    consumer, failed = _Refused(), list[str]()
    await asyncio.wait_for(
        poll_loop(cast(GroupMember, consumer), {}, NoOffsets(), failed.append, {}), 2
    )
    [why] = failed
    assert (
        why.startswith("a partition's reading stopped: t[0]: a fetch at 7") and consumer.polls == 1
    )
    assert isinstance(FetchRefused("x"), KafkaUnavailable)


async def refused_on(
    member: MemoryGroupMember, key: tuple[str, int], clock: Clock, seconds: float
) -> None:
    """`seconds` pass on `clock` while `member`'s polls are refused at `key`, never more
    than `GAP_S` between two refusals (a longer gap starts their count over)."""
    until = clock.now + seconds
    while clock.now < until:
        before = member._refusals._of[key].count

        def counted(before: int = before) -> bool:
            refusals = member._refusals._of.get(key)
            return refusals is not None and refusals.count > before

        clock.now = min(clock.now + GAP_S / 2, until)
        await wait_until(counted, within=5)


async def test_a_node_whose_partition_is_refused_inside_its_log_stops_loudly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its other partition goes on meanwhile, and the node is ready, within the bound;
    past it, the node stops, saying which partition and where."""
    log, clock = MemoryLog(), Clock()
    node = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(node.runs, within=10)
        consumer = node.node._consumer
        assert isinstance(consumer, MemoryGroupMember)
        consumer.clock = clock
        with caplog.at_level(logging.INFO, logger=LOGGER):
            consumer.refuse_fetches([(TOPICS.commands, 0)])
            await wait_until(lambda: "refused as out of the log" in caplog.text, within=5)
            await refused_on(consumer, (TOPICS.commands, 0), clock, STUCK_S - 1)
            await wait_until(lambda: "though it holds 0 to 0" in caplog.text, within=5)
            owner = next(f"o{i}" for i in range(100) if partition_of(f"o{i}", PARTITIONS) == 1)
            cmd = await schedule(log, owner, 2**40)
            await wait_until(lambda: cmd.request_id in results(log), within=10)
            assert node.runs() and node.task is not None and not node.task.done()
            await refused_on(consumer, (TOPICS.commands, 0), clock, 1)
            with pytest.raises(NodeFailed, match=r"a partition's reading stopped: .*\[0\]: a"):
                await asyncio.wait_for(node.task, 10)
        assert f"{TOPICS.commands}[0]: a fetch at 0 was refused" in caplog.text
    finally:
        with contextlib.suppress(NodeFailed):
            await node.stop()
