"""A corrupt stored row, on the in-memory log: the partition it is in fails alone (its task
closed dirty, revived, its local copy dropped and restored from its changelog), while the
other partitions of the type keep firing (#19)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fakes import RunningNode, wait_until
from test_node_memory import PARTITIONS, SERVICE, TOPICS, events, schedule, task_of

from app.kafka.memory import MemoryLog
from app.node.partition_task import PartitionTask
from app.node.task_state import TaskState
from app.timers.restore import restore_partition
from tables import AggregateRef, StoreError
from tables.keys import due_key, row_key
from tables.partitioner import partition_of


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[RunningNode]:
    n = await RunningNode(MemoryLog(), tmp_path, "a", SERVICE, PARTITIONS).start()
    yield n
    await n.stop()


def owners_in(p: int) -> list[str]:
    return [f"o{i}" for i in range(1, 99) if partition_of(f"o{i}", PARTITIONS) == p]


async def test_a_corrupt_row_fails_only_its_partition_which_is_restored_from_its_changelog(
    node: RunningNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = node.node.clients
    assert isinstance(log, MemoryLog)
    await wait_until(node.runs)
    tasks = {key.p: task for key, task in node.node._tasks.items()}  # one type: by p
    bad, good = 0, 1
    moves: list[tuple[int, TaskState]] = []
    failures: list[tuple[int, BaseException]] = []
    restores: list[tuple[int, bool]] = []
    to, failed = PartitionTask._to, PartitionTask.failed

    def recording(task: PartitionTask, target: TaskState) -> None:
        to(task, target)
        moves.append((task.p, target))

    def failing(task: PartitionTask, what: str, exc: BaseException) -> None:
        failures.append((task.p, exc))
        failed(task, what, exc)

    async def restoring(store: Any, reader: Any, topic: str, p: int, **kw: Any) -> int:
        restores.append((p, kw["clean"]))
        return await restore_partition(store, reader, topic, p, **kw)

    monkeypatch.setattr(PartitionTask, "_to", recording)
    monkeypatch.setattr(PartitionTask, "failed", failing)
    monkeypatch.setattr("app.node.partition_open.restore_partition", restoring)
    kept = node.node.types[TOPICS.type_name]
    firing = tasks[bad].firing
    assert firing is not None
    # Due together, beyond the wheels' horizon: loaded (the bad one as the corrupt bytes
    # below) and taken in the same round.
    at = int(time.time() * 1000) + 1_500
    mine, other = owners_in(bad)[0], owners_in(good)[0]
    await schedule(log, mine, at)
    await schedule(log, other, at)
    owner = AggregateRef(context="mem", aggregate="counter", id=mine)

    async def stored() -> bool:
        return await kept.store.find(owner, "k") is not None

    await wait_until(stored)
    timer = await kept.store.find(owner, "k")
    assert timer is not None and timer.partition == bad and timer.due_at == at
    assert int(time.time() * 1000) < at - 500, "the test machine was too slow to set it up"
    # The row's bytes on disk go bad (its changelog keeps the row whole).
    kept.store._db(bad).put(  # type: ignore[attr-defined]  # a RocksDB store's own DB
        due_key(timer.due_at, timer.id, row_key(owner, "k")), b'{"id": "t", "due_at": "soon"}'
    )
    # The other partition fires, untouched, while the bad one is failed and taken afresh.
    await wait_until(lambda: other in [e.aggregate.id for e in events(log, "Fired")])
    await schedule(log, other, int(time.time() * 1000) + 200)
    await wait_until(lambda: [e.aggregate.id for e in events(log, "Fired")].count(other) == 2)
    assert [p for p, _ in moves if p == good] == [] and [p for p, _ in failures] == [bad]
    assert node.node._tasks[task_of(good)] is tasks[good] and tasks[good].takes == 1
    exc = failures[0][1]
    assert isinstance(exc, StoreError) and exc.partition == bad, exc
    assert f"partition {bad}" in str(exc)
    # Closed dirty, revived, its local copy dropped and restored from its changelog: its
    # timer, whole again, fires once.
    await wait_until(lambda: mine in [e.aggregate.id for e in events(log, "Fired")], within=15)
    assert [s for p, s in moves if p == bad] == [
        TaskState.SUSPENDED,
        TaskState.CLOSED,
        TaskState.CREATED,
        TaskState.RESTORING,
        TaskState.RUNNING,
    ]
    assert restores == [(bad, False)]
    assert tasks[bad].state is TaskState.RUNNING and tasks[bad].takes == 2
    assert [e.aggregate.id for e in events(log, "Fired")].count(mine) == 1
    # Its failed firing was stopped and dropped with its close; it runs a fresh one.
    assert firing.fault is exc and firing.stopped
    assert tasks[bad].firing is not firing
    assert kept.runner.start_partition(bad) is tasks[bad].firing
    await wait_until(node.runs)
