"""A revoke's close is bounded by its deadline (`close_deadline_s`), its firing's stop
included: a park's failure-ledger write that does not come back (a broker that never
acknowledges) held `TimerRunner.stop_partition`, and so the revoke, past the group's
rebalance timeout. Past the deadline the partition is let go dirty, the node goes on, and
its next take fires the timer again."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fakes import RunningNode, wait_until
from pydantic import BaseModel

from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType, Command, Decision
from app.node.task_id import TaskId
from app.protocol.topics import AggregateTopics
from app.protocol.wire import CommandEnvelope, encode
from app.service import Service
from app.timers.ledger import KafkaFailureLedger
from app.timers.runner import TimerOptions
from app.timers.runner.options import RetryPolicy
from tables import AggregateRef, CommandSpec, OnceRule
from tables.partitioner import partition_of

PARTITIONS = 2
TOPICS = AggregateTopics("mem", "boom")


class State(BaseModel):
    n: int = 0


boom = AggregateType("mem", "boom", State)


@boom.command("Schedule")
def _schedule(state: State, cmd: Command, d: Decision) -> None:
    d.schedule("k", OnceRule(at=int(cmd.body["at"])), CommandSpec(type="Fire"))


@boom.command("Fire")
def _fire(state: State, cmd: Command, d: Decision) -> None:
    raise ValueError("the handler fails")  # parked at once (one attempt)


SERVICE = Service(aggregates=(boom,))
ONE_ATTEMPT = TimerOptions(retry=RetryPolicy(max_attempts=1))


async def hung_park(log: MemoryLog, monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """A timer of partition 0 set to fire at once, its handler failing, its park's failure-
    ledger write hanging (a broker that does not acknowledge) until the event returned is
    set; returns once the write began."""
    record = KafkaFailureLedger.record
    started, answered = asyncio.Event(), asyncio.Event()

    async def hanging(self: Any, subscription: str, target: Any, timers: Any) -> None:
        started.set()
        await answered.wait()
        await record(self, subscription, target, timers)

    monkeypatch.setattr(KafkaFailureLedger, "record", hanging)
    owner = next(f"o{i}" for i in range(1, 99) if partition_of(f"o{i}", PARTITIONS) == 0)
    now = int(time.time() * 1000)
    cmd = CommandEnvelope(
        request_id=uuid.uuid4().hex,
        type="Schedule",
        aggregate=AggregateRef(context="mem", aggregate="boom", id=owner),
        body={"at": now + 200},
        issued_at=now,
    )
    await log.publisher().send(TOPICS.commands, owner.encode(), encode(cmd), 0)
    await asyncio.wait_for(started.wait(), 10)
    return answered


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[RunningNode]:
    n = await RunningNode(
        MemoryLog(), tmp_path, "a", SERVICE, PARTITIONS, timers=ONE_ATTEMPT, options=ONE_ATTEMPT
    ).start()
    yield n
    await n.stop()


async def test_a_park_whose_ledger_write_hangs_holds_no_close_past_its_deadline(
    node: RunningNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = node.node.clients
    assert isinstance(log, MemoryLog)
    await wait_until(node.runs)
    answered = await hung_park(log, monkeypatch)
    shared = node.node.tasks.shared
    assert shared is not None
    shared.close_deadline_s = 0.5
    try:
        revoked = {(TOPICS.events, 0), (TOPICS.commands, 0), (TOPICS.timer_ops, 0)}
        # Unbounded before: waited as long as the write (here, for ever).
        await asyncio.wait_for(node.node._revoked(revoked), 10)
        assert TaskId(TOPICS.type_name, 0) not in node.node._owned
        assert node.node._failure is None
        kept = node.node.types[TOPICS.type_name]
        assert 0 not in kept.store.assigned
        # Let go dirty, its uncommitted writes rolled back: read on from its changelog.
        assert kept.marks.take(0)
    finally:
        answered.set()
