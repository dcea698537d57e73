"""Events deleted from an aggregate's log after the group folded them (a retention, a
`kafka-delete-records`): a node that folds the log again (a fresh copy, here a new node)
folds only what is left, and its aggregates' versions may go back, so that a timer set
after that never fires (the timer table holds a higher version). Not in silence: an ERROR
names the log, the partition and how many records are gone."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from fakes import RunningNode, running, wait_until
from test_node_memory import PARTITIONS, SERVICE, TOPICS, results, schedule

from app.kafka.memory import MemoryLog
from tables.partitioner import partition_of


async def test_a_fold_from_past_the_logs_start_is_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = MemoryLog()
    p = partition_of("o1", PARTITIONS)
    async with running(RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS)) as a:
        await wait_until(a.runs)
        cmd = await schedule(log, "o1", int(time.time() * 1000) + 3_600_000)
        await wait_until(lambda: cmd.request_id in results(log))
        last = max(r.offset for r in log.records(TOPICS.events, p))
        await wait_until(lambda: (log.committed("g", TOPICS.events, p) or 0) > last)
    read = log.committed("g", TOPICS.events, p)
    assert read is not None
    log.delete_records(TOPICS.events, p, read)  # all of it read and folded already
    caplog.set_level(logging.ERROR, logger="app.commands")
    async with running(RunningNode(log, tmp_path, "b", SERVICE, PARTITIONS)) as b:
        await wait_until(b.runs)
        said = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        expected = (
            f"{TOPICS.events}[{p}]: the log starts at offset {read}, past offset 0 the "
            f"states fold from: up to {read} records were deleted unfolded"
        )
        assert any(m.startswith(expected) for m in said), said
