"""The node drives its runner (#19): what the runner's callbacks guaranteed, now that the
node calls the runner in order instead, on the in-memory log. A remote timer's command
leaves only once its claim is committed (the node commits, then tells the runner to
send); an in-process timer whose cancel is decided in the same cycle is not fired (the
cycle asks the partition's firing for its timers after carrying out its commands)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from fakes import RunningNode, wait_until
from test_node_lifecycle import (
    COUNTER,
    TOPICS,
    HeldCommits,
    command,
    events,
    log,
    nodes,
    now_ms,
    same_partition,
    start,
    timer_rows,
)

from app.kafka.memory import MemoryLog
from app.node.task_id import TaskId
from app.protocol.wire import CommandEnvelope, decode
from tables import Timer, TimerStatus
from tables.partitioner import partition_of

__all__ = ["log", "nodes"]  # the fixtures, imported for pytest


def elsewhere(owner: str) -> str:
    """An aggregate of another partition than `owner`'s: its timers' sends are remote."""
    return next(f"t{i}" for i in range(50) if not same_partition(owner, f"t{i}"))


async def test_a_remote_command_leaves_only_once_its_claim_is_committed(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The timer falls due while every commit is held: it is claimed (its claim in the
    partition's open transaction) but its command is not sent; once the commit goes
    through, it is sent, and at that moment the committed changelog holds its claim."""
    node = await start(nodes, log, tmp_path, "a")
    await wait_until(node.runs)
    target = elsewhere("o1")
    due = now_ms() + 600
    await command(log, COUNTER, "o1", "Remind", at=due, target=target)
    await wait_until(lambda: [t.key for t in timer_rows(log, COUNTER)] == ["r"])
    sent: list[list[TimerStatus]] = []  # per command sent: the committed claim then
    send = node.node.producer.send

    async def watched(topic: str, *args: Any, **kwargs: Any) -> Any:
        if topic == TOPICS[COUNTER.name].commands:
            sent.append([t.status for t in timer_rows(log, COUNTER) if t.key == "r"])
        return await send(topic, *args, **kwargs)

    monkeypatch.setattr(node.node.producer, "send", watched)
    held = HeldCommits(log)
    changelog = TOPICS[COUNTER.name].timers_changelog
    p = partition_of("o1", 2)

    def claim_written() -> bool:
        """Its claim is in p's changelog, not committed (the transaction is open)."""
        rows = [
            Timer.model_validate_json(r.value)
            for r in log.records(changelog, p, committed=False)
            if r.value
        ]
        return [t.status for t in rows if t.key == "r"][-1:] == [TimerStatus.FIRING]

    await wait_until(claim_written)
    await wait_until(held.entered.is_set)  # its commit begun, and held
    await wait_until(lambda: now_ms() > due + 300)
    assert sent == [], "a command left before its claim committed"
    held.release()
    await wait_until(lambda: bool(sent))
    assert sent[0] == [TimerStatus.FIRING], "sent, its claim not committed"
    await wait_until(lambda: [e.aggregate.id for e in events(log, COUNTER, "Fired")] == [target])
    fired = [
        decode(CommandEnvelope, r.value)
        for r in log.records(TOPICS[COUNTER.name].commands, partition_of(target, 2))
    ]
    assert [c.type for c in fired] == ["Fire"]


async def test_an_in_process_timer_cancelled_in_the_same_cycle_is_not_fired(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cancel arrives in the cycle that fires the timer (claimed to fire in-process
    while the cycle was about to run): the cycle carries the cancel out first, then asks
    for the timers its partition's firing holds, and the cancelled one is dropped."""
    node = await start(nodes, log, tmp_path, "a")
    await wait_until(node.runs)
    p = partition_of("o1", 2)
    due = now_ms() + 600
    await command(log, COUNTER, "o1", "Schedule", at=due)
    await wait_until(lambda: [t.key for t in timer_rows(log, COUNTER)] == ["k"])
    cycles = node.node.cycles
    cycle = cycles._cycle
    key = TaskId(COUNTER.type_name, p)
    inp = node.node.tasks.running[key].input
    assert inp is not None
    together: list[bool] = []

    async def late(q: TaskId, items: list[tuple[str, list[Any]]], backlogs: Any) -> bool:
        if q == key and any(topic == TOPICS[COUNTER.name].commands for topic, _ in items):
            # The cancel is in this cycle: it runs once the timer is claimed to fire here.
            await wait_until(lambda: bool(inp.local))
            together.append(True)
        result: bool = await cycle(q, items, backlogs)
        return result

    monkeypatch.setattr(cycles, "_cycle", late)
    await command(log, COUNTER, "o1", "Unschedule")
    await wait_until(lambda: bool(together))
    kept = node.node.types[COUNTER.type_name]
    await wait_until(lambda: kept.runner.backlog(now_ms())[0] == 0)
    await wait_until(
        lambda: [t.status for t in timer_rows(log, COUNTER)] == [TimerStatus.CANCELLED]
    )
    rounds = kept.loop.rounds
    await wait_until(lambda: kept.loop.rounds >= rounds + 3)
    await asyncio.sleep(0)
    assert events(log, COUNTER, "wow.ScheduleCancelled")
    assert events(log, COUNTER, "Fired") == [], "fired in the cycle that decided its cancel"
    # Dropped before it was decided: not a failed cycle (its settle refused) and a retake.
    assert node.node.tasks.running[key].takes == 1 and inp.failed_at == {}
