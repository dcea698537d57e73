"""A partition whose fetches the broker answers with an error aiokafka 0.14 has no branch
for (CORRUPT_MESSAGE: a batch header corrupt on its disk; UNKNOWN_SERVER_ERROR;
KAFKA_STORAGE_ERROR) was fetched again for ever: aiokafka logs "Unexpected error while
fetching data" and `getmany` never raises it. The group's poll returned nothing of it for
good, no poll failed (`POLL_FAILING_S` never counted), no `FetchRefused` (out of range
only): the partition stopped while the rest went on and the node said it was ready; a
results partition so made every remote send wait out its timeout and park. Now a
partition read (assigned, not paused) with no fetch of it answered, nothing of it handed
out and nothing moving it for `STALL_S` is compared with its end as read_committed sees
it: records waiting behind its position, `FetchStalled` (a `FetchRefused`) stops the node.
Held at the last stable offset by an open transaction, paused, or read to its end, it is
not stopped.

Over aiokafka's real fetcher, its broker a fake (`fakes_fetch`), on the test's clock; the
decision alone: `test_fetch_stalls`."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fakes_fetch import CORRUPT_MESSAGE, TOPIC, Broker, Clock, Part, close, over, stamped_by
from fakes_poll import NoOffsets, Task

from app.errors import KafkaUnavailable
from app.kafka.fetch_stalls import STALL_S, FetchStalled
from app.kafka.group_consumer import GroupConsumer
from app.kafka.partition_reader import PartitionReader
from app.node.polling import poll_loop
from app.node.task_id import TaskId
from app.timers.sender import FollowerPolls

STEP_S = 5.0
"""The test's clock between two polls."""

# The group consumer and the poll loop, over aiokafka's real fetcher.


async def nothing(_: set[tuple[str, int]]) -> None:
    return None


def group_over(broker: Broker, clock: Clock, positions: dict[int, int]) -> Any:
    group = GroupConsumer(
        "localhost:9092", "g", [TOPIC], on_assigned=nothing, on_revoked=nothing, clock=clock
    )
    over(group._consumer, broker, positions)
    return group


class TooManyPolls(Exception):
    """The poll loop polled on past any bound: the partition was never stopped."""


async def test_the_poll_loop_stops_the_node_on_a_partition_whose_fetches_all_fail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """t[0]'s every fetch answered CORRUPT_MESSAGE, t[1] read on meanwhile: within the
    bound (and a poll) the loop calls `fail`, naming t[0], its position and its end."""
    clock = Clock()
    stamped_by(monkeypatch, clock)
    broker = Broker({0: Part(error=CORRUPT_MESSAGE), 1: Part(records=True, high=10**6, lso=10**6)})
    group = group_over(broker, clock, {0: 50, 1: 0})
    polls = 0
    poll = group.poll

    async def one_round(timeout_ms: int = 500) -> dict[tuple[str, int], list[Any]]:
        nonlocal polls
        polls += 1
        if polls > 3 * STALL_S / STEP_S:
            raise TooManyPolls(f"{polls} polls, {clock.now - 1000:.0f} s, never stopped")
        await broker.round()
        clock.now += STEP_S
        return dict(await poll(timeout_ms=0))

    group.poll = one_round
    running = {TaskId("order", p): Task(asyncio.Queue()) for p in (0, 1)}
    failed: list[str] = []
    try:
        await poll_loop(group, running, NoOffsets(), failed.append, {TOPIC: "order"}, clock=clock)
    finally:
        await close(group._consumer)
    [why] = failed
    assert why.startswith(
        "a partition's reading stopped: t[0]: no fetch of it was answered for 60 s while "
        "records wait (its position 50, its end 100)"
    ), why
    assert polls == STALL_S / STEP_S + 1, "the first poll past the bound"
    assert running[TaskId("order", 0)].queue.empty()
    assert running[TaskId("order", 1)].queue.qsize() == polls - 1, "t[1] read on meanwhile"
    assert broker.ends_asked == [1], "once, read_committed: the last stable offset"


async def _polled(group: Any, broker: Broker, clock: Clock, polls: int) -> None:
    for _ in range(polls):
        await broker.round()
        clock.now += STEP_S
        await group.poll(timeout_ms=0)


@pytest.mark.parametrize("error", [0, CORRUPT_MESSAGE], ids=["answered", "unanswered"])
async def test_a_partition_held_at_its_last_stable_offset_is_not_stopped(
    monkeypatch: pytest.MonkeyPatch, error: int
) -> None:
    """Another producer's open transaction holds t[0] at its last stable offset (50, its
    high watermark 100): nothing to read as read_committed sees it, whether its fetches are
    answered (empty) or not."""
    clock = Clock()
    stamped_by(monkeypatch, clock)
    broker = Broker({0: Part(error=error, lso=50), 1: Part(records=True, high=10**6, lso=10**6)})
    group = group_over(broker, clock, {0: 50, 1: 0})
    try:
        await _polled(group, broker, clock, int(3 * STALL_S / STEP_S))
    finally:
        await close(group._consumer)
    assert set(broker.ends_asked) <= {1}, "never the high watermark (read_uncommitted)"
    assert bool(broker.ends_asked) == bool(error), "asked only of a partition unanswered"


@pytest.mark.parametrize("error", [0, CORRUPT_MESSAGE], ids=["answered", "unanswered"])
async def test_a_partition_read_to_its_end_is_not_stopped(
    monkeypatch: pytest.MonkeyPatch, error: int
) -> None:
    clock = Clock()
    stamped_by(monkeypatch, clock)
    broker = Broker({0: Part(error=error), 1: Part(records=True, high=10**6, lso=10**6)})
    group = group_over(broker, clock, {0: 100, 1: 0})
    try:
        await _polled(group, broker, clock, int(3 * STALL_S / STEP_S))
    finally:
        await close(group._consumer)


async def test_a_paused_partition_is_not_stopped_until_read_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Paused (its worker's queue full, its take not running), t[0] is not fetched: its
    time stands. Resumed, its fetches all failing, it is stopped a bound later."""
    clock = Clock()
    stamped_by(monkeypatch, clock)
    broker = Broker({0: Part(error=CORRUPT_MESSAGE), 1: Part(records=True, high=10**6, lso=10**6)})
    group = group_over(broker, clock, {0: 50, 1: 0})
    try:
        await _polled(group, broker, clock, 1)
        group.pause([(TOPIC, 0)])
        await _polled(group, broker, clock, int(3 * STALL_S / STEP_S))
        group.resume([(TOPIC, 0)])
        await _polled(group, broker, clock, int(STALL_S / STEP_S))
        with pytest.raises(FetchStalled, match=r"t\[0\]: .* \(its position 50, its end 100\)"):
            await _polled(group, broker, clock, 1)
    finally:
        await close(group._consumer)


# The results reader (and the ledger's follower), over aiokafka's real fetcher.


async def test_a_follower_whose_partition_fetches_all_fail_stops_at_once_past_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A results partition so stalled made every remote send wait out its timeout and
    park while the node said it was ready. Its `FetchStalled` ends the follower's polls
    (and the node) at once: not retried for another `POLL_FAILING_S` as a broker away is."""
    clock = Clock()
    stamped_by(monkeypatch, clock)
    broker = Broker({0: Part(error=CORRUPT_MESSAGE), 1: Part(records=True, high=10**6, lso=10**6)})
    reader = PartitionReader("localhost:9092", TOPIC, clock=clock)
    over(reader._consumer, broker, {0: 50, 1: 0})
    polls, read = FollowerPolls(reader, monotonic=clock), 0
    try:
        with pytest.raises(FetchStalled) as e:
            for _ in range(int(3 * STALL_S / STEP_S)):
                await broker.round()
                clock.now += STEP_S
                read += len(await polls.poll())
    finally:
        await close(reader._consumer)
    assert str(e.value).startswith(
        "t[0]: no fetch of it was answered for 60 s while records wait (its position 50, "
        "its end 100)"
    )
    assert isinstance(e.value, KafkaUnavailable) and polls.failing is None
    assert read == STALL_S / STEP_S, "t[1] read on meanwhile"
