"""Two aggregates' commands of one request id (a request id is unique per aggregate alone)
each set a timer sent to one shared target, or send a command to it: both are applied
there. Their timers' ids are their events' ids, the slots' request ids `<timer id>#<slot>`,
and a sent command's `<request id>>n`: the two aggregates' shared those request ids at the
target, and the second was answered DUPLICATE, never applied (`app.model.decide.event_id`,
`app.model.aggregate.sent_request_id`)."""

from __future__ import annotations

from pathlib import Path

from fakes import T0, FakeClock, RunningNode, running, wait_until
from pydantic import BaseModel

from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType, Command, Decision
from app.protocol.topics import AggregateTopics
from app.protocol.wire import SCHEDULE_SET, CommandEnvelope, EventEnvelope, decode, encode
from app.service import Service
from tables import AggregateRef, CommandSpec, OnceRule
from tables.partitioner import partition_of

PARTITIONS = 2
TOPICS = AggregateTopics("shop", "order")
INBOX = AggregateRef(context="shop", aggregate="order", id="inbox")


class Notes(BaseModel):
    n: int = 0


ORDER = AggregateType("shop", "order", Notes)


@ORDER.command("Plan")
def _plan(state: Notes, cmd: Command, d: Decision) -> None:
    d.schedule(
        "remind",
        OnceRule(at=T0),
        CommandSpec(type="Note", body={"from": cmd.aggregate.id}),
        target=INBOX,
    )


@ORDER.command("Tell")
def _tell(state: Notes, cmd: Command, d: Decision) -> None:
    d.emit("Told", {})
    d.send(INBOX, "Note", {"from": cmd.aggregate.id})


@ORDER.command("Note")
def _note(state: Notes, cmd: Command, d: Decision) -> None:
    d.emit("Noted", dict(cmd.body))


def _events(log: MemoryLog) -> list[EventEnvelope]:
    return [
        decode(EventEnvelope, r.value)
        for q in range(PARTITIONS)
        for r in log.records(TOPICS.events, q)
    ]


async def _send_to_both(log: MemoryLog, type_: str) -> None:
    for oid in ("o-1", "o-2"):
        ref = AggregateRef(context="shop", aggregate="order", id=oid)
        cmd = CommandEnvelope(request_id="req-42", type=type_, aggregate=ref, issued_at=T0 - 1000)
        p = partition_of(oid, PARTITIONS)
        await log.publisher().send(TOPICS.commands, oid.encode(), encode(cmd), p)


async def test_two_aggregates_timers_of_one_request_id_are_both_applied_at_a_shared_target(
    tmp_path: Path,
) -> None:
    log, clock = MemoryLog(), FakeClock(T0 - 1000)
    node = RunningNode(log, tmp_path, "n", Service(aggregates=(ORDER,)), PARTITIONS, clock=clock)
    async with running(node, within=10):
        await _send_to_both(log, "Plan")
        await wait_until(lambda: sum(e.type == SCHEDULE_SET for e in _events(log)) == 2)
        sets = [e for e in _events(log) if e.type == SCHEDULE_SET]
        assert sets[0].id != sets[1].id
        clock.set(T0 + 10)
        await wait_until(lambda: sum(e.type == "Noted" for e in _events(log)) == 2)
        noted = sorted(e.body["from"] for e in _events(log) if e.type == "Noted")
        assert noted == ["o-1", "o-2"]


async def test_two_aggregates_sends_of_one_request_id_are_both_applied_at_a_shared_target(
    tmp_path: Path,
) -> None:
    log, clock = MemoryLog(), FakeClock(T0)
    node = RunningNode(log, tmp_path, "n", Service(aggregates=(ORDER,)), PARTITIONS, clock=clock)
    async with running(node, within=10):
        await _send_to_both(log, "Tell")
        await wait_until(lambda: sum(e.type == "Noted" for e in _events(log)) == 2)
        noted = sorted(e.body["from"] for e in _events(log) if e.type == "Noted")
        assert noted == ["o-1", "o-2"]
