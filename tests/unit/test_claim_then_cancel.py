"""A remote timer's claim is committed while its partition's cycles go on: a cancel decided
and carried out in that time must keep its command from leaving (found by a lifecycle
hunt: the send went all the same, and the target applied it after the cancel)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from fakes import RunningNode, wait_until
from test_node_firing_memory import elsewhere
from test_node_lifecycle import (
    COUNTER,
    TOPICS,
    HeldCommits,
    command,
    events,
    now_ms,
    start,
    timer_rows,
)

from app.kafka.memory import MemoryLog
from app.timers.runner.sending import Sends
from tables import AggregateRef, Timer, TimerStatus
from tables.partitioner import partition_of

__all__ = ["log", "nodes"]  # the fixtures, imported for pytest

from test_node_lifecycle import log, nodes


async def test_a_remote_command_claimed_then_cancelled_before_its_commit_landed_is_not_sent(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = await start(nodes, log, tmp_path, "a")
    await wait_until(node.runs)
    await command(log, COUNTER, "o1", "Remind", at=now_ms() + 600, target=elsewhere("o1"))
    kept = node.node.types[COUNTER.type_name]
    p = partition_of("o1", 2)
    owner = AggregateRef(context="life", aggregate=COUNTER.name, id="o1")
    await wait_until(lambda: [t.key for t in timer_rows(log, COUNTER)] == ["r"])  # committed
    sent: list[str] = []
    send = node.node.producer.send

    async def watched(topic: str, *args: Any, **kwargs: Any) -> Any:
        if topic == TOPICS[COUNTER.name].commands:
            sent.append(topic)
        return await send(topic, *args, **kwargs)

    monkeypatch.setattr(node.node.producer, "send", watched)
    spawned: list[asyncio.Task[Any]] = []
    spawn = Sends.spawn

    def spawning(self: Sends, *args: Any) -> asyncio.Task[Any]:
        spawned.append(task := spawn(self, *args))
        return task

    monkeypatch.setattr(Sends, "spawn", spawning)
    held = HeldCommits(log)
    changelog = TOPICS[COUNTER.name].timers_changelog

    def claim_written() -> bool:
        rows = [
            Timer.model_validate_json(r.value)
            for r in log.records(changelog, p, committed=False)
            if r.value
        ]
        return [t.status for t in rows if t.key == "r"][-1:] == [TimerStatus.FIRING]

    await wait_until(claim_written)
    await wait_until(held.entered.is_set)  # the claims' commit begun, and held
    # The owner cancels the timer: decided, and carried out on the table, in a cycle.
    await command(log, COUNTER, "o1", "Unschedule", key="r")

    async def cancelled() -> bool:
        row = await kept.store.find(owner, "r")
        return row is not None and row.status is TimerStatus.CANCELLED

    await wait_until(cancelled)
    assert spawned == []
    held.release()
    await wait_until(lambda: len(spawned) == 1 and spawned[0].done())
    await wait_until(lambda: bool(events(log, COUNTER, "wow.ScheduleCancelled")))
    await wait_until(lambda: not kept.transactions.pending())
    assert sent == [], "the command left after its cancel was carried out"
    assert events(log, COUNTER, "Fired") == []
    row = await kept.store.find(owner, "r")
    assert row is not None and row.status is TimerStatus.CANCELLED


async def test_a_remote_command_waiting_for_the_topic_listing_is_not_sent_once_cancelled(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The send's own wait (a listing of the cluster's topics, for a topic not in the last)
    comes after the runner's look at the row: the sender looks again as it hands the
    command over (review of the fix above: the command left after a cancel committed)."""
    node = await start(nodes, log, tmp_path, "a")
    await wait_until(node.runs)
    kept = node.node.types[COUNTER.type_name]
    owner = AggregateRef(context="life", aggregate=COUNTER.name, id="o1")
    commands = TOPICS[COUNTER.name].commands
    sent: list[str] = []
    send = node.node.producer.send

    async def watched(topic: str, *args: Any, **kwargs: Any) -> Any:
        if topic == commands:
            sent.append(topic)
        return await send(topic, *args, **kwargs)

    monkeypatch.setattr(node.node.producer, "send", watched)
    entered, gate = asyncio.Event(), asyncio.Event()
    targets = node.node.targets
    assert targets is not None
    exists = targets.exists
    asked: list[bool] = []

    async def listing(topic: str) -> bool:
        if topic == commands and not gate.is_set():
            entered.set()
            await gate.wait()
        found = await exists(topic)
        if topic == commands:
            asked.append(found)
        return found

    monkeypatch.setattr(targets, "exists", listing)
    await command(log, COUNTER, "o1", "Remind", at=now_ms() + 300, target=elsewhere("o1"))
    await wait_until(entered.is_set)  # the runner looked at the row, the send waits
    await command(log, COUNTER, "o1", "Unschedule", key="r")

    async def cancelled() -> bool:
        row = await kept.store.find(owner, "r")
        return row is not None and row.status is TimerStatus.CANCELLED

    await wait_until(cancelled)
    await wait_until(lambda: not kept.transactions.pending())  # the cancel committed
    gate.set()
    await wait_until(lambda: asked == [True] and kept.runner.in_flight == 0)
    assert sent == [], "the command left after its cancel was carried out"
    assert events(log, COUNTER, "Fired") == []
