"""A task of p made while an earlier task's close of p still runs waits for that close
before it takes p; closed meanwhile (the group took p away again), it lets none of p go:
what the node holds of p is still the earlier task's (found by a lifecycle hunt: its close
stopped the earlier task's firing, abandoned its transaction with a commit in flight, and
revoked the store under it, so that clean hand-off was restored whole next)."""

from __future__ import annotations

from pathlib import Path

from fakes import RunningNode, wait_until
from test_node_lifecycle import COUNTER, TOPICS, HeldCommits, command, now_ms, start

from app.kafka.memory import MemoryLog
from app.node.task_id import TaskId
from app.node.task_state import TaskState
from tables.partitioner import partition_of

__all__ = ["log", "nodes"]  # the fixtures, imported for pytest

from test_node_lifecycle import log, nodes


async def test_a_task_closed_while_it_waits_for_an_earlier_close_lets_none_of_p_go(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path
) -> None:
    node = await start(nodes, log, tmp_path, "a")
    await wait_until(node.runs)
    n = node.node
    p = partition_of("o1", 2)
    key = TaskId(COUNTER.type_name, p)
    kept = n.types[COUNTER.type_name]
    first = n.tasks.tasks[key]
    held = HeldCommits(log)
    await command(log, COUNTER, "o1", "Schedule", at=now_ms() + 3_600_000)
    await wait_until(held.entered.is_set)  # a commit of p in flight, held (a slow leader)
    txn, firing = first.transaction, first.firing
    assert txn is not None and firing is not None
    names = TOPICS[COUNTER.name]
    mine = {(t, p) for t in (names.events, names.commands, names.timer_ops)}
    assert n._consumer is not None
    given = set(n._consumer.assignment()) | mine
    # A lost membership: an assignment without p (its close not waited for, its commit held),
    n.tasks.assign(given - mine)
    await wait_until(lambda: first in n.tasks.closing and first.state is TaskState.SUSPENDED)
    # the next gives p back (the new task waits for that close),
    n.tasks.assign(given)
    second = n.tasks.tasks[key]
    assert second is not first
    held_then = (txn.abandoned, firing.stopped, p in kept.store.assigned)
    # and the next takes it away again, while the first close still waits.
    n.tasks.assign(given - mine)
    await wait_until(lambda: second.state is TaskState.CLOSED)
    assert (txn.abandoned, firing.stopped, p in kept.store.assigned) == held_then
    assert first in n.tasks.closing
    held.release()
    await wait_until(lambda: not n.tasks.closing)
    assert n._failure is None
    assert (tmp_path / "a" / COUNTER.type_name / "timers" / f"clean-p{p}").exists()
