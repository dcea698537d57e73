"""Two nodes of two contexts on one log, each with its own clock: a timer of `big.thing`
aimed at `other.desk` fires on the sender's node the moment it is due by its clock and is
SENT (a send to another context waits for no answer). The target's node, its clock
behind: within `TICKWHEEL_CLOCK_SKEW_MS` it applies the command (before, it answered
SCHEDULE_NOT_DUE on a topic nobody reads, and the command was lost); further behind, the
command is dead-lettered, kept to be replayed once due, not lost in silence."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from fakes import T0, FakeClock, running, wait_until
from fakes_node import RunningNode
from pydantic import BaseModel

from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType, Command, Decision
from app.model.decide import CLOCK_SKEW_MS
from app.protocol.dead_letters import DeadLetter
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import CommandEnvelope, EventEnvelope, decode, encode
from app.service import Service
from tables import AggregateRef, CommandSpec, OnceRule, Timer, TimerStatus

P = 1
BIG = AggregateTopics("big", "thing")
OTHER = AggregateTopics("other", "desk")
DESK = AggregateRef(context="other", aggregate="desk", id="d1")


class S(BaseModel):
    n: int = 0


thing = AggregateType("big", "thing", S)
desk = AggregateType("other", "desk", S)


@thing.command("Arm")
def _arm(state: S, cmd: Command, d: Decision) -> None:
    d.emit("Armed", {})
    d.schedule("k", OnceRule(at=int(cmd.body["at"])), CommandSpec(type="Take"), target=DESK)


@thing.applies("Armed")
def _armed(state: S, e: Any) -> S:
    return state


@desk.command("Take")
def _take(state: S, cmd: Command, d: Decision) -> None:
    d.emit("Taken", {})


@desk.applies("Taken")
def _taken(state: S, e: Any) -> S:
    return state.model_copy(update={"n": state.n + 1})


def row(log: MemoryLog) -> Timer | None:
    latest = {r.key: r.value for r in log.records(BIG.timers_changelog, 0)}
    rows = [Timer.model_validate_json(v) for v in latest.values() if v is not None]
    return rows[0] if rows else None


def taken(log: MemoryLog) -> list[EventEnvelope]:
    events = (decode(EventEnvelope, r.value) for r in log.records(OTHER.events, 0))
    return [e for e in events if e.type == "Taken"]


def letters(log: MemoryLog) -> list[DeadLetter]:
    topic = ContextTopics("other").dead_letters
    return [DeadLetter.read(r.key, r.value, r.headers) for r in log.records(topic, 0)]


@pytest.mark.parametrize("behind_ms", [1_000, CLOCK_SKEW_MS + 1_000], ids=["within", "past"])
async def test_a_timer_sent_to_a_target_whose_clock_trails_is_not_lost(
    tmp_path: Path, behind_ms: int
) -> None:
    log = MemoryLog()
    sender, target = FakeClock(T0), FakeClock(T0 - behind_ms)
    other = RunningNode(
        log, tmp_path, "b", Service(aggregates=(desk,)), P, clock=target, group_id="g-other"
    )
    big = RunningNode(
        log, tmp_path, "a", Service(aggregates=(thing,)), P, clock=sender, group_id="g-big"
    )
    async with running(other), running(big):
        arm = CommandEnvelope(
            request_id=uuid.uuid4().hex,
            type="Arm",
            aggregate=AggregateRef(context="big", aggregate="thing", id="o1"),
            body={"at": T0 + 100},
            issued_at=int(time.time() * 1000),
        )
        await log.publisher().send(BIG.commands, b"o1", encode(arm), 0)
        await wait_until(lambda: row(log) is not None)
        sender.advance(100)  # due on the sender's clock; the target's trails it
        await wait_until(lambda: (t := row(log)) is not None and t.status is TimerStatus.FIRED)
        if behind_ms <= CLOCK_SKEW_MS:
            await wait_until(lambda: len(taken(log)) == 1)
            assert taken(log)[0].created_at == T0 + 100, "as of its due time"
            assert letters(log) == []
        else:
            await wait_until(lambda: len(letters(log)) == 1)
            assert "no sender waits for its answer" in letters(log)[0].context.exception_message
            assert taken(log) == []
