"""Through a node (memory Kafka): a parked timer that its owner cancels, or replaces
under its key, is taken out of its ledger entry, and the entry goes once it names
nothing (`app.timers.unparked`, wired by the partition's changelog sink and round)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

from fakes import RunningNode, wait_until
from pydantic import BaseModel

from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType, Command, Decision
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import CommandEnvelope, encode
from app.service import Service
from app.timers.ledger import LedgerView
from app.timers.runner import RetryPolicy, TimerOptions
from tables import AggregateRef, CommandSpec, OnceRule, Timer, TimerStatus
from tables.ledger import LedgerEntry
from tables.partitioner import partition_of

PARTITIONS = 2
TOPICS = AggregateTopics("gone", "order")
OWNER = AggregateRef(context="gone", aggregate="order", id="o-1")


class Order(BaseModel):
    pass


order = AggregateType("gone", "order", Order)


@order.command("Schedule")
def _schedule(state: Order, cmd: Command, d: Decision) -> None:
    for key in cmd.body["keys"]:
        d.schedule(key, OnceRule(at=int(cmd.body["at"])), CommandSpec(type="Ship"))


@order.command("Cancel")
def _cancel(state: Order, cmd: Command, d: Decision) -> None:
    d.cancel_schedule(cmd.body["key"])


@order.command("Ship")
def _ship(state: Order, cmd: Command, d: Decision) -> None:
    raise ValueError("out of stock")


def rows(log: MemoryLog) -> list[Timer]:
    latest: dict[bytes, bytes | None] = {}
    for p in range(PARTITIONS):
        for r in log.records(TOPICS.timers_changelog, p):
            assert r.key is not None
            latest[r.key] = r.value
    return [Timer.model_validate_json(v) for v in latest.values() if v is not None]


def entries(log: MemoryLog) -> list[LedgerEntry]:
    view = LedgerView()
    topic = ContextTopics("gone").ledger
    for p in range(log.partitions(topic)):
        for record in log.records(topic, p):
            view.apply_record(record)
    return view.entries()


async def send(log: MemoryLog, type_: str, body: dict[str, object]) -> None:
    now = int(time.time() * 1000)
    cmd = CommandEnvelope(
        request_id=uuid.uuid4().hex, type=type_, aggregate=OWNER, body=body, issued_at=now
    )
    p = partition_of(OWNER.id, PARTITIONS)
    await log.publisher().send(TOPICS.commands, OWNER.id.encode(), encode(cmd), p)


def parked(log: MemoryLog) -> set[str]:
    return {t.key for t in rows(log) if t.status is TimerStatus.PARKED}


def names(log: MemoryLog) -> list[tuple[str, ...]]:
    return [e.timers for e in entries(log)]


def named(log: MemoryLog) -> Callable[[], str]:
    """What `wait_until` says when it gives up: the entries' names."""
    return lambda: f"the ledger names {names(log)}"


async def test_a_cancelled_parked_timer_leaves_its_ledger_entry(tmp_path: Path) -> None:
    log = MemoryLog()
    retry = RetryPolicy(initial_backoff_ms=10, max_backoff_ms=10, max_attempts=2)
    node = RunningNode(
        log,
        tmp_path,
        "node",
        Service(aggregates=(order,)),
        PARTITIONS,
        timers=TimerOptions(retry=retry),
    )
    await node.start()
    try:
        await send(log, "Schedule", {"keys": ["a", "b"], "at": int(time.time() * 1000)})
        await wait_until(lambda: parked(log) == {"a", "b"}, what=lambda: f"{rows(log)}")
        await wait_until(lambda: [len(n) for n in names(log)] == [2], what=named(log))
        await send(log, "Cancel", {"key": "a"})
        await wait_until(lambda: parked(log) == {"b"}, what=lambda: f"{rows(log)}")
        [b] = [t for t in rows(log) if t.key == "b"]
        await wait_until(lambda: names(log) == [(b.request_id,)], what=named(log))
        await send(log, "Cancel", {"key": "b"})
        await wait_until(lambda: entries(log) == [], what=named(log))
    finally:
        await node.stop()
