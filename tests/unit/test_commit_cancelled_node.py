"""End to end (memory log): a partition's commit that ends by a CancelledError leaked out
of the client library (as `TransactionalProducer._fail` re-raises it, after breaking the
producer and aborting) fails its task: p is closed dirty and taken afresh, and the
command whose events, result and timer row never landed is decided again and lands.
Found by a hunt: the task ran on (RUNNING, /readyz ready) with what it took lost, and its
clean close marked clean a copy holding a timer row its changelog did not have."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from fakes import RunningNode, wait_until
from test_node_memory import PARTITIONS, SERVICE, TOPICS, results, schedule, task_of, timer_rows

from app.errors import KafkaUnavailable
from app.kafka import OutRecord
from app.kafka.memory import MemoryLog
from app.kafka.memory_clients import MemoryWriter
from app.node.task_state import TaskState
from tables import AggregateRef
from tables.partitioner import partition_of


async def test_a_commit_cancelled_from_inside_retakes_the_partition_and_lands_its_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = MemoryLog()
    node = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    owner = "o1"
    p = partition_of(owner, PARTITIONS)
    commit = MemoryWriter.commit
    armed = [True]

    async def leaking(
        self: MemoryWriter,
        records: Sequence[OutRecord],
        offsets: dict[tuple[str, int], int],
        group_id: str,
    ) -> list[int]:
        if armed[0] and self.transactional_id.endswith(f".{p}") and records:
            armed[0] = False
            # As TransactionalProducer._fail: broken, the open transaction aborted (here:
            # nothing sent), and the CancelledError re-raised as it came.
            self.broken = KafkaUnavailable(f"{self.transactional_id}: transaction failed")
            raise asyncio.CancelledError
        return await commit(self, records, offsets, group_id)

    try:
        await wait_until(node.runs)
        task = node.node.tasks.tasks[task_of(p)]
        assert task.takes == 1
        monkeypatch.setattr(MemoryWriter, "commit", leaking)
        cmd = await schedule(log, owner, int(time.time() * 1000) + 3_600_000)
        await wait_until(lambda: not armed[0], within=5)
        # The task failed: closed dirty and taken afresh (its copy rolled back to what
        # landed), the command read again and decided again.
        await wait_until(
            lambda: task.takes == 2 and task.state is TaskState.RUNNING,
            within=10,
            what=lambda: f"never taken afresh: {task.state} {task.takes} {node.node.health()}",
        )
        await wait_until(lambda: cmd.request_id in results(log), within=10)
        await wait_until(lambda: len(timer_rows(log)) == 1, within=10)
        assert node.node._failure is None
        assert node.runs()
        store = node.node.types[TOPICS.type_name].store
        ref = AggregateRef(context="mem", aggregate="counter", id=owner)
        assert await store.find(ref, "k") is not None
    finally:
        monkeypatch.undo()
        await node.stop()
