"""A revoked task's clean close whose timer firing the store failed in (#19's review): its
last outcome writes met a corrupt row, or the fault came in a round whose end (which
fails the task) the revoke overtook. What its transactions hold still commits, but its
local copy is not marked clean: the next take here restores it from its changelog rather
than reading on from a copy known to hold a corrupt row."""

from __future__ import annotations

import asyncio
import contextlib
import errno
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fakes import RunningNode, wait_until
from test_node_memory import PARTITIONS, SERVICE, TOPICS, task_of

from app.kafka.memory import MemoryLog
from app.timers.runner import RoundStats, TimerRunner
from tables import StoreError


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[RunningNode]:
    n = await RunningNode(MemoryLog(), tmp_path, "a", SERVICE, PARTITIONS).start()
    yield n
    await n.stop()


@pytest.mark.parametrize("faulted", [True, False])
async def test_a_clean_close_of_a_firing_the_store_failed_in_is_not_marked_clean(
    node: RunningNode, monkeypatch: pytest.MonkeyPatch, faulted: bool
) -> None:
    await wait_until(node.runs)
    kept = node.node.types[TOPICS.type_name]
    firing = node.node._tasks[task_of(0)].firing
    assert firing is not None
    stop = TimerRunner.stop_partition

    async def stop_meeting_a_corrupt_row(runner: TimerRunner, p: int) -> RoundStats:
        if faulted and p == 0:
            firing.fail(StoreError("the stored row 'r' of partition 0 is no Timer", partition=0))
        return await stop(runner, p)

    monkeypatch.setattr(TimerRunner, "stop_partition", stop_meeting_a_corrupt_row)
    await asyncio.wait_for(node.node._revoked({(TOPICS.events, 0)}), 5)
    assert firing.stopped and 0 not in kept.store.assigned
    assert kept.marks._path(0).exists() is not faulted
    assert node.node._failure is None


async def test_a_clean_mark_that_cannot_be_written_still_releases_the_states(
    node: RunningNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk as the close marks the copy clean: the mark's error skipped the rest of
    the close (the partition's aggregate states never released). It is now one of the
    close's failures, said, and the close goes on."""
    await wait_until(node.runs)
    kept = node.node.types[TOPICS.type_name]
    assert kept.states is not None
    released: list[int] = []
    release = kept.states.release

    def full_disk(p: int, in_step_at: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    def spied(p: int) -> None:
        released.append(p)
        release(p)

    monkeypatch.setattr(kept.marks, "mark", full_disk)
    monkeypatch.setattr(kept.states, "release", spied)
    with contextlib.suppress(Exception):
        await asyncio.wait_for(node.node._revoked({(TOPICS.events, 0)}), 5)
    await wait_until(lambda: released == [0], within=5)
    assert not kept.marks._path(0).exists()
