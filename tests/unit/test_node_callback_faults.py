"""A fault inside the node's own handling of a fault or a rebalance: it ends in a defined
state (the partition taken afresh, or the node stopped loudly), never a partition left
suspended, or given and never taken, while the rest goes on (found by a fault-injection
hunt: each raised once, on the memory log)."""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

import pytest
from fakes import RunningNode, wait_until
from test_commit_failing import BAD, OWNER
from test_node_memory import PARTITIONS, SERVICE, events, schedule

from app.errors import KafkaUnavailable, NodeFailed
from app.kafka.memory import MemoryLog
from app.kafka.memory_group import MemoryGroupMember


def _pause_raising_once_in(monkeypatch: pytest.MonkeyPatch, caller: str) -> list[bool]:
    """`pause` raises once when called from a function named `caller`; whether it did."""
    pause, raised = MemoryGroupMember.pause, [False]

    def pausing(self: MemoryGroupMember, partitions: list[tuple[str, int]]) -> None:
        if not raised[0] and sys._getframe(1).f_code.co_name == caller:
            raised[0] = True
            raise KafkaUnavailable("pause refused")
        pause(self, partitions)

    monkeypatch.setattr(MemoryGroupMember, "pause", pausing)
    return raised


async def test_a_failure_whose_letting_go_raises_stops_the_node_loudly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit fails; pausing the partition's reading then raises: the task was already
    suspended and its retake not yet begun, so it stayed suspended for good (the error
    lost in the commit's task) while the other partition went on."""
    log = MemoryLog()
    node = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(node.runs)
        raised = _pause_raising_once_in(monkeypatch, "let_go")
        failed: list[str] = []

        async def once(tid: str) -> None:
            if tid.endswith(f".{BAD}") and not failed:
                failed.append(tid)
                raise KafkaUnavailable("one commit of BAD fails")

        log.before_commit = once
        await schedule(log, OWNER, int(time.time() * 1000) + 3_600_000)
        run = node.task
        assert run is not None
        await wait_until(lambda: raised[0] and run.done(), within=10)
        assert isinstance(run.exception(), NodeFailed)
        assert "letting it go after a commit failed raised" in str(run.exception())
    finally:
        with contextlib.suppress(NodeFailed):
            await node.stop()


async def test_an_assignment_whose_taking_raises_stops_the_node_loudly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiokafka logs an exception out of a rebalance callback and goes on: a take that
    raised before its tasks were made left every partition given and none taken, the node
    never stopping. Played as aiokafka runs a rebalance (revoke, then assign)."""
    log = MemoryLog()
    node = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(node.runs)
        consumer = node.node._consumer
        assert consumer is not None
        given = set(consumer.assignment())
        raised = _pause_raising_once_in(monkeypatch, "assign")
        await node.node._revoked(given)
        await node.node._assigned(given)  # raises nothing: aiokafka would swallow it
        assert raised[0]
        run = node.task
        assert run is not None
        await wait_until(run.done, within=10)
        assert "taking the partitions the group gave raised" in str(run.exception())
        assert events(log, "Fired") == []
    finally:
        with contextlib.suppress(NodeFailed):
            await node.stop()
