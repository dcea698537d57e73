"""End to end on the memory log: a node that takes a partition with a fresh copy (another
worker, a lost disk) folds the log as the node that followed it live did
(`app.commands.folds`). Another writer's stale `wow.AggregateDeleted` was passed over live
and folded by the restore: every later command REJECTED ("was deleted"). An unknown
`wow.` event was refused live and folded by the restore: the next decision appended at
its version + 1. Another writer's event past `FOLLOWED_VERSION_MAX` is refused live and
by a restore alike: followed, it left its aggregate no version for this node's next
decision, and every later command was answered ERROR."""

from __future__ import annotations

from pathlib import Path

import orjson
from fakes import T0, FakeClock, RunningNode, running, wait_until
from pydantic import BaseModel

from app.commands.folds import FOLLOWED_VERSION_MAX
from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType, Command, Decision, Event
from app.protocol.dead_letters import DeadLetter, Stage
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import AGGREGATE_DELETED, CommandEnvelope, EventEnvelope, decode, encode
from app.service import Service
from tables import AggregateRef
from tables.bounds import MAX_INT64
from tables.partitioner import partition_of

PARTITIONS = 2
BOX = AggregateTopics("rv", "box")
OWNER = AggregateRef(context="rv", aggregate="box", id="b-1")
P = partition_of(OWNER.id, PARTITIONS)
LETTERS = ContextTopics("rv").dead_letters  # one partition


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


async def append(
    log: MemoryLog, type_: str, version: int, event_id: str = "other-writer-1"
) -> None:
    """Another writer's event on the box's log; once the node read it back."""
    theirs = EventEnvelope(id=event_id, type=type_, aggregate=OWNER, version=version, created_at=T0)
    offset = await log.publisher().send(BOX.events, OWNER.id.encode(), encode(theirs), P)

    def read_back() -> bool:
        # Past its offset (a transaction's markers take offsets too: not a count).
        committed = log.committed("g", BOX.events, P)
        return committed is not None and committed > offset

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


def letters(log: MemoryLog) -> list[tuple[str, str]]:
    """The dead letters' stages and errors."""
    read = (DeadLetter.read(r.key, r.value, r.headers) for r in log.records(LETTERS, 0))
    return [(letter.context.stage, letter.context.exception_message) for letter in read]


async def test_an_event_past_the_followed_maximum_is_refused_live_and_by_a_fresh_copy(
    tmp_path: Path,
) -> None:
    log, clock = MemoryLog(), FakeClock(T0)
    async with running(RunningNode(log, tmp_path, "n", SERVICE, PARTITIONS, clock=clock)):
        assert await answered(log, "r1") == "COMMITTED"
        await append(log, "Pinged", MAX_INT64, "x-1")  # dead-lettered
        await append(log, "Pinged", FOLLOWED_VERSION_MAX + 1, "x-2")  # dead-lettered
        await wait_until(lambda: len(letters(log)) == 2, what=lambda: str(letters(log)))
        assert await answered(log, "r2") == "COMMITTED"
    async with running(RunningNode(log, tmp_path, "m", SERVICE, PARTITIONS, clock=clock)):
        assert await answered(log, "r3") == "COMMITTED"
    assert events(log)[-1] == ("Pinged", 3)
    assert [stage for stage, _ in letters(log)] == [Stage.FOLLOW, Stage.FOLLOW]
    assert all(f"past {FOLLOWED_VERSION_MAX}, the highest" in error for _, error in letters(log))


async def test_an_event_at_the_followed_maximum_is_followed(tmp_path: Path) -> None:
    log, clock = MemoryLog(), FakeClock(T0)
    async with running(RunningNode(log, tmp_path, "n", SERVICE, PARTITIONS, clock=clock)):
        assert await answered(log, "r1") == "COMMITTED"
        await append(log, "Pinged", FOLLOWED_VERSION_MAX)
        assert await answered(log, "r2") == "COMMITTED"
    async with running(RunningNode(log, tmp_path, "m", SERVICE, PARTITIONS, clock=clock)):
        assert await answered(log, "r3") == "COMMITTED"
    assert events(log)[-2:] == [
        ("Pinged", FOLLOWED_VERSION_MAX + 1),
        ("Pinged", FOLLOWED_VERSION_MAX + 2),
    ]
    assert letters(log) == []
