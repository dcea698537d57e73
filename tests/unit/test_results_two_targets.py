"""Two sends of one request id to two targets (`ResultsReader`): the timers of two aggregate
types' events of one id (unique in each log, as the wire format asks) are sent at once as
`<id>#0`. Each send is settled by its own target's answer alone: keyed by request id only,
the second send took the first target's answer (a slot its target refused stored FIRED,
never applied) or waited out its timeout with its answer read and passed over."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fakes import RunningNode, running, wait_until
from pydantic import BaseModel
from test_node_fuzz import CONTEXT, PARTITIONS, counter, now_ms, owners, write

from app.kafka import TopicSpec
from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType, Command, Decision, Event
from app.node import node_topics
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import (
    SCHEDULE_SET,
    CommandResult,
    EventEnvelope,
    ResultCode,
    ScheduleSet,
    encode,
)
from app.service import Service
from app.timers.sender import ResultsReader
from tables import AggregateRef, CommandSpec, OnceRule, Timer, TimerStatus
from tables.partitioner import partition_of

T0 = 1_800_000_000_000
X = AggregateRef(context="c", aggregate="order", id="x")
Y = AggregateRef(context="c", aggregate="other", id="y")


async def answer(log: MemoryLog, request_id: str, target: AggregateRef, code: ResultCode) -> None:
    result = CommandResult(request_id=request_id, code=code, aggregate=target, decided_at=T0)
    await log.publisher().send(ContextTopics("c").results, b"k", encode(result), 0)


async def test_each_send_of_one_request_id_takes_its_own_targets_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = MemoryLog([TopicSpec(ContextTopics("c").results, 1)])
    reader = ResultsReader(log.follower, "c")
    await reader.start()
    await reader.add_partition(0)
    try:
        to_x, to_y = reader.expect("e-1#0", X), reader.expect("e-1#0", Y)
        await answer(log, "e-1#0", Y, ResultCode.ERROR)
        assert (await asyncio.wait_for(to_y, 2)).code is ResultCode.ERROR
        assert not to_x.done()  # Y's answer is none of X's send
        await answer(log, "e-1#0", X, ResultCode.COMMITTED)
        assert (await asyncio.wait_for(to_x, 2)).code is ResultCode.COMMITTED
        reader.forget("e-1#0", Y, to_y)
        reader.forget("e-1#0", X, to_x)

        # Two sends of one id to one target: one send given up (timed out, cancelled) never
        # cancels the other's wait, nor does its forget end it.
        first, second = reader.expect("e-2#0", X), reader.expect("e-2#0", X)
        first.cancel()
        reader.forget("e-2#0", X, first)
        reader.forget("e-2#0", X, first)  # twice: the other send's wait still counts
        with caplog.at_level("WARNING", logger="app.timers.sender"):
            await answer(log, "e-2#0", Y, ResultCode.COMMITTED)  # none of the send's
            await answer(log, "e-2#0", X, ResultCode.COMMITTED)
            assert (await asyncio.wait_for(second, 2)).code is ResultCode.COMMITTED
        assert [r for r in caplog.records if "not an aggregate it was sent to" in r.message]
        reader.forget("e-2#0", X, second)
    finally:
        await reader.stop()


class State(BaseModel):
    n: int = 0


other = AggregateType(CONTEXT, "other", State)


@other.command("Ping")
def _ping(state: State, cmd: Command, d: Decision) -> None:
    d.emit("Pinged", {})


@other.applies("Pinged")
def _pinged(state: State, e: Event) -> State:
    return state


SERVICE = Service(aggregates=(counter, other))
COUNTERS, OTHERS = AggregateTopics(CONTEXT, "counter"), AggregateTopics(CONTEXT, "other")


def set_event(
    topics: AggregateTopics, owner: str, at: int, now: int, target: str, command: str
) -> tuple[str, int, bytes, bytes]:
    """`owner`'s `wow.ScheduleSet` under the event id "evt-1", its timer sending `command`
    to `target`, an aggregate of the owner's type."""
    body = ScheduleSet(
        key="k",
        rule=OnceRule(at=at),
        command=CommandSpec(type=command),
        target=AggregateRef(context=CONTEXT, aggregate=topics.aggregate, id=target),
    )
    event = EventEnvelope(
        id="evt-1",
        type=SCHEDULE_SET,
        aggregate=AggregateRef(context=CONTEXT, aggregate=topics.aggregate, id=owner),
        version=1,
        created_at=now,
        body=body.model_dump(mode="json"),
    )
    return topics.events, partition_of(owner, PARTITIONS), owner.encode(), encode(event)


def settled(log: MemoryLog, topics: AggregateTopics, owner: str) -> Timer | None:
    """`owner`'s timer row once its send is settled (its last row past FIRING)."""
    rows = [
        Timer.model_validate_json(r.value)
        for r in log.records(topics.timers_changelog, partition_of(owner, PARTITIONS))
        if r.value is not None
    ]
    mine = [t for t in rows if t.owner.id == owner]
    return mine[-1] if len(mine) > 1 and mine[-1].status is not TimerStatus.FIRING else None


async def test_two_types_timers_of_one_event_id_are_each_settled_by_their_target(
    tmp_path: Path,
) -> None:
    log = MemoryLog()
    log.ensure_topics(node_topics([COUNTERS, OTHERS], PARTITIONS))
    (a,), (b,) = owners(0, 1, prefix="oa"), owners(1, 1, prefix="ob")
    # Targets in a third partition: both sends are remote, in flight together.
    (x,), (y,) = owners(2, 1, prefix="tx"), owners(2, 1, prefix="ty")
    node = RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS, session_timeout_ms=10_000)
    async with running(node):
        now = now_ms()
        await write(log, set_event(COUNTERS, a, now + 500, now, x, "Fire"))
        # The other type has no handler of "NoSuch": its target answers ERROR.
        await write(log, set_event(OTHERS, b, now + 500, now, y, "NoSuch"))
        await wait_until(
            lambda: settled(log, COUNTERS, a) is not None and settled(log, OTHERS, b) is not None,
            within=15,
        )
        fired, refused = settled(log, COUNTERS, a), settled(log, OTHERS, b)
        assert fired is not None and refused is not None
        assert fired.status is TimerStatus.FIRED, fired
        assert refused.status is not TimerStatus.FIRED and refused.error_code == "ERROR", refused
