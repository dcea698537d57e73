"""A take whose rewind finds p no longer assigned (the node lost its membership: the revoke
named none of p, and the group has not assigned again yet) never runs p unheld (found by
a rebalance hunt). Its rewind read no start, so no hold was set: the task ran and fired
while its log was unread, the next assignment moving its positions back to the committed
offsets, and a timer set in the log and cancelled later in it fired in between. The take
now lets p go, and the group's next assignment takes it afresh."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fakes import RunningNode, wait_until
from test_node_firing_memory import elsewhere
from test_node_lifecycle import COUNTER, PARTITIONS, TOPICS, events, now_ms, same_partition, start
from test_replay_holds_firing import FILLER, event

from app.kafka.memory import MemoryLog
from app.node.partition_task import PartitionTask
from app.node.task_id import TaskId
from app.protocol.wire import SCHEDULE_CANCELLED, SCHEDULE_SET
from tables import AggregateRef, TimerStatus
from tables.partitioner import partition_of

__all__ = ["log", "nodes"]  # the fixtures, imported for pytest

from test_node_lifecycle import log, nodes

BYSTANDER = "bystander"
"""Another member's topic: its revoke callback holds the group's rebalance (a slow close)."""


async def test_a_take_rewound_while_its_partition_is_unassigned_never_fires_unheld(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = partition_of("o1", PARTITIONS)
    target = elsewhere("o1")
    other = next(f"o{i}" for i in range(2, 50) if same_partition("o1", f"o{i}"))
    set_at = now_ms() - 3_600_000  # set an hour ago, due 10 minutes later, cancelled after 2
    rule = {"kind": "once", "at": set_at + 600_000}
    to = {"context": "life", "aggregate": COUNTER.name, "id": target}
    body = {"key": "r", "rule": rule, "command": {"type": "Fire"}, "target": to}
    records = [event("o1", 1, SCHEDULE_SET, body, set_at)]
    records += [event(other, i, "Fired", {"n": i}, set_at + 1_000) for i in range(1, FILLER + 1)]
    records += [event("o1", 2, SCHEDULE_CANCELLED, {"key": "r"}, set_at + 120_000)]
    first = await start(nodes, log, tmp_path, "a")  # the workers' topics, made by a node
    await wait_until(first.runs)
    await first.stop()
    nodes.remove(first)
    await log.publisher().send_many(records)

    # Another member of the group, whose revoke callback holds the rebalance once armed.
    armed, window, release = False, asyncio.Event(), asyncio.Event()

    async def revoked(_: set[tuple[str, int]]) -> None:
        if armed:
            window.set()
            await release.wait()

    async def assigned(_: set[tuple[str, int]]) -> None:
        return None

    log.create_topic(BYSTANDER, 1)
    bystander = log.group_member("g", [BYSTANDER], on_assigned=assigned, on_revoked=revoked)
    await bystander.start()

    # p's take waits, restored, just before its rewind.
    gate, opened = asyncio.Event(), asyncio.Event()
    open_topics = PartitionTask.open_topics

    async def gated(task: PartitionTask, topics: set[str]) -> str | None:
        lost = await open_topics(task, topics)
        if task.p == p and not gate.is_set():
            opened.set()
            await gate.wait()
        return lost

    monkeypatch.setattr(PartitionTask, "open_topics", gated)
    # A rebuild: a new node, no changelog, the group's offsets on the log at its start.
    node = await start(nodes, log, tmp_path, "b")
    await wait_until(opened.is_set)
    group = log.groups["g"]
    (member,) = [m for m in group.members if m is not bystander]
    taking = node.node.tasks.tasks[TaskId(COUNTER.type_name, p)]
    await group.expel(member)  # told at its next poll: a revoke naming nothing, then a join
    armed = True
    await wait_until(window.is_set)  # its join's rebalance waits for the bystander's revoke
    assert member.assignment() == set(), "between the lost membership and the next assignment"
    gate.set()  # p's take rewinds now, p unassigned
    await wait_until(lambda: not taking.taking)
    release.set()
    await wait_until(lambda: node.runs(), within=20)

    kept = node.node.types[COUNTER.type_name]
    owner = AggregateRef(context="life", aggregate=COUNTER.name, id="o1")

    async def settled() -> bool:
        row = await kept.store.find(owner, "r")
        return row is not None and row.status in (TimerStatus.CANCELLED, TimerStatus.FIRED)

    await wait_until(settled, within=20)
    commands = TOPICS[COUNTER.name].commands
    decided = partition_of(target, PARTITIONS)
    end = log.offsets(commands, decided)[1]
    await wait_until(lambda: (log.committed("g", commands, decided) or 0) >= end, within=20)
    assert [e for e in events(log, COUNTER, "Fired") if e.aggregate.id == target] == []
    row = await kept.store.find(owner, "r")
    assert row is not None and row.status is TimerStatus.CANCELLED
    assert node.node._failure is None
    await bystander.stop()
