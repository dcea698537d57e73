"""A handler that blocks for ever (`threading.Event().wait()`, an HTTP call without a
timeout) on a node on the in-memory log: the handler timeout interrupts it, its command is
answered ERROR and dead-lettered, and the partition goes on (the next command on it is
decided); without the timeout the node's one event loop hung, then every node's after it."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest
from fakes_node import RunningNode, running, wait_until
from pydantic import BaseModel

from app.errors import ConfigError
from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType, Command, Decision, Event
from app.node import Node
from app.node.settings import Settings
from app.protocol.dead_letters import DeadLetter
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import (
    CommandEnvelope,
    CommandResult,
    EventEnvelope,
    ResultCode,
    decode,
    encode,
)
from app.service import Service
from tables import AggregateRef
from tables.partitioner import partition_of

PARTITIONS = 2
TIMEOUT_MS = 200
TOPICS = AggregateTopics("hang", "thing")
CONTEXT = ContextTopics("hang")


class Count(BaseModel):
    n: int = 0


agg = AggregateType("hang", "thing", Count)


RELEASE = threading.Event()
"""Set by nothing while the timeout works; by the test's end otherwise, so that a node
without the timeout fails the test rather than hang the test run."""


@agg.command("Hang")
def hang(state: Count, cmd: Command, d: Decision) -> None:
    RELEASE.wait()  # as a call without a timeout waits for an answer that never comes
    d.emit("Done", {})


@agg.command("Ok")
def ok(state: Count, cmd: Command, d: Decision) -> None:
    d.emit("Done", {})


@agg.applies("Done")
def done(state: Count, e: Event) -> Count:
    return state.model_copy(update={"n": state.n + 1})


SLOW_CALLS: list[str] = []


@agg.applies("Grown")
def grown(state: Count, e: Event) -> Count:
    """Another writer's event; its applier hangs the first time it is called."""
    SLOW_CALLS.append(e.id)
    if len(SLOW_CALLS) == 1:
        RELEASE.wait()
    return state.model_copy(update={"n": state.n + 100})


@agg.command("Tell")
def tell(state: Count, cmd: Command, d: Decision) -> None:
    d.emit("Told", {"n": state.n})


SERVICE = Service(aggregates=(agg,))


def owner_in(p: int) -> str:
    return next(f"a{i}" for i in range(1000) if partition_of(f"a{i}", PARTITIONS) == p)


async def send(log: MemoryLog, owner: str, type_: str) -> str:
    request_id = uuid.uuid4().hex
    cmd = CommandEnvelope(
        request_id=request_id,
        type=type_,
        aggregate=AggregateRef(context="hang", aggregate="thing", id=owner),
        body={},
        issued_at=time.time_ns() // 1_000_000,
    )
    partition = partition_of(owner, PARTITIONS)
    await log.publisher().send(TOPICS.commands, owner.encode(), encode(cmd), partition)
    return request_id


def results(log: MemoryLog) -> dict[str, CommandResult]:
    found = {}
    for p in range(log.partitions(CONTEXT.results)):
        for r in log.records(CONTEXT.results, p):
            result = decode(CommandResult, r.value)
            found[result.request_id] = result
    return found


def letters(log: MemoryLog) -> list[DeadLetter]:
    topic = CONTEXT.dead_letters
    return [
        DeadLetter.read(r.key, r.value, r.headers)
        for p in range(log.partitions(topic))
        for r in log.records(topic, p)
    ]


def done_events(log: MemoryLog) -> list[EventEnvelope]:
    return [
        decode(EventEnvelope, r.value)
        for p in range(PARTITIONS)
        for r in log.records(TOPICS.events, p)
    ]


def timed_node(log: MemoryLog, tmp_path: Path) -> RunningNode:
    """A test's usual node, its handler timeout short."""
    node = RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS)
    settings = node.node.settings.model_copy(update={"handler_timeout_ms": TIMEOUT_MS})
    node.node = Node(settings, SERVICE, clients=log)
    return node


async def test_a_hanging_handler_is_answered_error_and_the_partition_goes_on(
    tmp_path: Path,
) -> None:
    log = MemoryLog()
    RELEASE.clear()
    release = threading.Timer(5, RELEASE.set)
    try:
        async with running(timed_node(log, tmp_path)):
            owner = owner_in(0)
            started = time.monotonic()
            release.start()
            hung = await send(log, owner, "Hang")
            after = await send(log, owner, "Ok")  # same aggregate, same partition, behind it
            await wait_until(lambda: after in results(log), within=10)
            took = time.monotonic() - started
    finally:
        release.cancel()
        RELEASE.set()

    answered = results(log)
    assert answered[hung].code == ResultCode.ERROR
    assert "UserCodeTimeout" in answered[hung].message
    assert "the handler of Hang ran for" in answered[hung].message
    assert answered[after].code == ResultCode.COMMITTED
    [letter] = letters(log)
    assert letter.context.topic == TOPICS.commands
    assert letter.context.exception_class == "UserCodeTimeout"
    assert decode(CommandEnvelope, letter.value).request_id == hung
    assert [e.request_id for e in done_events(log)] == [after]
    assert took < 4  # a timeout's worth, not the hang's


async def test_an_applier_timed_out_on_another_writers_event_retakes_the_partition(
    tmp_path: Path,
) -> None:
    """An applier that times out while the live node follows another writer's event is not
    the event's fault (the machine's load, a slow call): passed over and dead-lettered, the
    live state would miss what a restore of the same log folds (or fails on). The partition
    is taken again and the event folded: the next command sees it."""
    log = MemoryLog()
    RELEASE.clear()
    SLOW_CALLS.clear()
    release = threading.Timer(5, RELEASE.set)
    owner = owner_in(1)
    grown_event = EventEnvelope(
        id=uuid.uuid4().hex,
        type="Grown",
        aggregate=AggregateRef(context="hang", aggregate="thing", id=owner),
        version=1,
        created_at=time.time_ns() // 1_000_000,
    )
    try:
        async with running(timed_node(log, tmp_path)):
            release.start()
            await log.publisher().send(TOPICS.events, owner.encode(), encode(grown_event), 1)
            await wait_until(lambda: len(SLOW_CALLS) >= 2, within=10)
            told = await send(log, owner, "Tell")
            await wait_until(lambda: told in results(log), within=10)
    finally:
        release.cancel()
        RELEASE.set()

    assert results(log)[told].code == ResultCode.COMMITTED
    [event] = [e for e in done_events(log) if e.request_id == told]
    assert event.body == {"n": 100}  # the other writer's event folded
    assert event.version == 2
    assert [x for x in letters(log) if x.context.topic == TOPICS.events] == []


def test_the_handler_timeout_is_below_the_session_timeout() -> None:
    assert Settings().handler_timeout_ms == 5_000 < Settings().session_timeout_ms
    # Not given, it fits a short session (a handler past it would get the node expelled).
    assert Settings(session_timeout_ms=3_000).handler_timeout_ms == 1_500
    env = {"TICKWHEEL_HANDLER_TIMEOUT_MS": "9000"}
    assert Settings.from_env(env).handler_timeout_ms == 9_000
    with pytest.raises(ConfigError, match=r"TICKWHEEL_HANDLER_TIMEOUT_MS \(10000\) must be below"):
        Settings.from_env({"TICKWHEEL_HANDLER_TIMEOUT_MS": "10000"})
    with pytest.raises(ConfigError, match="TICKWHEEL_SESSION_TIMEOUT_MS"):
        Settings.from_env(
            {"TICKWHEEL_HANDLER_TIMEOUT_MS": "2000", "TICKWHEEL_SESSION_TIMEOUT_MS": "2000"}
        )
    untimed = {"TICKWHEEL_HANDLER_TIMEOUT_MS": "0"}
    assert Settings.from_env(untimed).handler_timeout_ms == 0  # a debugger's breakpoint
    # Half the transactions' timeout at most: the loop is the handler's while it runs.
    with pytest.raises(ConfigError, match="TICKWHEEL_HANDLER_TIMEOUT_MS: Input should be less"):
        Settings.from_env(
            {"TICKWHEEL_HANDLER_TIMEOUT_MS": "30001", "TICKWHEEL_SESSION_TIMEOUT_MS": "300000"}
        )
    top = {"TICKWHEEL_HANDLER_TIMEOUT_MS": "30000", "TICKWHEEL_SESSION_TIMEOUT_MS": "300000"}
    assert Settings.from_env(top).handler_timeout_ms == 30_000
    for bad in ("99", "1", "-1", "600001"):
        with pytest.raises(ConfigError, match="TICKWHEEL_HANDLER_TIMEOUT_MS"):
            Settings.from_env(
                {"TICKWHEEL_HANDLER_TIMEOUT_MS": bad, "TICKWHEEL_SESSION_TIMEOUT_MS": "300000"}
            )
