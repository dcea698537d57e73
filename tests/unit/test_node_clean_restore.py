"""A node stopped cleanly and started again on its data reads its timer table on from the
last timer row its commits landed (`TimerStore.applied_through`), not from its last
restore: before, a clean copy read every row written since it was last restored (all of
them, for a node that ran for long), which is about a whole restore again."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fakes import RunningNode, wait_until
from test_node_memory import PARTITIONS, SERVICE, TOPICS, events, schedule

from app.kafka.memory import MemoryLog

TIMERS = 20


@pytest.fixture
async def log() -> AsyncIterator[MemoryLog]:
    yield MemoryLog()


def rows_written(log: MemoryLog) -> int:
    return sum(len(log.records(TOPICS.timers_changelog, p)) for p in range(PARTITIONS))


def timer_rows_restored(node: RunningNode) -> float:
    registry = node.node.metrics.registry
    return sum(
        registry.get_sample_value(
            "tickwheel_restore_records_read",
            {"type": TOPICS.type_name, "partition": str(p), "store": "timers"},
        )
        or 0.0
        for p in range(PARTITIONS)
    )


async def test_a_clean_restart_reads_the_changelog_on_from_its_last_commit(
    log: MemoryLog, tmp_path: Path
) -> None:
    first = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(first.runs)
        now = int(time.time() * 1000)
        for i in range(TIMERS):
            await schedule(log, f"o{i}", now)
        await wait_until(lambda: len(events(log, "Fired")) == TIMERS)
        # Every timer's rows (PENDING, then FIRED) committed.
        await wait_until(lambda: rows_written(log) >= 2 * TIMERS)
    finally:
        await first.stop()  # a clean close: each partition's copy marked clean
    written = rows_written(log)
    assert written >= 2 * TIMERS

    again = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(again.runs)
        # The offsets read: at most each partition's last commit marker, not its rows.
        assert timer_rows_restored(again) <= PARTITIONS, f"read again of {written} rows"
        # And the table is whole: a timer set now fires, none of the old ones again.
        await schedule(log, "late", int(time.time() * 1000))
        await wait_until(lambda: len(events(log, "Fired")) == TIMERS + 1)
    finally:
        await again.stop()
    fired = [e.aggregate.id for e in events(log, "Fired")]
    assert len(fired) == len(set(fired)) == TIMERS + 1
