"""A timer operation the store refuses (not a fault of the store's own) among those a
cycle's decisions carried out at once on the timer table: it is that operation's alone,
and those after it in the same batch are carried out all the same (#19: a cancel decided
after a refused schedule was dropped until the subscription read it back, so its timer
could fire after its cancel was decided)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from fakes import RunningNode, wait_until
from pydantic import BaseModel
from test_node_lifecycle import HeldCommits

from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType, Command, Decision, Event
from app.protocol.dead_letters import DeadLetter
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import CommandEnvelope, EventEnvelope, decode, encode
from app.service import Service
from app.timers.subscription import PutTimer, TimerOp, apply_all, timer_op
from tables import AggregateRef, CommandSpec, OnceRule, Timer, TimerStatus, open_timer_store
from tables.partition_handle import PartitionHandle
from tables.partitioner import partition_of

PARTITIONS = 2
REFUSED = "refused"


class Count(BaseModel):
    fired: int = 0


AGG = AggregateType("ops", "swap", Count)
TOPICS = AggregateTopics("ops", "swap")


@AGG.command("Schedule")
def _schedule(state: Count, cmd: Command, d: Decision) -> None:
    d.schedule("k", OnceRule(at=int(cmd.body["at"])), CommandSpec(type="Fire"))


@AGG.command("Swap")
def _swap(state: Count, cmd: Command, d: Decision) -> None:
    """Two timer operations in one decision: a schedule the store refuses, then a cancel."""
    d.schedule(REFUSED, OnceRule(at=int(cmd.body["at"])), CommandSpec(type="Fire"))
    d.cancel_schedule("k")


@AGG.command("Fire")
def _fire(state: Count, cmd: Command, d: Decision) -> None:
    d.emit("Fired", {"n": state.fired + 1})


@AGG.applies("Fired")
def _fired(state: Count, e: Event) -> Count:
    return state.model_copy(update={"fired": e.body["n"]})


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.fixture
async def log() -> AsyncIterator[MemoryLog]:
    yield MemoryLog()


@pytest.fixture
async def refusing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The store refuses every write of a timer under key REFUSED (a bad argument)."""
    put_many = PartitionHandle.put_many

    async def refuse(self: PartitionHandle, timers: Sequence[Timer]) -> list[Timer]:
        if any(t.key == REFUSED for t in timers):
            raise ValueError(f"timer {REFUSED!r} refused")
        return await put_many(self, timers)

    monkeypatch.setattr(PartitionHandle, "put_many", refuse)


async def command(log: MemoryLog, type_: str, **body: Any) -> None:
    cmd = CommandEnvelope(
        request_id=uuid.uuid4().hex,
        type=type_,
        aggregate=AggregateRef(context="ops", aggregate="swap", id="o1"),
        body=body,
        issued_at=now_ms(),
    )
    p = partition_of("o1", PARTITIONS)
    await log.publisher().send(TOPICS.commands, b"o1", encode(cmd), p)


def events(log: MemoryLog, type_: str) -> list[EventEnvelope]:
    p = partition_of("o1", PARTITIONS)
    found = [decode(EventEnvelope, r.value) for r in log.records(TOPICS.events, p)]
    return [e for e in found if e.type == type_]


def timer_rows(log: MemoryLog) -> dict[str, Timer]:
    latest: dict[bytes, bytes | None] = {}
    for r in log.records(TOPICS.timers_changelog, partition_of("o1", PARTITIONS)):
        assert r.key is not None
        latest[r.key] = r.value
    rows = [Timer.model_validate_json(v) for v in latest.values() if v is not None]
    return {t.key: t for t in rows}


async def test_a_cancel_after_a_refused_schedule_in_one_batch_is_carried_out_at_once(
    log: MemoryLog, tmp_path: Path, refusing: None
) -> None:
    """Timer "k" is due in a second; one decision schedules a timer the store refuses,
    then cancels "k". Its commit is held (the subscription cannot read the cancel back):
    "k" must not fire all the same. Once read back, the refused schedule's event is
    dead-lettered, as any event the store refuses."""
    node = await RunningNode(log, tmp_path, "a", Service(aggregates=(AGG,)), PARTITIONS).start()
    try:
        await wait_until(node.runs)
        due = now_ms() + 1_000
        await command(log, "Schedule", at=due)
        await wait_until(lambda: "k" in timer_rows(log))
        held = HeldCommits(log)
        await command(log, "Swap", at=due + 3_600_000)
        await wait_until(held.entered.is_set)  # decided; its commit held, so not read back
        kept = node.node.types[AGG.type_name]
        await wait_until(lambda: now_ms() > due + 100)
        await wait_until(lambda: kept.runner.backlog(now_ms())[0] == 0)  # taken and decided
        held.release()
        rounds = kept.loop.rounds
        await wait_until(lambda: not kept.transactions.pending() and node.node.commits.lag() == 0)
        await wait_until(lambda: kept.loop.rounds >= rounds + 2 and kept.runner.in_flight == 0)
        assert events(log, "wow.ScheduleCancelled")
        assert events(log, "Fired") == [], "fired after its cancel was decided"
        assert {k: t.status for k, t in timer_rows(log).items()} == {"k": TimerStatus.CANCELLED}
        letters = [
            DeadLetter.read(r.key, r.value, r.headers)
            for r in log.records(ContextTopics("ops").dead_letters, 0)
        ]
        refused = [e for e in events(log, "wow.ScheduleSet") if e.body["key"] == REFUSED]
        assert [(d.topic, decode(EventEnvelope, d.value).id) for d in letters] == [
            (TOPICS.events, refused[0].id)
        ]
        assert node.runs()
    finally:
        for h in HeldCommits.held:
            h.release()  # failed holding commits: the node can stop
        HeldCommits.held.clear()
        await node.stop()


def schedule_set(owner: str, key: str, version: int) -> PutTimer:
    at = 1_800_000_000_000
    body = {"key": key, "rule": {"kind": "once", "at": at}, "command": {"type": "Fire"}}
    ref = AggregateRef(context="ops", aggregate="swap", id=owner)
    e = EventEnvelope(
        id=f"{owner}-{key}",
        type="wow.ScheduleSet",
        aggregate=ref,
        version=version,
        created_at=at,
        body=body,
    )
    op = timer_op(e, partition_of(owner, PARTITIONS))
    assert isinstance(op, PutTimer)
    return op


async def test_the_ops_around_a_refused_one_are_carried_out_and_it_alone_is_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run of puts holding a refused one is written again put by put: the refused put
    alone is told (its index), and every other op, before or after it, is carried out."""
    store = open_timer_store("memory://", partitions=PARTITIONS)
    put_many = store.put_many

    async def refuse(timers: Sequence[Timer]) -> list[Timer]:
        if any(t.key == REFUSED for t in timers):
            raise ValueError(f"timer {REFUSED!r} refused")
        return await put_many(timers)

    monkeypatch.setattr(store, "put_many", refuse)
    await store.put_many([schedule_set("o2", "k", 1).timer])
    cancel = timer_op(
        EventEnvelope(
            id="o2-cancel",
            type="wow.ScheduleCancelled",
            version=2,
            created_at=0,
            aggregate=AggregateRef(context="ops", aggregate="swap", id="o2"),
            body={"key": "k"},
        ),
        partition_of("o2", PARTITIONS),
    )
    assert cancel is not None
    ops: list[TimerOp] = [schedule_set("o1", "a", 1), schedule_set("o1", REFUSED, 2), cancel]
    ops.append(schedule_set("o1", "b", 3))
    told: list[tuple[int, str]] = []
    changed, put = await apply_all(store, ops, lambda i, exc: told.append((i, str(exc))))
    assert told == [(1, f"timer {REFUSED!r} refused")]
    assert changed == 3 and [t.key for t in put] == ["a", "b"]
    owner = AggregateRef(context="ops", aggregate="swap", id="o2")
    assert [t.status for t in await store.timers_of(owner)] == [TimerStatus.CANCELLED]
    with pytest.raises(ValueError, match="refused"):
        await apply_all(store, ops)  # without `refused`: the first refused op raises
