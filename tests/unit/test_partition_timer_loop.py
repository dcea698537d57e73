"""A partition task's timer loop (`PartitionTimerLoop`) on a fake clock and store: a fault
of its firing always reaches its task, even from a round that raised before it could say
so; and rows due that its share of the sends has no room for never make it spin (the
clock never moves here: a round after the first is a wake-up or a spin)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from fakes import PARTITIONS, T0, TARGET, World, make_timer, never, raw_store, world

from app.node.commits import Commits
from app.node.cycles import PartitionCycles
from app.node.partition_timers import PartitionTimerLoop, TypeLoops
from app.node.task_id import TaskId
from app.timers.runner import InProcessTargets, TimerRunner
from tables import AggregateRef, OnceRule, StoreError
from tables.partitioner import partition_of

__all__ = ["raw_store", "world"]  # the fixtures, imported for pytest

TURNS = 500
"""Loop turns given to a loop that must wait (a spinning one runs a round every few)."""


class _Commits:
    def landed(self, kept: object, p: int) -> int:
        return 0

    def running(self, kept: object, p: int) -> None:
        return None  # no commit in flight

    async def commit_claims(self, kept: object, partitions: set[int]) -> None:
        pass


class _Cycles:
    def fire_local(self, type_name: str, p: int) -> None:
        pass


class _Task:
    def __init__(self, firing: Any) -> None:
        self.firing = firing
        self.told: list[str] = []
        self.worked_of: list[str] = []

    def failed(self, what: str, exc: BaseException) -> None:
        self.told.append(f"{what}: {exc}")

    def worked(self, what: str) -> None:
        self.worked_of.append(what)


def loop_of(runner: TimerRunner, p: int) -> tuple[PartitionTimerLoop, _Task]:
    firing = runner.firing_of(p)
    assert firing is not None
    task = _Task(firing)
    return loop_for(runner, task), task


def loop_for(runner: TimerRunner, task: Any) -> PartitionTimerLoop:
    """A loop of the partition of `task.firing`, its task `task`, of type `order`."""
    shared = TypeLoops(
        runner,
        type_name="order",
        types=cast(Any, {"order": object()}),
        commits=cast(Commits, _Commits()),
        cycles=cast(PartitionCycles, _Cycles()),
        running={TaskId("order", task.firing.partition): task},
    )
    return PartitionTimerLoop(shared, task.firing, task)


async def turns(n: int = TURNS) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


@pytest.mark.parametrize("due", [30, 150, 2_500])
async def test_rows_due_beyond_its_share_of_the_sends_do_not_make_it_go_again(
    world: World, due: int
) -> None:
    for i in range(due):
        await world.put(id=f"a-{i:04d}", key=f"a{i:04d}", partition=0)
    # 2 partitions, 4 sends: a share of 2, its sends never answered, the rest left due
    runner = world.runner(never, partitions=[0, 1], batch_limit=50, max_in_flight=4)
    loop, _ = loop_of(runner, 0)
    loop.start()
    await turns()
    rounds, loads = loop.rounds, len(world.store.due_calls)
    await runner.stop_all()
    await loop.stop()
    assert runner.in_flight == 0
    assert rounds == 1, f"{rounds} rounds ({loads} loads) with the clock stopped: it spins"


async def test_a_fault_its_round_raised_past_reaches_its_task(world: World) -> None:
    await world.put()
    runner = world.runner(partitions=[])
    runner.start_partition(0)  # fresh: a previous owner's claims are taken over first
    firing = runner.firing_of(0)
    assert firing is not None
    loop, task = loop_of(runner, 0)

    async def corrupt_then_raise(*args: Any, **kwargs: Any) -> Any:
        firing.fail(StoreError("corrupt row", partition=0))  # as a row built apart does
        raise RuntimeError("the store call failed")  # ... before the round could say so

    world.store.firing = corrupt_then_raise  # type: ignore[method-assign]
    loop.start()
    await turns(50)
    assert loop.rounds >= 1 and not task.told  # the round raised: nothing said yet
    world.clock.advance(runner.options.poll_interval_ms)  # the next round
    await turns(50)
    assert task.told == ["the timer store of order: corrupt row"]
    assert not loop.running  # it ends: the task's revival starts a firing of its own


async def test_a_timer_due_later_still_wakes_it_while_its_sends_are_full(world: World) -> None:
    # Its sends full (a target that never answers) leave remote rows due it cannot send:
    # no round at once for them, but a timer of its own due later is handed on time.
    p = partition_of(TARGET.id, PARTITIONS)
    elsewhere = AggregateRef(context="shop", aggregate="invoice", id="x")
    for i in range(4):  # sent, due now
        remote = make_timer(id=f"r-{i}", key=f"r{i}", partition=p)
        assert await world.store.inner.put(remote.model_copy(update={"target": elsewhere}))
    await world.put(id="l-1", key="l1", partition=p, rule=OnceRule(at=T0 + 30))
    runner = world.runner(never, partitions=[], max_in_flight=2, poll_interval_ms=100)
    in_process = InProcessTargets(TARGET.context, TARGET.aggregate, PARTITIONS)
    firing = runner.start_partition(p, in_process=in_process)
    firing.fresh = False
    loop, _ = loop_of(runner, p)
    loop.start()
    await turns()
    assert loop.rounds == 1 and not firing.handed
    world.clock.advance(30)
    await turns()
    handed = [t.id for t in firing.handed]
    await runner.stop_all()
    await loop.stop()
    assert handed == ["l-1"], "the timer due at T0+30 waited for the poll interval"
