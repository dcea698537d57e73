"""A whole node on the in-memory log given records another producer coerced: a
`wow.ScheduleSet` whose version is `"3"`, one whose rule's `at` is a float, a command
whose `issued_at` is `true`, and a timer key with a NUL. Each is dead-lettered with its
reason, and the partition goes on: a valid timer of the same owner fires after them."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from fakes import RunningNode, wait_until
from test_node_memory import PARTITIONS, SERVICE, TOPICS

from app.kafka.memory import MemoryLog
from app.protocol.dead_letters import DeadLetter
from app.protocol.topics import ContextTopics
from app.protocol.wire import CommandEnvelope, EventEnvelope, decode, encode
from tables import AggregateRef
from tables.partitioner import partition_of

INT = "Input should be a valid integer"
CONTROL = "Value error, holds the control character"


@pytest.fixture
async def log() -> AsyncIterator[MemoryLog]:
    yield MemoryLog()


@pytest.fixture
async def node(log: MemoryLog, tmp_path: Path) -> AsyncIterator[RunningNode]:
    n = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    yield n
    await n.stop()


def fired(log: MemoryLog) -> int:
    return sum(
        decode(EventEnvelope, r.value).type == "Fired"
        for p in range(PARTITIONS)
        for r in log.records(TOPICS.events, p)
        if r.value is not None and b'"Fired"' in r.value
    )


async def test_coerced_records_are_dead_lettered_with_the_reason_and_the_partition_goes_on(
    log: MemoryLog, node: RunningNode
) -> None:
    await wait_until(node.runs)
    owner = AggregateRef(context="mem", aggregate="counter", id="o1")
    p = partition_of("o1", PARTITIONS)
    now = int(time.time() * 1000)
    body: dict[str, Any] = {"key": "k1", "rule": {"kind": "once", "at": now}}
    body["command"] = {"type": "Fire"}
    event: dict[str, Any] = {
        "id": "bad-1",
        "type": "wow.ScheduleSet",
        "aggregate": owner.model_dump(),
        "version": "3",
        "created_at": now,
        "body": body,
    }
    rule = {"kind": "once", "at": now * 1.0}
    float_at = {**event, "id": "bad-2", "version": 4}
    float_at["body"] = {**body, "key": "k2", "rule": rule}
    nul_key = {**event, "id": "bad-3", "version": 5, "body": {**body, "key": "k\x00"}}
    cmd = CommandEnvelope(request_id="r-bad", type="Schedule", aggregate=owner, issued_at=now)
    command = {**orjson.loads(encode(cmd)), "body": {"at": now}, "issued_at": True}
    bad = [
        (TOPICS.events, orjson.dumps(event), f'version: {INT} (got the string "3")'),
        (TOPICS.events, orjson.dumps(float_at), f"rule.once.at: {INT} (got the number"),
        (TOPICS.commands, orjson.dumps(command), f"issued_at: {INT} (got the boolean true)"),
        (
            TOPICS.events,
            orjson.dumps(nul_key),
            f"key: {CONTROL} U+0000",
        ),
    ]
    publisher = log.publisher()
    offsets = [await publisher.send(topic, b"o1", value, p) for topic, value, _ in bad]
    good = CommandEnvelope(
        request_id="r-good", type="Schedule", aggregate=owner, body={"at": now + 50}, issued_at=now
    )
    await publisher.send(TOPICS.commands, b"o1", encode(good), p)

    await wait_until(lambda: fired(log) == 1)
    letters = {
        (d.topic, d.offset): d
        for d in (
            DeadLetter.read(r.key, r.value, r.headers)
            for r in log.records(ContextTopics("mem").dead_letters, 0)
        )
    }
    for (topic, value, reason), offset in zip(bad, offsets, strict=True):
        letter = letters[(topic, offset)]
        assert letter.value == value  # the record whole, as it came
        assert reason in letter.context.exception_message, letter.context.exception_message
    assert "failing" not in node.node.health()


async def test_an_in_process_command_from_another_producer_is_dead_lettered_not_dropped(
    log: MemoryLog, node: RunningNode
) -> None:
    """`in_process: true` is a node's record of a command it decided itself, written with
    its header. Another producer's command saying so, without the header, is answered
    ERROR and dead-lettered (before, it was passed over without a word); the node's own
    in-process records, read back, are passed over with no letter."""
    await wait_until(node.runs)
    owner = AggregateRef(context="mem", aggregate="counter", id="o1")
    p = partition_of("o1", PARTITIONS)
    now = int(time.time() * 1000)
    publisher = log.publisher()
    forged = CommandEnvelope(
        request_id="r-forged", type="Schedule", aggregate=owner, body={"at": now},
        issued_at=now, in_process=True,
    )  # fmt: skip
    forged_at = await publisher.send(TOPICS.commands, b"o1", encode(forged), p)
    good = CommandEnvelope(
        request_id="r-good", type="Schedule", aggregate=owner, body={"at": now + 50}, issued_at=now
    )
    await publisher.send(TOPICS.commands, b"o1", encode(good), p)
    await wait_until(lambda: fired(log) == 1)  # its Fire decided in-process, and written
    own = [
        r
        for r in log.records(TOPICS.commands, p)
        if r.value is not None and decode(CommandEnvelope, r.value).type == "Fire"
    ]
    assert [r.headers for r in own] == [(("__tickwheel.in-process", b"1"),)]
    # Read back past the node's own record: committed past it.
    await wait_until(lambda: (log.committed("g", TOPICS.commands, p) or 0) > own[0].offset)

    letters = [
        DeadLetter.read(r.key, r.value, r.headers)
        for r in log.records(ContextTopics("mem").dead_letters, 0)
    ]
    assert [(d.topic, d.offset) for d in letters] == [(TOPICS.commands, forged_at)]
    assert "__tickwheel.in-process" in letters[0].context.exception_message
    results = [
        orjson.loads(r.value)
        for q in range(PARTITIONS)
        for r in log.records(ContextTopics("mem").results, q)
        if r.value is not None and b"r-forged" in r.value
    ]
    assert [r["code"] for r in results] == ["ERROR"]
