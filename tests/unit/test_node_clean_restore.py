"""A node stopped cleanly and started again on its data reads its timer table on from the
last timer row its commits landed (`TimerStore.applied_through`), not from its last
restore: before, a clean copy read every row written since it was last restored (all of
them, for a node that ran for long), which is about a whole restore again. A partition
whose commit failed rolls its table back to what its landed commits left
(`PartitionHandle.roll_back`) and reads on from there too: before, it was restored whole."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fakes import RunningNode, wait_until
from test_node_memory import PARTITIONS, SERVICE, TOPICS, events, schedule

from app.errors import KafkaUnavailable
from app.kafka.memory import MemoryLog
from tables import TimerStatus
from tables.partitioner import partition_of

TIMERS = 20


@pytest.fixture
async def log() -> AsyncIterator[MemoryLog]:
    yield MemoryLog()


def rows_written(log: MemoryLog) -> int:
    return sum(len(log.records(TOPICS.timers_changelog, p)) for p in range(PARTITIONS))


def restored_of(node: RunningNode, p: int) -> float:
    labels = {"type": TOPICS.type_name, "partition": str(p), "store": "timers"}
    registry = node.node.metrics.registry
    return registry.get_sample_value("tickwheel_restore_records_read", labels) or 0.0


def timer_rows_restored(node: RunningNode) -> float:
    return sum(restored_of(node, p) for p in range(PARTITIONS))


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


BAD = 0
OWNERS = [f"o{i}" for i in range(1, 999) if partition_of(f"o{i}", PARTITIONS) == BAD]


async def test_a_failed_commit_rolls_the_table_back_not_a_whole_restore(
    log: MemoryLog, tmp_path: Path
) -> None:
    """A commit of partition BAD fails once (its cycle had put timer rows in the table):
    the partition is let go dirty, and its table rolled back to what its landed commits
    left, so the retake reads on from its changelog (the aborted transaction's offsets),
    not the whole table again; the timers of the failed commit are set again from their
    commands, read again, and fire once each; the timers set before are all still there."""
    node = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(node.runs)
        later = int(time.time() * 1000) + 3_600_000
        kept = OWNERS[:30]
        for owner in kept:
            await schedule(log, owner, later)
        await wait_until(lambda: len(log.records(TOPICS.timers_changelog, BAD)) >= len(kept))
        failed: list[str] = []

        async def fail_once(tid: str) -> None:
            if tid.endswith(f".{BAD}") and not failed:
                failed.append(tid)
                raise KafkaUnavailable(f"{tid}: the transaction failed")

        log.before_commit = fail_once
        now = int(time.time() * 1000)
        due = OWNERS[30:33]
        for owner in due:
            await schedule(log, owner, now)
        await wait_until(lambda: len(events(log, "Fired")) == len(due), within=15)
        assert failed, "the commit failed"
        assert sorted(e.aggregate.id for e in events(log, "Fired")) == sorted(due)
        await wait_until(node.runs)
        read = restored_of(node, BAD)
        assert read < len(kept), f"restored whole: {read} offsets read"
        store = node.node.types[TOPICS.type_name].store
        assert store.status_counts(BAD)[TimerStatus.PENDING] == len(kept)
    finally:
        await node.stop()
