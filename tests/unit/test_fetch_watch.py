"""The fetch watch over a reader's polls (`app.kafka.fetch_watch`), beyond a partition whose
fetches all fail (`test_fetch_stalled_readers`):

- A partition whose fetches are all answered, waiting behind the others' backlog, was
  stopped as stalled: aiokafka fetches a partition again only once its last batch is all
  handed out, and `getmany` (max_poll_records) drains the batches partition after
  partition, so its fetch stamp stood still for many polls, nothing of it handed out. A
  node whose group coordinator was away (each pass of the poll loop hanging in a commit
  for 30 s) or catching up a backlog was stopped within a minute or two. Records of it
  waiting in the client are progress now.
- The look at a partition that stood still awaits the broker (its position, its end):
  after the poll's fetch, a seek meanwhile (a take's rewind) was handed the records
  fetched before it (read twice, or, put back by the poll loop, sought past records its
  take never had). The look is before the fetch now.
- The partitions' progress is read once a second at most (a marker per partition per
  poll before), what was handed out in between counted.

Over aiokafka's real fetcher (its broker a fake, `fakes_fetch`), or a fake consumer, on
the test's clock."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiokafka import TopicPartition
from fakes_fetch import TOPIC, Broker, Clock, Part, close, over, stamped_by

from app.kafka.fetch_stalls import STALL_S
from app.kafka.fetch_watch import LOOK_EVERY_S, FetchWatch
from app.kafka.group_consumer import GroupConsumer
from app.kafka.read_positions import ReadPositions
from app.kafka.refused_topics import RefusedTopics

TP0, TP1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)


async def nothing(_: set[tuple[str, int]]) -> None:
    return None


@pytest.mark.parametrize(
    ("partitions", "step_s"),
    [(3, 31.0), (10, 2.0)],
    ids=["coordinator-away", "catching-up"],
)
async def test_a_partition_waiting_behind_a_backlog_is_not_stopped(
    monkeypatch: pytest.MonkeyPatch, partitions: int, step_s: float
) -> None:
    """Each fetch of a partition answered with 50 records, 10 handed out a poll: each
    partition's batch waits behind the others' for polls on end, `step_s` apart (31 s: a
    poll loop whose group commits each hang their 30 s). One more partition, read to its
    end, is answered at every round. None is ever looked at; all are read."""
    clock = Clock()
    stamped_by(monkeypatch, clock)
    parts = {p: Part(records=True, count=50, high=10**6, lso=10**6) for p in range(partitions)}
    parts[partitions] = Part()
    broker = Broker(parts)
    group = GroupConsumer(
        "localhost:9092",
        "g",
        [TOPIC],
        on_assigned=nothing,
        on_revoked=nothing,
        clock=clock,
        max_poll_records=10,
    )
    positions = {p: 0 for p in range(partitions)} | {partitions: 100}
    over(group._consumer, broker, positions, prefetch_backoff=0)
    handed: dict[int, int] = {}
    try:
        for _ in range(20 * partitions):  # each partition's batch waiting four times
            await broker.round()
            clock.now += step_s
            for (_, p), records in (await group.poll(timeout_ms=0)).items():
                handed[p] = handed.get(p, 0) + len(records)
    finally:
        await close(group._consumer)
    assert broker.ends_asked == [], "no partition stood still for the bound"
    assert set(handed) == set(range(partitions))


class _Rewound:
    """A consumer whose t[0] hands out three records from its position at each fetch and is
    answered each time; t[1] is never answered (due for a look at the bound), its end
    offsets held until `gate` opens (the look waits on the broker), at its position."""

    def __init__(self) -> None:
        self.gate, self.asking = asyncio.Event(), asyncio.Event()
        self.at = 100
        self.answered = 0

    def assignment(self) -> set[TopicPartition]:
        return {TP0, TP1}

    def paused(self) -> set[TopicPartition]:
        return set()

    def last_poll_timestamp(self, tp: TopicPartition) -> int | None:
        return self.answered if tp == TP0 else None

    async def position(self, tp: TopicPartition) -> int:
        return self.at if tp == TP0 else 5

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        self.asking.set()
        await self.gate.wait()
        return {tp: 5 for tp in tps}

    async def getmany(self, timeout_ms: int = 0) -> dict[TopicPartition, list[Any]]:
        got = [
            SimpleNamespace(
                topic=TOPIC, partition=0, offset=o, key=None, value=b"", timestamp=0, headers=()
            )
            for o in range(self.at, self.at + 3)
        ]
        self.at += 3
        self.answered += 1
        return {TP0: got}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        if tp == TP0:
            self.at = offset


async def test_a_seek_while_the_broker_is_asked_gets_no_record_fetched_before_it() -> None:
    """The poll that looks at t[1] waits on its end offset; meanwhile a take rewinds t[0]
    to 100, its committed offset: that poll hands t[0] out from 100, read after the seek,
    not what was fetched before it (103..105)."""
    clock = Clock()
    consumer = _Rewound()
    group = GroupConsumer.__new__(GroupConsumer)
    group._consumer = cast(Any, consumer)
    group._read, group._refused, group._topics = ReadPositions(), RefusedTopics(), [TOPIC]
    group._watch = FetchWatch(consumer, group._read.moves, clock)
    first = await group.poll()
    assert [r.offset for r in first[(TOPIC, 0)]] == [100, 101, 102]
    clock.now += STALL_S
    for _ in range(3):
        polling = asyncio.ensure_future(group.poll())
        asking = asyncio.ensure_future(consumer.asking.wait())
        await asyncio.wait({polling, asking}, return_when=asyncio.FIRST_COMPLETED)
        if asking.done():
            break
        asking.cancel()
        await polling
        clock.now += LOOK_EVERY_S
    else:
        raise AssertionError("t[1] was never looked at")
    assert group.seek(TOPIC, 0, 100)  # the take's rewind, while the poll waits
    consumer.gate.set()
    got = await polling
    assert [r.offset for r in got[(TOPIC, 0)]] == [100, 101, 102]


class _Counted:
    """A consumer of two partitions, its fetch stamps counted as read; t[0] never answered,
    its records handed out at the polls it is given, t[1] never answered nor handed."""

    def __init__(self) -> None:
        self.read = 0
        self.give = False
        self.asked: list[list[TopicPartition]] = []

    def assignment(self) -> set[TopicPartition]:
        return {TP0, TP1}

    def paused(self) -> set[TopicPartition]:
        return set()

    def last_poll_timestamp(self, tp: TopicPartition) -> int | None:
        self.read += 1
        return None

    async def position(self, tp: TopicPartition) -> int:
        return 5

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        self.asked.append(sorted(tps))
        return {tp: 5 for tp in tps}  # at their end: watched anew


async def test_progress_is_read_once_a_second_what_was_handed_between_counted() -> None:
    """Polls a tenth of a second apart: the stamps are read at one poll in ten. t[0]'s
    records are handed out only at polls in between, never at one that reads them: never
    due; t[1], never handed out, is looked at once the bound is past."""
    clock = Clock()
    consumer = _Counted()
    watch = FetchWatch(consumer, lambda tp: 0, clock)
    polls = 0
    while not consumer.asked:
        await watch.check()
        polls += 1
        # Handed out at the polls reading no stamp (the look's own poll reads them first).
        watch.polled({TP0: [object()]} if polls % 10 == 5 else {})
        clock.now += LOOK_EVERY_S / 10
        assert polls < 2 * STALL_S / (LOOK_EVERY_S / 10), "never looked at"
    assert consumer.asked == [[TP1]], "t[0] was handed out meanwhile"
    assert consumer.read <= 2 * (polls // 10 + 1), "two stamps a second at most"
    assert clock.now - 1000.0 >= STALL_S
