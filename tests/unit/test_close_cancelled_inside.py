"""A partition task's close that ends by a CancelledError leaked out of a call in it (a
client's: a producer's stop, the results reader's remove), although nobody cancelled the
close, is a crashed close: the node stops (p may be half open), as for any failed close.
Found by a hunt: it failed nothing, and the close was dropped from `closing`, so no later
take of p waited for it. A close that is itself cancelled still ends cancelled."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fakes import RunningNode, wait_until
from test_node_lifecycle import COUNTER, start

from app.kafka.memory import MemoryLog
from app.node.partition_tasks import PartitionTasks
from app.node.shielded_close import CloseCancelled, ShieldedClose
from app.node.task_id import TaskId

__all__ = ["log", "nodes"]  # the fixtures, imported for pytest

from test_node_lifecycle import log, nodes


class Task:
    """A revoked partition task, as `PartitionTasks` closes it."""

    key = TaskId("mem.counter", 0)
    type_name, p = key
    closing_since: float | None = None

    def __init__(self, revoke: asyncio.Event | None = None) -> None:
        self._hold = revoke

    def leave(self) -> None:
        pass

    async def revoke(self) -> None:
        if self._hold is not None:
            await self._hold.wait()
        await asyncio.sleep(0)
        raise asyncio.CancelledError  # leaked out of a client call mid-close


async def test_a_close_cancelled_from_inside_stops_the_node() -> None:
    failed: list[str] = []
    tasks = PartitionTasks(owned=lambda n: None, all_running=lambda: None, fail=failed.append)
    close = tasks._close(Task())  # type: ignore[arg-type]
    await asyncio.wait([close])
    assert not close.cancelled() and close.result() is False  # a later take of p waits on it
    assert len(failed) == 1 and "closing partition 0 of mem.counter failed" in failed[0]
    assert tasks.closing == {}


async def test_a_close_cancelled_by_its_caller_is_cancelled_and_fails_nothing() -> None:
    failed: list[str] = []
    tasks = PartitionTasks(owned=lambda n: None, all_running=lambda: None, fail=failed.append)
    close = tasks._close(Task(asyncio.Event()))  # type: ignore[arg-type]
    await asyncio.sleep(0.01)
    close.cancel()
    await asyncio.wait([close])
    assert close.cancelled()
    assert failed == []


async def test_a_shielded_close_cancelled_from_inside_fails_its_callers() -> None:
    """The close's own task: its failure is heard by the caller waiting on it, and, when
    none waited, by the next caller (never a close that ended quietly)."""
    closes = ShieldedClose()
    runs = 0

    async def leaking() -> None:
        nonlocal runs
        runs += 1
        await asyncio.sleep(0)
        raise asyncio.CancelledError

    with pytest.raises(CloseCancelled):
        await closes.run(leaking, closed=False, name="close mem.counter 0")
    assert runs == 1
    # Its caller cancelled while it runs: the next caller hears its failure.
    caller = asyncio.create_task(closes.run(leaking, closed=False, name="close mem.counter 0"))
    await asyncio.sleep(0)
    caller.cancel()
    await asyncio.wait([caller])
    assert caller.cancelled()
    await asyncio.sleep(0.01)  # the close ends meanwhile
    assert runs == 2
    with pytest.raises(CloseCancelled):
        await closes.run(leaking, closed=True, name="close mem.counter 0")
    assert runs == 2


async def test_a_node_whose_close_is_cancelled_from_inside_stops(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A revoke's close cut by a CancelledError out of the producer's stop: the rest of p
    is let go all the same, and the node stops."""
    node = await start(nodes, log, tmp_path, "a")
    await wait_until(node.runs)
    n = node.node
    key = TaskId(COUNTER.type_name, 0)
    task = n.tasks.tasks[key]
    kept = n.types[COUNTER.type_name]
    abandon = kept.transactions.abandon

    async def leaking(p: int, **kwargs: object) -> None:
        await abandon(p, **kwargs)  # type: ignore[arg-type]
        if p == 0:
            raise asyncio.CancelledError  # leaked out of the producer's stop

    monkeypatch.setattr(kept.transactions, "abandon", leaking)
    await asyncio.wait_for(n.tasks.revoke({key}), 10)
    await wait_until(lambda: n._failure is not None, within=5)
    assert "closing partition 0" in str(n._failure)
    # The rest of p was let go all the same.
    assert 0 not in kept.store.assigned and task.processor is None
    assert task.key not in {t.key for t in n.tasks.closing}
