"""One command's events that touch a key twice (cancel or pause it and set it again, or set
it twice) share one version: carried out at once when the command is decided, the key
holds the command's last word. Read back afterwards, one event at a time, they undid it:
the cancel (or pause) at that version hit the timer the same command set after it, which
never fired. Read back, a node's own events whose timer operations it carried out are
passed over (`PartitionInput.carried`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import MIN, T0, FakeClock, RunningNode, running, wait_until
from pydantic import BaseModel

from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType, Command, Decision, Event
from app.protocol.topics import AggregateTopics
from app.protocol.wire import CommandEnvelope, EventEnvelope, decode, encode
from app.service import Service
from tables import AggregateRef, CommandSpec, OnceRule, TimerStatus
from tables.partitioner import partition_of

PARTITIONS = 2
BOX = AggregateTopics("rv", "box")
OWNER = AggregateRef(context="rv", aggregate="box", id="b-1")


class Pings(BaseModel):
    n: int = 0


box = AggregateType("rv", "box", Pings)


def _ping(at: object, tag: object) -> tuple[OnceRule, CommandSpec]:
    return OnceRule(at=int(str(at))), CommandSpec(type="Ping", body={"tag": tag})


@box.command("Set")
def _set(state: Pings, cmd: Command, d: Decision) -> None:
    d.schedule("k", *_ping(cmd.body["at"], cmd.body["tag"]))


@box.command("CancelSet")
def _cancel_set(state: Pings, cmd: Command, d: Decision) -> None:
    d.cancel_schedule("k")
    d.schedule("k", *_ping(cmd.body["at"], cmd.body["tag"]))


@box.command("PauseSet")
def _pause_set(state: Pings, cmd: Command, d: Decision) -> None:
    d.pause_schedule("k")
    d.schedule("k", *_ping(cmd.body["at"], cmd.body["tag"]))


@box.command("SetTwice")
def _set_twice(state: Pings, cmd: Command, d: Decision) -> None:
    d.schedule("k", *_ping(cmd.body["at"], "first"))
    d.schedule("k", *_ping(cmd.body["at"], cmd.body["tag"]))


@box.command("Ping")
def _pinged_now(state: Pings, cmd: Command, d: Decision) -> None:
    d.emit("Pinged", {"tag": cmd.body["tag"]})


@box.applies("Pinged")
def _pinged(state: Pings, e: Event) -> Pings:
    return state.model_copy(update={"n": state.n + 1})


SERVICE = Service(aggregates=(box,))
P = partition_of(OWNER.id, PARTITIONS)


def _events(log: MemoryLog) -> list[EventEnvelope]:
    return [decode(EventEnvelope, r.value) for r in log.records(BOX.events, P)]


def _pinged_tags(log: MemoryLog) -> list[str]:
    return [e.body["tag"] for e in _events(log) if e.type == "Pinged"]


async def _send(log: MemoryLog, type_: str, body: dict[str, object], rid: str) -> None:
    cmd = CommandEnvelope(type=type_, aggregate=OWNER, request_id=rid, body=body, issued_at=T0)
    await log.publisher().send(BOX.commands, OWNER.id.encode(), encode(cmd), P)


def _read_back(log: MemoryLog) -> bool:
    """Whether the node's subscription committed past every event of the log."""
    committed = log.committed("g", BOX.events, P)
    return committed is not None and committed >= len(log.records(BOX.events, P))


@pytest.mark.parametrize("command", ["CancelSet", "PauseSet", "SetTwice"])
async def test_one_commands_last_word_on_a_key_stands_after_its_events_are_read_back(
    tmp_path: Path, command: str
) -> None:
    log, clock = MemoryLog(), FakeClock(T0)
    node = RunningNode(log, tmp_path, "n", SERVICE, PARTITIONS, clock=clock)
    async with running(node, within=10):
        await _send(log, "Set", {"at": T0 + MIN, "tag": "old"}, "r1")
        await wait_until(lambda: len(_events(log)) == 1)
        await _send(log, command, {"at": T0 + 2 * MIN, "tag": "new"}, "r2")
        await wait_until(lambda: len(_events(log)) == 3)
        await wait_until(lambda: _read_back(log))
        row = await node.node.types["rv.box"].store.find(OWNER, "k")
        assert row is not None and row.status is TimerStatus.PENDING, row
        assert row.command.body == {"tag": "new"}
        clock.set(T0 + 2 * MIN + 5)
        await wait_until(lambda: _pinged_tags(log) == ["new"])


@pytest.mark.parametrize("command", ["CancelSet", "PauseSet", "SetTwice"])
@pytest.mark.parametrize("same_copy", [True, False])
async def test_a_retake_that_reads_one_commands_events_back_keeps_its_last_word(
    tmp_path: Path, command: str, same_copy: bool
) -> None:
    # The command's transaction committed; its owner stopped before its subscription read
    # the events back (the group's offset on the log still before them). The next take,
    # on this node's copy or another's, reads them back without having carried them out.
    log, clock = MemoryLog(), FakeClock(T0)
    first = RunningNode(log, tmp_path, "n", SERVICE, PARTITIONS, clock=clock)
    async with running(first, within=10):
        await _send(log, "Set", {"at": T0 + MIN, "tag": "old"}, "r1")
        await wait_until(lambda: len(_events(log)) == 1)
        await _send(log, command, {"at": T0 + 2 * MIN, "tag": "new"}, "r2")
        await wait_until(lambda: len(_events(log)) == 3)
        await wait_until(lambda: _read_back(log))
    log.commit_group_offsets("g", {(BOX.events, P): 1})
    second = RunningNode(log, tmp_path, "n" if same_copy else "m", SERVICE, PARTITIONS, clock=clock)
    async with running(second, within=10):
        await wait_until(lambda: _read_back(log))
        row = await second.node.types["rv.box"].store.find(OWNER, "k")
        assert row is not None and row.status is TimerStatus.PENDING, row
        assert row.command.body == {"tag": "new"}
        clock.set(T0 + 2 * MIN + 5)
        await wait_until(lambda: _pinged_tags(log) == ["new"])
