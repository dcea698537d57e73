"""End to end on the memory log: a node that takes a partition with a fresh copy (another
worker, a lost disk) folds the log as the node that followed it live did
(`app.commands.folds`). Another writer's stale `wow.AggregateDeleted` was passed over live
and folded by the restore: every later command REJECTED ("was deleted"). An unknown
`wow.` event was refused live and folded by the restore: the next decision appended at
its version + 1."""

from __future__ import annotations

from pathlib import Path

import orjson
from fakes import T0, FakeClock, RunningNode, running, wait_until
from pydantic import BaseModel

from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType, Command, Decision, Event
from app.protocol.topics import AggregateTopics
from app.protocol.wire import AGGREGATE_DELETED, CommandEnvelope, EventEnvelope, decode, encode
from app.service import Service
from tables import AggregateRef
from tables.partitioner import partition_of

PARTITIONS = 2
BOX = AggregateTopics("rv", "box")
OWNER = AggregateRef(context="rv", aggregate="box", id="b-1")
P = partition_of(OWNER.id, PARTITIONS)


class Pings(BaseModel):
    n: int = 0


box = AggregateType("rv", "box", Pings)


@box.command("Ping")
def _ping(state: Pings, cmd: Command, d: Decision) -> None:
    d.emit("Pinged", {})


@box.applies("Pinged")
def _pinged(state: Pings, e: Event) -> Pings:
    return state.model_copy(update={"n": state.n + 1})


SERVICE = Service(aggregates=(box,))


def events(log: MemoryLog) -> list[tuple[str, int]]:
    return [
        (e.type, e.version)
        for e in (decode(EventEnvelope, r.value) for r in log.records(BOX.events, P))
    ]


def results(log: MemoryLog) -> dict[str, str]:
    out = {}
    for p in range(PARTITIONS):
        for r in log.records("rv.results", p):
            v = orjson.loads(r.value or b"")
            out[v["request_id"]] = v["code"]
    return out


async def send(log: MemoryLog, request_id: str) -> None:
    cmd = CommandEnvelope(
        type="Ping", aggregate=OWNER, request_id=request_id, issued_at=T0, reply_to="rv.results"
    )
    await log.publisher().send(BOX.commands, OWNER.id.encode(), encode(cmd), P)


async def append(log: MemoryLog, type_: str, version: int) -> None:
    """Another writer's event on the box's log; once the node read it back."""
    theirs = EventEnvelope(
        id="other-writer-1", type=type_, aggregate=OWNER, version=version, created_at=T0
    )
    await log.publisher().send(BOX.events, OWNER.id.encode(), encode(theirs), P)

    def read_back() -> bool:
        committed = log.committed("g", BOX.events, P)
        return committed is not None and committed >= len(log.records(BOX.events, P))

    await wait_until(read_back)


async def answered(log: MemoryLog, request_id: str) -> str:
    await send(log, request_id)
    await wait_until(lambda: request_id in results(log), what=lambda: str(results(log)))
    return results(log)[request_id]


async def test_a_stale_delete_passed_over_live_is_passed_over_by_a_fresh_copy(
    tmp_path: Path,
) -> None:
    log, clock = MemoryLog(), FakeClock(T0)
    async with running(RunningNode(log, tmp_path, "n", SERVICE, PARTITIONS, clock=clock)):
        assert await answered(log, "r1") == "COMMITTED"
        assert await answered(log, "r2") == "COMMITTED"
        await append(log, AGGREGATE_DELETED, 1)  # behind the box: passed over
        assert await answered(log, "r3") == "COMMITTED"
    async with running(RunningNode(log, tmp_path, "m", SERVICE, PARTITIONS, clock=clock)):
        assert await answered(log, "r4") == "COMMITTED"
    assert events(log) == [
        ("Pinged", 1),
        ("Pinged", 2),
        (AGGREGATE_DELETED, 1),
        ("Pinged", 3),
        ("Pinged", 4),
    ]


async def test_an_unknown_system_event_refused_live_is_not_folded_by_a_fresh_copy(
    tmp_path: Path,
) -> None:
    log, clock = MemoryLog(), FakeClock(T0)
    async with running(RunningNode(log, tmp_path, "n", SERVICE, PARTITIONS, clock=clock)):
        assert await answered(log, "r1") == "COMMITTED"
        await append(log, "wow.Bogus", 50)  # dead-lettered
        assert await answered(log, "r2") == "COMMITTED"
    async with running(RunningNode(log, tmp_path, "m", SERVICE, PARTITIONS, clock=clock)):
        assert await answered(log, "r3") == "COMMITTED"
    assert events(log) == [("Pinged", 1), ("wow.Bogus", 50), ("Pinged", 2), ("Pinged", 3)]
