"""The demo reaches Kafka through the `Clients` it is given: here a memory log's, standing
in for the workers (which the integration tests and `scripts/run` have on Kafka)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import app.demo
from app.demo import ORDERS, SCHEDULES, run_demo, timer_table
from app.jobs import ENABLE
from app.kafka.memory import MemoryLog
from app.protocol.wire import CommandEnvelope, EventEnvelope, decode, encode
from tables import AggregateRef, CommandSpec, OnceRule, Timer
from tables.partitioner import partition_of

P = 4


class TurnsNotSeconds:
    """`asyncio` as the demo sees it, whose pauses are turns of the loop, not seconds: a
    memory log never waits, so a hundred turns let every task do what it can."""

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    @staticmethod
    async def sleep(seconds: float) -> None:
        for _ in range(100):
            await asyncio.sleep(0)


def row(order: str, key: str, version: int) -> Timer:
    owner = AggregateRef(context="shop", aggregate="order", id=order)
    return Timer(
        id=f"{order}/{key}",
        owner=owner,
        key=key,
        version=version,
        partition=partition_of(order, P),
        rule=OnceRule(at=5),
        target=owner,
        command=CommandSpec(type="shop.CancelUnpaid"),
        slot_due_at=5,
        due_at=5,
    )


async def test_the_timer_table_is_the_changelogs_latest_row_per_key() -> None:
    log = MemoryLog()
    topic = log.create_topic(ORDERS.timers_changelog, P)
    publisher = log.publisher()
    first, second, other = row("o-1", "deadline", 1), row("o-1", "deadline", 2), row("o-2", "r", 1)
    for t in (first, other, second):
        await publisher.send(topic, t.id.encode(), t.model_dump_json().encode(), t.partition)
    assert await timer_table(log, P) == {b"o-1/deadline": second, b"o-2/r": other}


async def test_the_demo_makes_its_topics_sends_its_commands_and_shows_the_events(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(app.demo, "asyncio", TurnsNotSeconds())
    log = MemoryLog()
    shown: list[str] = []
    written: list[asyncio.Task[int]] = []

    def show(line: str) -> None:
        shown.append(line)
        if line.startswith("placed "):  # a worker's answer, as the tails see one
            order = line.split()[1].rstrip(":,")
            event = EventEnvelope(
                id="e-1",
                type="shop.OrderPlaced",
                aggregate=AggregateRef(context="shop", aggregate="order", id=order),
                version=1,
                request_id="demo-1",
                created_at=0,
                body={"amount": 42},
            )
            send = log.publisher().send(
                ORDERS.events, order.encode(), encode(event), partition_of(order, P)
            )
            written.append(asyncio.get_running_loop().create_task(send))

    rows = await run_demo(log, P, count=2, seconds=0, show=show)
    assert rows == {}  # no worker: no timer table rows
    assert {ORDERS.commands, ORDERS.events, SCHEDULES.commands} <= log.topic_names()
    commands = [
        (r.partition, decode(CommandEnvelope, r.value))
        for p in range(P)
        for r in log.records(ORDERS.commands, p)
    ]
    assert sorted(c.type for _, c in commands) == ["shop.PayOrder", *["shop.PlaceOrder"] * 2]
    assert all(p == partition_of(c.aggregate.id, P) for p, c in commands)
    (enable,) = [r for p in range(P) for r in log.records(SCHEDULES.commands, p)]
    assert decode(CommandEnvelope, enable.value).type == ENABLE
    placed = next(i for i, line in enumerate(shown) if line.startswith("placed "))
    paid = next(i for i, line in enumerate(shown) if line.startswith("paid "))
    (event,) = [line for line in shown[placed:paid] if "shop.OrderPlaced" in line]
    assert event.split()[1:] == [shown[placed].split()[1].rstrip(":,"), "v1", "shop.OrderPlaced"]
    assert written and all(t.done() for t in written)
