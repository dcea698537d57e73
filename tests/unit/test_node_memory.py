"""A whole node on the in-memory log (app.kafka.memory): its partition cycles, in-process
firing, commits, restores and a take-over with fencing, in milliseconds and without a
broker. The real-broker tests (tests/integration) stay for what only Kafka can show."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fakes import RunningNode, wait_until
from pydantic import BaseModel

from app.errors import BadRecord
from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType, Command, Decision, Event
from app.node.task_id import TaskId
from app.node.task_state import TaskState
from app.protocol.dead_letters import DeadLetter
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import CommandEnvelope, CommandResult, EventEnvelope, decode, encode
from app.service import Service
from tables import AggregateRef, CommandSpec, OnceRule, StoreError, Timer, TimerStatus
from tables.partitioner import partition_of

PARTITIONS = 2
TOPICS = AggregateTopics("mem", "counter")


def task_of(p: int) -> TaskId:
    """The task of p of the type these tests run (one task per type and partition)."""
    return TaskId(TOPICS.type_name, p)


class Counter(BaseModel):
    fired: int = 0


counter = AggregateType("mem", "counter", Counter)


@counter.command("Schedule")
def _schedule(state: Counter, cmd: Command, d: Decision) -> None:
    d.schedule("k", OnceRule(at=int(cmd.body["at"])), CommandSpec(type="Fire"))


@counter.command("Fire")
def _fire(state: Counter, cmd: Command, d: Decision) -> None:
    d.emit("Fired", {"n": state.fired + 1})


@counter.applies("Fired")
def _fired(state: Counter, e: Event) -> Counter:
    return state.model_copy(update={"fired": e.body["n"]})


SERVICE = Service(aggregates=(counter,))


@pytest.fixture
async def log() -> AsyncIterator[MemoryLog]:
    yield MemoryLog()


@pytest.fixture
async def nodes(log: MemoryLog, tmp_path: Path) -> AsyncIterator[list[RunningNode]]:
    started: list[RunningNode] = []
    yield started
    for n in reversed(started):
        await n.stop()


async def start(nodes: list[RunningNode], log: MemoryLog, tmp_path: Path, name: str) -> RunningNode:
    n = await RunningNode(log, tmp_path, name, SERVICE, PARTITIONS).start()
    nodes.append(n)
    return n


async def schedule(log: MemoryLog, owner: str, at: int) -> CommandEnvelope:
    cmd = CommandEnvelope(
        request_id=uuid.uuid4().hex,
        type="Schedule",
        aggregate=AggregateRef(context="mem", aggregate="counter", id=owner),
        body={"at": at},
        issued_at=int(time.time() * 1000),
    )
    p = partition_of(owner, PARTITIONS)
    await log.publisher().send(TOPICS.commands, owner.encode(), encode(cmd), p)
    return cmd


def events(log: MemoryLog, type_: str) -> list[EventEnvelope]:
    out = []
    for p in range(PARTITIONS):
        for r in log.records(TOPICS.events, p):
            try:
                e = decode(EventEnvelope, r.value)
            except BadRecord:
                continue  # another writer's bad record: dead-lettered, no event
            if e.type == type_:
                out.append(e)
    return out


def results(log: MemoryLog) -> dict[str, CommandResult]:
    topic = ContextTopics("mem").results
    got = {}
    for p in range(PARTITIONS):
        for r in log.records(topic, p):
            res = decode(CommandResult, r.value)
            got[res.request_id] = res
    return got


def timer_rows(log: MemoryLog) -> list[Timer]:
    latest: dict[bytes, bytes | None] = {}
    for p in range(PARTITIONS):
        for r in log.records(TOPICS.timers_changelog, p):
            assert r.key is not None
            latest[r.key] = r.value
    return [Timer.model_validate_json(v) for v in latest.values() if v is not None]


async def test_a_node_decides_commands_and_fires_its_timers_in_process(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path
) -> None:
    node = await start(nodes, log, tmp_path, "a")
    await wait_until(node.runs)
    owners = [f"o{i}" for i in range(6)]
    sent = [await schedule(log, o, int(time.time() * 1000) + 50) for o in owners]
    await wait_until(lambda: len(events(log, "Fired")) == len(owners))
    assert {r for r in results(log)} >= {c.request_id for c in sent}
    assert all(results(log)[c.request_id].code == "COMMITTED" for c in sent)
    await wait_until(lambda: all(t.status is TimerStatus.FIRED for t in timer_rows(log)))
    assert sorted(e.aggregate.id for e in events(log, "Fired")) == owners


async def test_a_thawed_owner_beside_the_new_one_is_fenced_and_applies_nothing(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path
) -> None:
    """The old owner's session expired (a frozen process) with a timer in its wheel; the new
    owner takes every partition, which fences the old one's transactions. The old one
    wakes, and its timer loop and cycles run before its consumer learns that the group
    moved on: the timer is applied once, by the new owner; the old one's commit is fenced,
    its partition stalled, and once its consumer polls it joins again and takes its share."""
    old = await start(nodes, log, tmp_path, "old")
    await wait_until(old.runs)
    due = int(time.time() * 1000) + 300
    await schedule(log, "o1", due)
    await wait_until(lambda: len(timer_rows(log)) == 1)
    group = log.groups["g"]
    (member,) = group.members
    member.hold_polls()
    await group.expel(member)  # not told: it keeps its partitions, and fires at due time
    new = await start(nodes, log, tmp_path, "new")
    await wait_until(new.runs)
    p = str(partition_of("o1", PARTITIONS))
    await wait_until(lambda: p in old.node.health()["stalled"], within=15)
    assert "fenced" in old.node.health()["stalled"][p].lower()
    fenced = old.node.metrics.registry.get_sample_value(
        "tickwheel_partitions_let_go_total", {"reason": "fenced"}
    )
    assert fenced is not None and fenced >= 1
    await wait_until(lambda: len(events(log, "Fired")) == 1, within=15)
    member.release_polls()
    await wait_until(lambda: old.runs(1) and new.runs(1), within=15)
    assert len(events(log, "Fired")) == 1, "applied once: the fenced owner committed nothing"
    assert [t.status for t in timer_rows(log)] == [TimerStatus.FIRED]


async def test_a_partition_the_group_gives_but_nobody_works_on_is_not_ready(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path
) -> None:
    """Whatever the cause (a lost retake was one), /healthz does not say ready while a
    partition the group gave this node is neither worked on nor being taken."""
    node = await start(nodes, log, tmp_path, "a")
    await wait_until(node.runs)
    task = node.node.tasks.running[task_of(1)]
    task.state = TaskState.CLOSED  # as if its work had ended with no retake under way
    try:
        health = node.node.health()
    finally:
        task.state = TaskState.RUNNING  # the node's stop closes it
    assert not health["ready"]
    assert health["stalled"] == {"1": "assigned by the group, not taken"}


async def test_a_partition_whose_log_cannot_be_read_fires_nothing_until_it_is(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault of the node's own (its store failing) while a cycle reads the log: the
    partition is taken afresh, and fires nothing until a cycle has read past where it failed
    (a cancel may wait there); /healthz says where and why, and how often in a row. Once the
    store answers again, the log is read on and the held timer fires."""
    node = await start(nodes, log, tmp_path, "a")
    await wait_until(node.runs)
    p = partition_of("o1", PARTITIONS)
    other = next(f"o{i}" for i in range(2, 50) if partition_of(f"o{i}", PARTITIONS) == p)
    due = int(time.time() * 1000) + 1_500
    await schedule(log, "o1", due)
    await wait_until(lambda: len(timer_rows(log)) == 1)
    kept = node.node.types[TOPICS.type_name]
    # Under `put_many`, which the store's and its partition handles' (the cycles') share.
    put_many = kept.store._put_many  # type: ignore[attr-defined]
    failing = True

    async def broken(timers: list[Timer], serving: int | None) -> list[Timer]:
        if failing:
            raise StoreError("the disk is gone")
        return await put_many(timers, serving)  # type: ignore[no-any-return]

    monkeypatch.setattr(kept.store, "_put_many", broken)
    # Its decision's wow.ScheduleSet, carried out on the table at once, meets the fault.
    await schedule(log, other, due)

    def failed_twice() -> bool:
        report = node.node.health().get("failing", {}).get(str(p))
        return report is not None and report["failures"] >= 2 and report["held"]

    await wait_until(failed_twice)
    health = node.node.health()
    assert not health["ready"]
    report = health["failing"][str(p)]
    # Where the failed cycle read: the command it failed on, and the events topic too when
    # o1's ScheduleSet was not committed yet when the fault hit (a busy machine).
    assert TOPICS.commands in report["at"]
    assert set(report["at"]) <= {TOPICS.commands, TOPICS.events}
    assert "the disk is gone" in report["error"]
    assert "fires nothing until its log is read past" in health["stalled"][str(p)]
    await asyncio.sleep(max(0.0, (due + 500) / 1000 - time.time()))  # past its due time
    assert events(log, "Fired") == [], "held: nothing fires past a log it has not read"
    failing = False
    await wait_until(lambda: len(events(log, "Fired")) == 2, within=15)
    await wait_until(node.runs)
    assert "failing" not in node.node.health()
    assert sorted(e.aggregate.id for e in events(log, "Fired")) == sorted(["o1", other])


async def test_one_bad_record_of_each_kind_is_dead_lettered_whole_and_the_partition_goes_on(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path
) -> None:
    """The report's records: a once-rule `at` past 2^64, an interval `every` of 2^70 and a
    300 KiB key on the log, a 300 KiB key and a reply address that is the aggregate's own
    log on the commands topic. Each has one dead letter with its bytes; the valid timers of
    the same partition fire; nothing lands on the events topic but events."""
    node = await start(nodes, log, tmp_path, "a")
    await wait_until(node.runs)
    owner = AggregateRef(context="mem", aggregate="counter", id="o1")
    p = partition_of("o1", PARTITIONS)
    now = int(time.time() * 1000)

    def schedule_set(rule: dict[str, object], version: int) -> bytes:
        body = {"key": f"k{version}", "rule": rule, "command": {"type": "Fire"}}
        # json, not orjson: orjson refuses integers past 64 bits, as a careful writer would.
        return json.dumps(
            {
                "id": f"bad-{version}",
                "type": "wow.ScheduleSet",
                "aggregate": owner.model_dump(),
                "version": version,
                "created_at": now,
                "body": body,
            }
        ).encode()

    big_key = b"k" * 300 * 1024
    command = CommandEnvelope(
        request_id="reply-elsewhere",
        type="Schedule",
        aggregate=owner,
        body={"at": now},
        issued_at=now,
        reply_to=TOPICS.events,
    )
    bad = [
        (TOPICS.events, b"o1", schedule_set({"kind": "once", "at": 2**64 + 5}, 7)),
        (TOPICS.events, b"o1", schedule_set({"kind": "interval", "start": 0, "every": 2**70}, 8)),
        (TOPICS.events, big_key, b"{}"),
        (TOPICS.commands, big_key, b"{}"),
        (TOPICS.commands, b"o1", encode(command)),
    ]
    publisher = log.publisher()
    written = [
        (topic, p, await publisher.send(topic, key, value, p), key, value)
        for topic, key, value in bad
    ]
    await schedule(log, "o1", now + 100)
    await wait_until(lambda: len(events(log, "Fired")) == 1)
    letters = [
        DeadLetter.read(r.key, r.value, r.headers)
        for r in log.records(ContextTopics("mem").dead_letters, 0)
    ]
    assert sorted((d.topic, d.partition, d.offset, d.key, d.value) for d in letters) == sorted(
        written
    )
    assert results(log)["reply-elsewhere"].code == "ERROR"
    ours = {(topic, offset) for topic, _, offset, _, _ in written}
    for r in log.records(TOPICS.events, p):
        if (TOPICS.events, r.offset) not in ours:
            decode(EventEnvelope, r.value)  # the node wrote events there, nothing else
    await wait_until(node.runs)
    assert "failing" not in node.node.health()
