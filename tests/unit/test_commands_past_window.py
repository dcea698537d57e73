"""A command older than the de-duplication window is not decided (fake clock).

Its request id is kept for the window from its first decision, and that was no earlier
than when it was issued: a command issued longer ago than the window (the later of its
`issued_at` and its record's timestamp) may have been applied under an id forgotten since.
A group whose committed offsets were deleted, or expired over a long outage, reads its
commands from the start and met exactly that: every command older than the window was
applied again. Such a command is answered ERROR and dead-lettered instead; one whose id is
still kept is a DUPLICATE as any; a dead letter replayed (its record dated afresh) is
decided.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest
from fakes import T0, FakeClock, RunningNode, order_type, wait_until
from pydantic import BaseModel

from app.commands.processor import CommandProcessor
from app.kafka import OutRecord, Record
from app.kafka.memory import MemoryLog
from app.kafka.records import headers_of
from app.model.aggregate import AggregateType, Command, Decision, Event
from app.model.decide import CLOCK_SKEW_MS
from app.protocol.dead_letters import DeadLetterContext
from app.protocol.request_window import margin_ms
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import CommandEnvelope, CommandResult, EventEnvelope, ResultCode, decode
from app.protocol.wire import encode as encode_wire
from app.service import Service
from tables import AggregateRef
from tables.aggregate_store import MemoryAggregateStore
from tables.partitioner import partition_of

HOUR, DAY = 3_600_000, 86_400_000
ORDER = AggregateRef(context="shop", aggregate="order", id="o-1")
P = partition_of(ORDER.id, 4)
WINDOW = 2 * HOUR
MARGIN = margin_ms(WINDOW, CLOCK_SKEW_MS)


class Written:
    def __init__(self) -> None:
        self.records: list[OutRecord] = []

    async def __call__(self, records: Sequence[OutRecord], offsets: object) -> list[int]:
        start = len(self.records)
        self.records.extend(records)
        return list(range(start, len(self.records)))

    def topics(self) -> list[str]:
        return [r[0] for r in self.records]


def record(request_id: str, issued_at: int, timestamp: int, offset: int = 0) -> Record:
    cmd = CommandEnvelope(
        request_id=request_id, type="shop.Remind", aggregate=ORDER, issued_at=issued_at
    )
    return Record("shop.order.commands", P, offset, b"o-1", encode_wire(cmd), timestamp, ())


def processor(now: list[int], written: Written) -> CommandProcessor:
    return CommandProcessor(
        order_type(), P, partitions=4, states=MemoryAggregateStore(), commit=written,
        now=lambda: now[0], request_id_window=WINDOW,
    )  # fmt: skip


async def test_a_command_issued_longer_ago_than_the_window_is_dead_lettered_not_decided() -> None:
    now, written = [T0 + WINDOW + 1], Written()
    stats = await processor(now, written).handle([record("r-1", T0, T0)])
    assert dict(stats.codes) == {ResultCode.ERROR: 1}
    assert stats.dead_letters == 1
    assert "shop.order.events" not in written.topics(), "its handler did not run"
    [letter] = [r for r in written.records if r[0] == "shop.dead-letters"]
    context = DeadLetterContext.from_headers(headers_of(letter))
    assert "request-id window" in context.exception_message
    assert "new request id" in context.exception_message
    [answer] = [decode(CommandResult, r[3]) for r in written.records if r[0] == "shop.results"]
    assert answer.code is ResultCode.ERROR and "request-id window" in answer.message


async def test_within_the_window_less_the_skew_or_under_an_id_still_kept_it_is_decided() -> None:
    now, written = [T0], Written()
    node = processor(now, written)
    assert dict((await node.handle([record("r-1", T0, T0)])).codes) == {ResultCode.COMMITTED: 1}
    # Written WINDOW - MARGIN - 1 ago: within the window, whatever the clocks' skew.
    now[0] = T0 + WINDOW - MARGIN - 1
    assert dict((await node.handle([record("r-2", T0, T0, 1)])).codes) == {ResultCode.COMMITTED: 1}
    now[0] += 1  # a clock ahead by the margin may have forgotten its id already
    assert dict((await node.handle([record("r-3", T0, T0, 2)])).codes) == {ResultCode.ERROR: 1}
    now[0] = T0 + WINDOW + HOUR
    # r-2 was applied at T0 + WINDOW - MARGIN - 1 and is kept a window from then:
    # a copy of it written at T0 is its DUPLICATE, not refused.
    assert dict((await node.handle([record("r-2", T0, T0, 3)])).codes) == {ResultCode.DUPLICATE: 1}


@pytest.mark.parametrize(("timestamp", "issued_at"), [(T0 + DAY, T0), (-1, T0 + DAY)])
async def test_a_command_dated_ahead_of_the_clock_past_the_margin_is_dead_lettered(
    timestamp: int, issued_at: int
) -> None:
    # Decided now, its id would be forgotten a window from now while its record, dated a
    # day ahead, still read as within the window: read again then (the group's offsets
    # lost), it would be applied twice (review finding B1).
    now, written = [T0], Written()
    node = processor(now, written)
    ahead = record("r-1", issued_at, timestamp)
    stats = await node.handle([ahead])
    assert dict(stats.codes) == {ResultCode.ERROR: 1} and stats.dead_letters == 1
    [letter] = [r for r in written.records if r[0] == "shop.dead-letters"]
    context = DeadLetterContext.from_headers(headers_of(letter))
    assert "ahead of this node's clock" in context.exception_message
    now[0] = T0 + WINDOW + HOUR
    assert dict((await node.handle([ahead])).codes) == {ResultCode.ERROR: 1}, "never applied"
    # Within the margin it is decided (a producer's clock a few seconds or minutes ahead).
    now[0] = T0
    near = record("r-2", T0 + MARGIN, T0 + MARGIN, 1)
    assert dict((await node.handle([near])).codes) == {ResultCode.COMMITTED: 1}


async def test_a_replayed_letter_dated_afresh_by_its_record_is_decided() -> None:
    # A dead letter replayed keeps its command's issued_at; its record is written now.
    now, written = [T0 + 3 * DAY], Written()
    stats = await processor(now, written).handle([record("r-1", T0, now[0])])
    assert dict(stats.codes) == {ResultCode.COMMITTED: 1}


async def test_a_command_is_dated_by_its_record_not_by_the_issued_at_its_sender_claims() -> None:
    # Dated ahead by its sender (a clock ahead, a business time), its id forgotten a window
    # after its decision, it would stay decidable past that: read again then, applied twice.
    now, written = [T0], Written()
    node = processor(now, written)
    ahead = record("r-1", T0 + DAY, T0)
    assert dict((await node.handle([ahead])).codes) == {ResultCode.COMMITTED: 1}
    now[0] = T0 + WINDOW + HOUR
    await node.handle([record("r-9", now[0], now[0], 5)])  # its commit forgets r-1
    # The group's offsets lost, r-1 is read again.
    assert dict((await node.handle([ahead])).codes) == {ResultCode.ERROR: 1}
    assert dict((await node.handle([ahead])).codes) == {ResultCode.ERROR: 1}, "never applied again"
    # A record without a timestamp (Kafka's -1, an old message format) is dated by issued_at.
    assert dict((await node.handle([record("r-2", now[0], -1, 1)])).codes) == {
        ResultCode.COMMITTED: 1
    }
    assert dict((await node.handle([record("r-3", T0, -1, 2)])).codes) == {ResultCode.ERROR: 1}


class Ctr(BaseModel):
    n: int = 0


ctr = AggregateType("gl", "ctr", Ctr)


@ctr.command("Bump")
def _bump(state: Ctr, cmd: Command, d: Decision) -> None:
    d.emit("Bumped", {"n": state.n + 1})


@ctr.applies("Bumped")
def _bumped(state: Ctr, e: Event) -> Ctr:
    return state.model_copy(update={"n": e.body["n"]})


GL = AggregateTopics("gl", "ctr")
PARTITIONS = 2


def bumped(log: MemoryLog) -> list[int]:
    events = [
        decode(EventEnvelope, r.value) for q in range(PARTITIONS) for r in log.records(GL.events, q)
    ]
    return [e.body["n"] for e in events if e.type == "Bumped"]


def answers(log: MemoryLog) -> list[ResultCode]:
    topic = ContextTopics("gl").results
    return [
        decode(CommandResult, r.value).code
        for q in range(PARTITIONS)
        for r in log.records(topic, q)
    ]


async def test_a_group_whose_offsets_are_gone_applies_no_command_twice(tmp_path: Path) -> None:
    log, clock = MemoryLog(), FakeClock(T0)
    service = Service(aggregates=(ctr,))
    bump = CommandEnvelope(
        request_id=uuid.uuid4().hex, type="Bump", issued_at=T0,
        aggregate=AggregateRef(context="gl", aggregate="ctr", id="o1"),
    )  # fmt: skip
    first = RunningNode(log, tmp_path, "a", service, PARTITIONS, clock=clock)
    await first.start()
    try:
        await wait_until(first.runs, within=10)
        await log.publisher().send(
            GL.commands, b"o1", encode_wire(bump), partition_of("o1", PARTITIONS)
        )
        await wait_until(lambda: answers(log) == [ResultCode.COMMITTED], within=10)
    finally:
        await first.stop()
    # Its group deleted (`kafka-consumer-groups --delete`), or its offsets expired over an
    # outage longer than offsets.retention.minutes; the window passed too.
    log._groups.pop("g")
    clock.advance(8 * DAY)
    again = RunningNode(log, tmp_path, "a", service, PARTITIONS, clock=clock)
    await again.start()
    try:
        await wait_until(lambda: len(answers(log)) == 2, within=10)
        await asyncio.sleep(0)
    finally:
        await again.stop()
    assert bumped(log) == [1], "applied once"
    assert answers(log) == [ResultCode.COMMITTED, ResultCode.ERROR]
