"""Events outside their aggregate's partition are never passed over quietly: the states
restore, which does not fold them, logs an error per partition with how many and the first
key, and counts them (`tickwheel_misplaced_events_total`); the subscription dead-letters
each and counts it too. Partitions added to the topics leave a whole log of them."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from fakes import RunningNode, running, wait_until
from test_node_memory import PARTITIONS, SERVICE, TOPICS
from test_processor_memory import (
    ORDER,
    T0,
    P,
    memory_log,
    never,
    orders,
    owner,
    reminded,
    send_commands,
)
from test_processor_memory import TOPICS as ORDER_TOPICS

from app.commands.processor import CommandProcessor, state_key
from app.kafka.memory import MemoryLog
from app.protocol.topics import ContextTopics
from app.protocol.wire import EventEnvelope, encode
from tables import AggregateRef
from tables.aggregate_store import MemoryAggregateStore
from tables.partitioner import partition_of


async def test_a_restore_after_partitions_were_added_says_what_it_did_not_fold(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = memory_log()
    processor, _, _ = await owner(log)
    await processor.handle(await send_commands(log, 1, 2))
    # Every topic given 12 partitions more, and the count raised with them: the
    # order's id now hashes elsewhere, its events stay where they were.
    await log.add_partitions(log.topic_names(), 12)
    assert partition_of(ORDER.id, 16) != P
    states, told = MemoryAggregateStore(), list[int]()
    p = CommandProcessor(orders, P, partitions=16, states=states, commit=never, now=lambda: T0)
    with caplog.at_level(logging.ERROR, "app.commands.states"):
        assert await p.restore(log.reader(), misplaced=told.append) == len(
            log.records(ORDER_TOPICS.events, P)
        )
    assert told == [2]
    [error] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert f"{ORDER_TOPICS.events}[{P}]: 2 events are not in their aggregate's partition" in error
    assert "over 16 partitions" in error and "key b'o-1'" in error
    assert f"belongs in partition {partition_of(ORDER.id, 16)}" in error
    assert states.get(P, state_key(ORDER)) is None, "not folded"


async def test_a_restore_of_a_log_in_place_tells_nothing(caplog: pytest.LogCaptureFixture) -> None:
    log = memory_log()
    processor, _, _ = await owner(log)
    await processor.handle(await send_commands(log, 1))
    told: list[int] = []
    p = CommandProcessor(
        orders, P, partitions=4, states=(states := MemoryAggregateStore()), commit=never,
        now=lambda: T0,
    )  # fmt: skip
    with caplog.at_level(logging.ERROR, "app.commands.states"):
        await p.restore(log.reader(), misplaced=told.append)
    assert told == [] and not [r for r in caplog.records if r.levelno == logging.ERROR]
    assert reminded(states) == 1


def counted(node: RunningNode, p: int, where: str) -> float:
    value = node.node.metrics.registry.get_sample_value(
        "tickwheel_misplaced_events_total",
        {"type": TOPICS.type_name, "partition": str(p), "where": where},
    )
    return value or 0.0


async def test_a_misplaced_event_is_counted_where_read_and_where_restored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = MemoryLog()
    owner_ref = AggregateRef(context="mem", aggregate="counter", id="o1")
    wrong = (partition_of("o1", PARTITIONS) + 1) % PARTITIONS
    event = EventEnvelope(
        id="e-1", type="Fired", aggregate=owner_ref, version=1, created_at=T0, body={"n": 1}
    )
    async with running(RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS)) as a:
        await log.publisher().send(TOPICS.events, b"o1", encode(event), wrong)
        letters = ContextTopics("mem").dead_letters
        await wait_until(lambda: len(log.records(letters, 0)) == 1)
        await wait_until(lambda: counted(a, wrong, "log") == 1)
    # Another node, its local states empty, folds the log from its start.
    with caplog.at_level(logging.ERROR, "app.commands.states"):
        async with running(RunningNode(log, tmp_path, "b", SERVICE, PARTITIONS)) as b:
            assert counted(b, wrong, "restore") == 1
            assert counted(b, 1 - wrong, "restore") == 0
    assert any("1 events are not in their" in r.getMessage() for r in caplog.records)
