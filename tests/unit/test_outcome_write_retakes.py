"""A partition's outcome writes that keep failing (anything but `StoreError`): its task is
retaken after `FAILED_ROUNDS` such rounds, and a fault that never passes waits longer
before each retake (`retake_after`), as rounds that raise do. The claim and send rounds
between two failed writes pass: counted as the rounds' work, they forgot the failure each
time, and every retake (a whole restore) came at once (review finding F1)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fakes import OWNER, World, raw_store, world
from test_partition_timer_loop import loop_for

from app.node.failing import FailingPartitions, retake_after
from app.node.health import FAILING_IN_A_ROW

__all__ = ["raw_store", "world"]


class _Task:
    """As `PartitionTask` tells its `FailingPartitions` (`failed` -> `let_go`, `worked`)."""

    def __init__(self, firing: Any) -> None:
        self.firing = firing
        self.failing = FailingPartitions()
        self.calls: list[str] = []
        self.delays: list[float] = []

    def failed(self, what: str, exc: BaseException) -> None:
        self.calls.append("failed")
        f = self.failing.failed(self.firing.partition, {}, f"{what}: {exc}", what)
        self.delays.append(retake_after(f))

    def worked(self, what: str) -> None:
        if what.startswith("the timer rounds"):
            self.calls.append("worked")
        self.failing.worked(self.firing.partition, what)


async def until(cond: Any, n: int = 2000) -> None:
    for _ in range(n):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("never")


async def test_a_write_fault_that_never_passes_is_retaken_ever_later(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("app.node.partition_timers.FAILED_ROUNDS", 1)  # as the retake test
    world.store.fail_settle = lambda n: n % 2 == 0  # claims land; each outcome batch raises
    await world.put()
    runner = world.runner()
    task = _Task(runner.firing_of(0))
    for retake in range(1, 4):
        loop = loop_for(runner, task)  # a retake's new loop
        loop.start()
        await until(lambda: len(task.delays) == retake)  # noqa: B023
        await loop.stop()
        world.clock.set((await world.row()).due_at)  # the claim lapses: sent again
    # A fault that never passes waits longer before each retake (0, 0.5, 1 s).
    assert task.delays == [0.0, 0.5, 1.0], task.delays


async def test_a_write_fault_that_passed_is_forgotten_when_nothing_more_is_written(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fault passed, the timer cancelled meanwhile: no outcome is written again, and
    the partition's failure, counted apart, was kept for good (`/healthz` not ready after
    three takes). Forgotten once its rounds pass a claim's and a send's timeouts after the
    loop began (review finding)."""
    monkeypatch.setattr("app.node.partition_timers.FAILED_ROUNDS", 1)
    world.store.fail_settle = lambda n: n % 2 == 0
    await world.put()
    runner = world.runner()
    task = _Task(runner.firing_of(0))
    for retake in range(1, 4):
        loop = loop_for(runner, task)
        loop.start()
        await until(lambda: len(task.delays) == retake)  # noqa: B023
        await loop.stop()
        world.clock.set((await world.row()).due_at)
    assert task.failing.again_and_again(FAILING_IN_A_ROW)
    world.store.fail_settle = lambda n: False
    row = await world.row()
    assert await world.store.inner.cancel(OWNER, row.key, row.version + 1)
    loop = loop_for(runner, task)
    loop.start()
    await until(lambda: loop.rounds >= 1)
    assert task.failing.again_and_again(FAILING_IN_A_ROW), "not at once: it may still fail"
    options = runner.options
    world.clock.set(world.clock.now() + options.claim_timeout + options.send_timeout)
    loop.wake()
    await until(lambda: not task.failing.again_and_again(FAILING_IN_A_ROW))
    await loop.stop()
    assert task.failing.report() == {}
