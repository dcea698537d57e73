"""Operators' requests and reads (`app.timers.operator`) on the in-memory log, through the
`Clients` port as the CLI and the page use them: retry and skip write one op to every
partition of the type's timer-ops topic; the timer table is read back from its changelog,
creating no topic when it is not there; the page's form goes through the node's clients."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from fakes import GOOD, NODE, PAGE_PARTITIONS, TYPE, FakeNode, ref, stored_timer
from multidict import MultiDict

from app.errors import KafkaUnavailable, MissingTopic
from app.kafka import TopicSpec
from app.kafka.memory import MemoryLog
from app.ops.page import OperatorPage
from app.protocol.topics import parse_aggregate_type
from app.protocol.wire import TimerAction, TimerOp, decode
from app.timers.operator import read_timers, request_retry, request_skip
from tables import AggregateRef, Timer, TimerStatus
from tables.keys import encode_timer, row_key

Requester = Callable[[MemoryLog, str, AggregateRef, int], Awaitable[TimerOp]]

TOPICS = parse_aggregate_type(TYPE)
TARGET = AggregateRef(context="shop", aggregate="order", id="t-9")


def ops(log: MemoryLog) -> list[tuple[int, bytes | None, TimerOp]]:
    """(partition, key, op) of every record of the timer-ops topic."""
    return [
        (r.partition, r.key, decode(TimerOp, r.value))
        for p in range(log.partitions(TOPICS.timer_ops))
        for r in log.records(TOPICS.timer_ops, p)
    ]


def type_log(partitions: int) -> MemoryLog:
    """The type's topics, as its workers make them (its context's results topic not)."""
    return MemoryLog(
        [TopicSpec(TOPICS.events, partitions), TopicSpec(TOPICS.timer_ops, partitions)]
    )


@pytest.mark.parametrize(
    ("request_", "action"), [(request_retry, TimerAction.RETRY), (request_skip, TimerAction.SKIP)]
)
async def test_a_request_is_written_once_to_every_partition(
    request_: Requester, action: TimerAction
) -> None:
    log = type_log(3)
    op = await request_(log, TYPE, TARGET, 3)
    assert (op.action, op.target) == (action, TARGET)
    assert ops(log) == [(p, str(TARGET).encode(), op) for p in range(3)]


@pytest.mark.parametrize("request_", [request_retry, request_skip])
async def test_a_request_for_a_type_without_its_topics_creates_nothing(
    request_: Requester,
) -> None:
    """A mistyped type (`--type shpo.order`): its timer-ops topic was made, of 12
    partitions, and the request said sent."""
    log = MemoryLog([TopicSpec(TOPICS.events, 3)])
    typo = "shpo.order"
    with pytest.raises(MissingTopic) as missing:
        await request_(log, typo, TARGET, 3)
    said = str(missing.value)
    assert said.startswith(f"unknown type {typo}: topics {typo}.events and {typo}.timer-ops ")
    assert "nothing was created or sent" in said
    with pytest.raises(MissingTopic, match=f"topic {TOPICS.timer_ops} of {TYPE} does not"):
        await request_(log, TYPE, TARGET, 3)
    assert log.topic_names() == {TOPICS.events}


async def test_a_timer_ops_topic_of_another_partition_count_is_refused() -> None:
    log = MemoryLog([TopicSpec(TOPICS.timer_ops, 2)])
    with pytest.raises(KafkaUnavailable, match="has 2 partitions, expected 3"):
        await request_retry(log, TYPE, TARGET, 3)
    assert ops(log) == []


def row(owner_id: str, key: str, status: TimerStatus, due: int, partition: int) -> Timer:
    owner = AggregateRef(context="shop", aggregate="order", id=owner_id)
    return stored_timer(owner, key, status, due, partition, id=f"{owner_id}-{key}")


async def test_the_table_is_read_back_from_its_changelog() -> None:
    log = MemoryLog([TopicSpec(TOPICS.timers_changelog, 2)])
    a = row("o-1", "remind", TimerStatus.PENDING, 5_000, 0)
    b = row("o-2", "remind", TimerStatus.PARKED, 1_000, 1)
    gone = row("o-3", "remind", TimerStatus.PENDING, 2_000, 1)

    def put(t: Timer, value: bytes | None) -> tuple[str, int, bytes, bytes | None]:
        return (TOPICS.timers_changelog, t.partition, row_key(t.owner, t.key), value)

    await log.publisher().send_many(
        [
            put(a, encode_timer(a.model_copy(update={"status": TimerStatus.PAUSED}))),
            put(a, encode_timer(a)),  # the latest row of a key counts
            put(b, encode_timer(b)),
            put(gone, encode_timer(gone)),
            put(gone, None),  # deleted
        ]
    )
    assert await read_timers(log, TYPE) == [a, b]
    assert await read_timers(log, TYPE, status=TimerStatus.PARKED) == [b]
    with pytest.raises(KafkaUnavailable, match="has 2 partitions, expected 4"):
        await read_timers(log, TYPE, partitions=4)


async def test_reading_a_table_without_a_changelog_creates_nothing() -> None:
    log = MemoryLog()
    with pytest.raises(MissingTopic, match=f"topic {TOPICS.timers_changelog} does not exist"):
        await read_timers(log, TYPE)
    assert log.topic_names() == set()


async def test_the_pages_form_is_written_with_the_nodes_clients() -> None:
    log = type_log(PAGE_PARTITIONS)
    page = OperatorPage(FakeNode(log=log), NODE)
    acted = await page.act("skip", MultiDict({**GOOD, "back": "/"}))
    # No worker ever ran on this log (no results topic): sent, and said unanswered.
    assert acted.rendered is not None and acted.rendered.status == 504
    written = ops(log)
    assert [p for p, _, _ in written] == list(range(PAGE_PARTITIONS))
    assert {(op.action, op.target) for _, _, op in written} == {(TimerAction.SKIP, ref("t-1"))}
