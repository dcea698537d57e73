"""What a cycle counts is counted when the transaction that carries it commits, not when it
is staged: a failed commit's partition is taken afresh and its records decided again, so
counting them at the stage counted each once per attempt (found by a metrics hunt: one
result and one dead letter on the log, `tickwheel_commands_total` and
`tickwheel_dead_letters_total` at 2)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from fakes import RunningNode, wait_until
from test_commit_failing import BAD, OWNER, fail_commits_of_bad
from test_node_memory import PARTITIONS, SERVICE, TOPICS, results, schedule

from app.kafka.memory import MemoryLog
from app.node.task_id import TaskId
from app.protocol.topics import ContextTopics
from app.timers.runner import RoundStats


def samples(node: RunningNode, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for family in node.node.metrics.registry.collect():
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


async def test_a_failed_commit_then_one_that_lands_counts_each_once(tmp_path: Path) -> None:
    log = MemoryLog()
    node = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(node.runs)
        failed = fail_commits_of_bad(log)
        fail = log.before_commit
        assert fail is not None

        async def once(tid: str) -> None:
            if not failed:  # BAD's first commit fails, every later one lands
                await fail(tid)

        log.before_commit = once
        await log.publisher().send(TOPICS.commands, OWNER.encode(), b"not json", BAD)
        cmd = await schedule(log, OWNER, int(time.time() * 1000) + 3_600_000)
        await wait_until(lambda: cmd.request_id in results(log), within=10)
        await wait_until(node.runs, within=10)
        assert len(failed) == 1

        def counted() -> tuple[dict[Any, float], ...]:
            return (
                samples(node, "tickwheel_commands_total"),
                samples(node, "tickwheel_dead_letters_total"),
                samples(node, "tickwheel_timer_puts_total"),
            )

        # The puts are read back from the log after the results: waited for.
        await wait_until(lambda: all(counted()), within=10, what=lambda: f"{counted()}")
        letters = log.records(ContextTopics("mem").dead_letters, BAD)
        assert len(letters) == 1
        assert counted() == (
            {(("code", "COMMITTED"), ("type", "mem.counter")): 1.0},
            {(("topic", TOPICS.commands),): 1.0},
            {(("type", "mem.counter"),): 1.0},
        )
    finally:
        log.before_commit = None
        await node.stop()


@pytest.mark.parametrize("clean", [True, False])
async def test_a_closes_last_timer_writes_count_only_when_they_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean: bool
) -> None:
    """The firing's last writes as its partition is let go (`stop_partition`) were counted
    at once: a dirty close's are thrown away and done, and counted, again by the next take."""
    node = await RunningNode(MemoryLog(), tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(node.runs)
        kept = node.node.types[TOPICS.type_name]
        stop_partition = kept.runner.stop_partition

        async def last_writes(p: int) -> RoundStats:
            await stop_partition(p)
            return RoundStats(fired=5)

        monkeypatch.setattr(kept.runner, "stop_partition", last_writes)
        task = node.node._tasks[TaskId(TOPICS.type_name, BAD)]
        await task.close(clean=clean)
        fired = samples(node, "tickwheel_timer_actions_total")
        assert fired.get((("action", "fired"), ("type", TOPICS.type_name)), 0.0) == (
            5.0 if clean else 0.0
        )
    finally:
        await node.stop()
