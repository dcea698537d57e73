"""A take that reads its log from before its end (a rebuild's replay from the log's start,
a node far behind) fires nothing until its cycles have read the log to where it ended
then: a timer set in that part of the log and cancelled later in it never fires (found by
a hunt: it fired between its set and its cancel, the cancel more than a poll later)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from fakes import RunningNode, wait_until
from test_node_firing_memory import elsewhere
from test_node_lifecycle import COUNTER, PARTITIONS, TOPICS, events, now_ms, same_partition, start

from app.kafka import OutRecord
from app.kafka.memory import MemoryLog
from app.node.task_id import TaskId
from app.node.task_state import TaskState
from app.protocol.wire import SCHEDULE_CANCELLED, SCHEDULE_SET, EventEnvelope, encode
from tables import AggregateRef, TimerStatus
from tables.partitioner import partition_of

__all__ = ["log", "nodes"]  # the fixtures, imported for pytest

from test_node_lifecycle import log, nodes

FILLER = 5_000
"""Records between the set and the cancel: more than a poll hands over (2,000)."""


def event(owner: str, version: int, type_: str, body: Mapping[str, object], at: int) -> OutRecord:
    ref = AggregateRef(context="life", aggregate=COUNTER.name, id=owner)
    e = EventEnvelope(
        id=f"{owner}-v{version}", type=type_, aggregate=ref, version=version, created_at=at,
        body=body,
    )  # fmt: skip
    return (TOPICS[COUNTER.name].events, partition_of(owner, PARTITIONS), owner.encode(), encode(e))


async def test_a_timer_set_and_cancelled_in_the_log_a_take_replays_never_fires(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path
) -> None:
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
    # A rebuild: a new node, no changelog, the group's offsets on the log at its start.
    node = await start(nodes, log, tmp_path, "b")
    kept = node.node.types[COUNTER.type_name]
    owner = AggregateRef(context="life", aggregate=COUNTER.name, id="o1")

    async def settled() -> bool:
        row = await kept.store.find(owner, "r")
        return row is not None and row.status in (TimerStatus.CANCELLED, TimerStatus.FIRED)

    await wait_until(settled, within=20)
    await wait_until(node.runs, within=20)
    commands = TOPICS[COUNTER.name].commands
    decided = partition_of(target, PARTITIONS)
    end = log.offsets(commands, decided)[1]
    await wait_until(lambda: (log.committed("g", commands, decided) or 0) >= end, within=20)
    assert [e for e in events(log, COUNTER, "Fired") if e.aggregate.id == target] == []
    row = await kept.store.find(owner, "r")
    assert row is not None and row.status is TimerStatus.CANCELLED


async def test_a_hold_a_failure_brings_back_ends_where_the_group_committed_past_it(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path
) -> None:
    """The cycle that read the replay to its end wrote nothing (events of no timer): its
    offsets were committed outside any transaction, so a failure before p's next commit
    landed brought the hold back, and the retake, reading from past it, never released
    it: p fired nothing again (a review of the hold above). A retake drops what a hold
    waits for below the offsets the group committed."""
    p = partition_of("o1", PARTITIONS)
    other = next(f"o{i}" for i in range(2, 50) if partition_of(f"o{i}", PARTITIONS) == p)
    first = await start(nodes, log, tmp_path, "a")
    await wait_until(first.runs)
    await first.stop()
    nodes.remove(first)
    at = now_ms() - 60_000
    to = {"context": "life", "aggregate": COUNTER.name, "id": "o1"}
    rule = {"kind": "once", "at": now_ms() + 8_000}
    body = {"key": "r", "rule": rule, "command": {"type": "Fire"}, "target": to}
    records = [event("o1", 1, SCHEDULE_SET, body, at)]
    records += [event(other, i, "Fired", {"n": i}, at) for i in range(1, 3_000)]
    await log.publisher().send_many(records)
    node = await start(nodes, log, tmp_path, "b")
    tasks = node.node.tasks.tasks
    key = TaskId(COUNTER.type_name, p)
    await wait_until(lambda: key in tasks and tasks[key].firing is not None, within=20)
    task = tasks[key]
    log_topic = TOPICS[COUNTER.name].events
    end = log.offsets(log_topic, p)[1]
    await wait_until(lambda: (log.committed("g", log_topic, p) or 0) >= end, within=20)
    task.failed("the timer rounds of counter", RuntimeError("a store read failed"))
    await wait_until(lambda: task.state is TaskState.RUNNING and task.takes == 2, within=20)
    assert not task.failing.held(p), task.failing.report()
    await wait_until(
        lambda: any(e.aggregate.id == "o1" for e in events(log, COUNTER, "Fired")), within=20
    )
