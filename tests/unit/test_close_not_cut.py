"""A task's close is never cut in two by a cancel of its caller: a revoke cancels a failed
task's retake while that retake closes the task (found by a lifecycle hunt: the firing's
outcomes decided before the stop, a result that came back COMMITTED or a park included,
were never written, and its sends in flight could outlive the close)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from fakes import RunningNode, wait_until
from test_node_lifecycle import COUNTER, start

from app.errors import KafkaUnavailable
from app.kafka.memory import MemoryLog
from app.node.failing import A_COMMIT
from app.node.partition_release import CloseFailed
from app.node.task_id import TaskId
from app.node.task_state import TaskState

__all__ = ["log", "nodes"]  # the fixtures, imported for pytest

from test_node_lifecycle import log, nodes


async def test_a_revoke_while_a_retake_closes_the_task_waits_for_that_close(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = await start(nodes, log, tmp_path, "a")
    await wait_until(node.runs)
    n = node.node
    key = TaskId(COUNTER.type_name, 0)
    task = n.tasks.tasks[key]
    kept = n.types[COUNTER.type_name]
    firing = task.firing
    assert firing is not None
    entered, gate = asyncio.Event(), asyncio.Event()
    cut: list[str] = []
    flushed: list[str] = []
    outcomes = kept.runner._outcomes
    flush = outcomes.flush

    async def slow_flush(firings: Any, stats: Any) -> Any:
        """The stop's flush of p's outcomes is slow (a park's ledger record, say)."""
        if firings is not None and list(firings) == [firing] and firing.stopped:
            if not entered.is_set():
                entered.set()
                try:
                    await gate.wait()
                except asyncio.CancelledError:
                    cut.append("the stop's flush of its outcomes")
                    raise
            flushed.append("flushed")
        return await flush(firings, stats)

    monkeypatch.setattr(outcomes, "flush", slow_flush)
    task.failed(A_COMMIT, KafkaUnavailable("commit timed out"))
    await wait_until(entered.is_set)  # the retake is closing the task
    revoke = asyncio.create_task(n.tasks.revoke({key}))  # the group takes p away now
    await wait_until(lambda: task.leaving and task._taking is None)  # the retake cancelled
    assert cut == [] and not revoke.done()  # the revoke waits for the close under way
    gate.set()
    await asyncio.wait_for(revoke, 10)
    assert cut == [] and flushed == ["flushed"]
    assert task.state is TaskState.CLOSED
    assert n._failure is None


async def test_a_close_that_fails_while_no_caller_waits_is_heard_by_the_next(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The retake that began a close is cancelled by a revoke, and the close fails in the
    loop turns before the revoke's own close: that close hears the failure, which stops
    the node, as any failed close does (review of the fix above: it returned quietly, the
    close's failure lost, and p could be taken again half let go)."""
    node = await start(nodes, log, tmp_path, "a")
    await wait_until(node.runs)
    n = node.node
    key = TaskId(COUNTER.type_name, 0)
    task = n.tasks.tasks[key]
    entered, gate = asyncio.Event(), asyncio.Event()
    release = task._release

    async def failing_release(*, clean: bool, store: Any) -> None:
        entered.set()
        await gate.wait()
        await release(clean=clean, store=store)
        raise CloseFailed("partition 0: the producer's stop failed")

    monkeypatch.setattr(task, "_release", failing_release)
    task.failed(A_COMMIT, KafkaUnavailable("commit timed out"))
    await wait_until(entered.is_set)  # the retake is closing the task (dirty)
    gate.set()  # the close's last step ends now, as the group takes p away
    await asyncio.wait_for(n.tasks.revoke({key}), 10)
    await wait_until(lambda: n._failure is not None)
    assert "producer's stop failed" in str(n._failure) or task.state is TaskState.CLOSED
