"""The failure ledger on the in-memory log: a node reads the topic to its end on start and
then follows it, so another node's parks and resolutions reach it; its own writes are
applied once acknowledged."""

from __future__ import annotations

import asyncio

import pytest

from app.errors import KafkaUnavailable, MissingTopic
from app.kafka import TopicSpec
from app.kafka.memory import MemoryLog
from app.protocol.topics import ContextTopics
from app.timers.ledger import KafkaFailureLedger, decode_key, read_ledger
from tables import AggregateRef, CommandSpec, OnceRule, Timer
from tables.ledger import LedgerEntry

T0 = 1_800_000_000_000
PARTITIONS = 4
TOPIC = ContextTopics("shop").ledger
OWNER = AggregateRef(context="shop", aggregate="order", id="o-1")
TARGET = AggregateRef(context="billing", aggregate="invoice", id="i-1")


def timer(n: int) -> Timer:
    return Timer(
        id=f"t-{n}",
        owner=OWNER,
        key=f"k-{n}",
        version=1,
        partition=0,
        rule=OnceRule(at=T0),
        target=TARGET,
        command=CommandSpec(type="billing.Remind"),
        slot_due_at=T0,
        due_at=T0,
    )


async def eventually_entries(ledger: KafkaFailureLedger, count: int) -> list[LedgerEntry]:
    """Its entries once its follower applied what was written: a few turns of the loop."""
    for _ in range(50):
        entries = await ledger.entries()
        if len(entries) == count:
            return entries
        await asyncio.sleep(0)
    raise AssertionError(f"{count} entries expected, {len(entries)} held")


async def test_parks_and_resolutions_reach_every_node() -> None:
    log = MemoryLog([TopicSpec(TOPIC, PARTITIONS)])
    first = KafkaFailureLedger(log, "shop", PARTITIONS, log.publisher())
    await first.start()
    try:
        await first.record("shop.order", TARGET, [timer(1)])
        await first.record("shop.order", TARGET, [timer(2), timer(1)])
        [entry] = await first.entries()
        assert entry.timers == ("t-1#0", "t-2#0")
        [record] = [r for p in range(PARTITIONS) for r in log.records(TOPIC, p)][-1:]
        assert decode_key(record.key) == ("shop.order", TARGET)

        second = KafkaFailureLedger(log, "shop", PARTITIONS, log.publisher())
        await second.start()  # reads the topic to its end before it returns
        try:
            assert await second.entries() == [entry]
            assert await second.resolve("shop.order", TARGET)
            assert await second.entries() == []
            assert await eventually_entries(first, 0) == []
            await first.record("shop.order", TARGET, [timer(3)])
            [again] = await eventually_entries(second, 1)
            assert again.timers == ("t-3#0",)
        finally:
            await second.stop()
    finally:
        await first.stop()
    assert not await KafkaFailureLedger(log, "shop", PARTITIONS, log.publisher()).resolve(
        "shop.order", AggregateRef(context="billing", aggregate="invoice", id="unknown")
    )


async def test_a_node_holds_the_open_entries_not_every_target_ever_parked() -> None:
    """Parks and resolves of many targets, by this node and another: once the follower
    read them back, the node holds the one still open."""
    log = MemoryLog([TopicSpec(TOPIC, PARTITIONS)])
    first = KafkaFailureLedger(log, "shop", PARTITIONS, log.publisher())
    second = KafkaFailureLedger(log, "shop", PARTITIONS, log.publisher())
    await first.start()
    await second.start()
    try:
        targets = [
            AggregateRef(context="billing", aggregate="invoice", id=f"i-{n}") for n in range(50)
        ]
        for n, target in enumerate(targets):
            writer = (first, second)[n % 2]
            await writer.record("shop.order", target, [timer(n)])
            await eventually_entries(writer, 1)
            assert await writer.resolve("shop.order", target)
        await first.record("shop.order", TARGET, [timer(99)])
        for ledger in (first, second):
            assert len(await eventually_entries(ledger, 1)) == 1
            for _ in range(50):
                if ledger.held == 1:
                    break
                await asyncio.sleep(0)
            assert ledger.held == 1
            assert ledger.open_entries == 1, "counted as the entries are: one open"
    finally:
        await second.stop()
        await first.stop()


async def test_partitions_added_to_the_ledger_alone_take_none_of_its_records() -> None:
    """An operator grows `<context>.failure-ledger` alone while the nodes run: every park and
    tombstone still goes where the nodes read (the context's count), so another node sees
    every open entry and none resolved (a tombstone beside its record)."""
    log = MemoryLog([TopicSpec(TOPIC, PARTITIONS)])
    first = KafkaFailureLedger(log, "shop", PARTITIONS, log.publisher())
    await first.start()
    try:
        await log.add_partitions([TOPIC], PARTITIONS)  # 4 -> 8
        targets = [
            AggregateRef(context="billing", aggregate="invoice", id=f"i-{n}") for n in range(50)
        ]
        for n, target in enumerate(targets):
            await first.record("shop.order", target, [timer(n)])
        for target in targets[::2]:
            assert await first.resolve("shop.order", target)
        second = KafkaFailureLedger(log, "shop", PARTITIONS, log.publisher())
        await second.start()
        try:
            open_ = {e.target for e in await second.entries()}
            assert open_ == set(targets[1::2])
            assert {e.target for e in await first.entries()} == open_
            assert all(not log.records(TOPIC, p) for p in range(PARTITIONS, 2 * PARTITIONS))
        finally:
            await second.stop()
    finally:
        await first.stop()


async def test_an_entry_not_read_here_yet_is_not_written_over() -> None:
    # Another node parked the target; this node's follower has not read that record yet
    # (here: it stopped). Its resolve finds no entry and writes nothing over the other's
    # (a blind tombstone could land after a newer park); the runner asks again later.
    log = MemoryLog([TopicSpec(TOPIC, PARTITIONS)])
    first = KafkaFailureLedger(log, "shop", PARTITIONS, log.publisher())
    second = KafkaFailureLedger(log, "shop", PARTITIONS, log.publisher())
    await first.start()
    await second.start()
    try:
        assert second.task is not None
        second.task.cancel()
        await first.record("shop.order", TARGET, [timer(1)])
        assert not await second.resolve("shop.order", TARGET)
        assert len(await eventually_entries(first, 1)) == 1
        assert [r.value is None for p in range(PARTITIONS) for r in log.records(TOPIC, p)] == [
            False
        ]
    finally:
        await second.stop()
        await first.stop()


async def test_the_cli_reads_the_open_entries_from_the_topic() -> None:
    """`read_ledger` (`tickwheel timers ledger`) on the cluster's clients: what a node
    parked and did not resolve, creating no topic when no node of the context ran."""
    log = MemoryLog([TopicSpec(TOPIC, PARTITIONS)])
    ledger = KafkaFailureLedger(log, "shop", PARTITIONS, log.publisher())
    await ledger.start()
    try:
        other = AggregateRef(context="billing", aggregate="invoice", id="i-2")
        await ledger.record("shop.order", TARGET, [timer(1)])
        await ledger.record("shop.order", other, [timer(2)])
        assert await ledger.resolve("shop.order", other)
        assert await read_ledger(log, "shop") == await ledger.entries()
        assert [e.target for e in await read_ledger(log, "shop", PARTITIONS)] == [TARGET]
    finally:
        await ledger.stop()
    with pytest.raises(KafkaUnavailable, match=f"has {PARTITIONS} partitions, expected 2"):
        await read_ledger(log, "shop", 2)
    with pytest.raises(MissingTopic, match=r"topic other\.failure-ledger does not exist"):
        await read_ledger(log, "other")
    assert log.topic_names() == {TOPIC}
