"""End to end: the results reader failing for good with an error that is no refusal (a
corrupt batch: every fetch of it fails). Every remote send of the context (here to another
type of the same context, decided on this very node) is answered on the results topic,
never read: its attempts time out and the timer parks. The node says so: not ready
within `FOLLOWER_FAILING_S`, by the time the timer parks, and it stops loudly after
`POLL_FAILING_S`, naming the results reader (once `/readyz` said ready throughout)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from pathlib import Path

import pytest
from fakes import RunningNode, wait_until
from pydantic import BaseModel

from app.errors import KafkaUnavailable, NodeFailed
from app.kafka import Record
from app.kafka.memory import MemoryLog
from app.kafka.memory_clients import MemoryFollower
from app.model.aggregate import AggregateType, Command, Decision, Event
from app.node import health, polling
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import CommandEnvelope, EventEnvelope, decode, encode
from app.service import Service
from app.timers import sender
from app.timers.runner import TimerOptions
from app.timers.runner.options import RetryPolicy
from tables import AggregateRef, CommandSpec, OnceRule, Timer, TimerStatus
from tables.partitioner import partition_of

PARTITIONS = 2
COUNTER = AggregateTopics("mem", "counter")
OTHER = AggregateTopics("mem", "other")


class S(BaseModel):
    n: int = 0


counter = AggregateType("mem", "counter", S)
other = AggregateType("mem", "other", S)


@counter.command("Schedule")
def _schedule(state: S, cmd: Command, d: Decision) -> None:
    d.schedule(
        "k",
        OnceRule(at=int(cmd.body["at"])),
        CommandSpec(type="Ping"),
        target=AggregateRef(context="mem", aggregate="other", id="x"),
    )


@other.command("Ping")
def _ping(state: S, cmd: Command, d: Decision) -> None:
    d.emit("Pinged", {"n": state.n + 1})


@other.applies("Pinged")
def _pinged(state: S, e: Event) -> S:
    return state.model_copy(update={"n": e.body["n"]})


SERVICE = Service(aggregates=(counter, other))


def rows(log: MemoryLog) -> list[Timer]:
    latest: dict[bytes, bytes | None] = {}
    for p in range(PARTITIONS):
        for r in log.records(COUNTER.timers_changelog, p):
            assert r.key is not None
            latest[r.key] = r.value
    return [Timer.model_validate_json(v) for v in latest.values() if v is not None]


def pinged(log: MemoryLog) -> int:
    n = 0
    for p in range(PARTITIONS):
        for r in log.records(OTHER.events, p):
            with contextlib.suppress(Exception):
                n += decode(EventEnvelope, r.value).type == "Pinged"
    return n


async def test_a_results_reader_failing_for_good_makes_the_node_unready_then_stops_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(polling, "POLL_FAILING_S", 4.0)  # read by the node's start
    monkeypatch.setattr(health, "FOLLOWER_FAILING_S", 0.3)
    monkeypatch.setattr(sender, "FOLLOW_RETRY_S", 0.05)
    log = MemoryLog()
    options = TimerOptions(
        send_timeout=300,
        claim_timeout=1_000,
        retry=RetryPolicy(initial_backoff_ms=100, max_backoff_ms=100, max_attempts=2),
    )
    node = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS, timers=options).start()
    results = ContextTopics("mem").results
    poll = MemoryFollower.poll

    async def corrupt(self: MemoryFollower, timeout_ms: int = 200) -> list[Record]:
        if self.topic == results:
            await asyncio.sleep(0.01)
            raise KafkaUnavailable(f"reading {results} failed: CorruptRecordError")
        return await poll(self, timeout_ms)

    try:
        await wait_until(node.runs)
        monkeypatch.setattr(MemoryFollower, "poll", corrupt)
        began = time.monotonic()
        owner = "o1"
        cmd = CommandEnvelope(
            request_id=uuid.uuid4().hex,
            type="Schedule",
            aggregate=AggregateRef(context="mem", aggregate="counter", id=owner),
            body={"at": int(time.time() * 1000) + 50},
            issued_at=int(time.time() * 1000),
        )
        p = partition_of(owner, PARTITIONS)
        await log.publisher().send(COUNTER.commands, owner.encode(), encode(cmd), p)
        await wait_until(lambda: any(t.status is TimerStatus.PARKED for t in rows(log)), within=3.5)
        # The target took the command (and answered it); the firer could not read it, and
        # the node says so.
        assert pinged(log) >= 1
        h = node.node.health()
        assert h["ready"] is False and "failed" not in h, h
        assert "the results reader of mem" in h["followers_failing"], h
        assert node.task is not None
        with pytest.raises(
            NodeFailed, match=f"the results reader of mem failed: .*polls of {results} failed"
        ):
            await asyncio.wait_for(node.task, 6)
        assert time.monotonic() - began >= 4.0
    finally:
        monkeypatch.setattr(MemoryFollower, "poll", poll)
        with contextlib.suppress(NodeFailed):
            await node.stop()
