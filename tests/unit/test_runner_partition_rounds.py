"""Each partition's rounds are its own (#19): a partition's round loads, slices, claims,
sends and sweeps its own rows, under its own lock, with its own share of the sends, so
that a store call of one partition that hangs, a burst in one, or sends of one that are
not answered hold no other partition's round, first fire or sends up. Fake clock, fake
sender, both store backends; the seed's round over all partitions is tested elsewhere
(`test_runner_*`), unchanged."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Set

from fakes import World, always, make_timer, never, raw_store, until, world

from app.timers.runner import SendResult, TimerRunner
from app.timers.runner.stats import RoundStats
from tables import DueRow, Timer, TimerStatus

__all__ = ["raw_store", "world"]  # the fixtures, imported for pytest


async def one_round(runner: TimerRunner, p: int) -> RoundStats:
    """A round of partition `p`, its claims committed (as its node's task would)."""
    async with runner.partition_round(p) as r:
        r.claims_committed(r.to_commit)
    return r.stats


def answered(runner: TimerRunner, p: int) -> Callable[[], bool]:
    """Whether a send of `p`'s was answered since its firing started."""
    firing = runner.firing_of(p)
    assert firing is not None
    return firing.answered.is_set


async def test_a_partition_whose_store_call_hangs_holds_no_other_partitions_round(
    world: World,
) -> None:
    await world.put(id="a", key="a", partition=0)
    await world.put(id="b", key="b", partition=1)
    runner = world.runner(partitions=[0, 1])
    entered, release = asyncio.Event(), asyncio.Event()
    due_rows = world.store.due_rows

    async def hanging(partitions: Set[int], until: int, limit: int) -> list[DueRow]:
        if 0 in partitions:
            entered.set()
            await release.wait()
        return await due_rows(partitions, until, limit)

    world.store.due_rows = hanging  # type: ignore[method-assign]
    first = asyncio.create_task(one_round(runner, 0))
    await until(entered.is_set)  # partition 0's load hangs, its round lock held
    stats = await one_round(runner, 1)
    assert stats.claimed == 1
    await until(answered(runner, 1))
    assert [t.key for t in world.sender.timers] == ["b"]
    await one_round(runner, 1)  # its outcome written
    assert (await world.row("b")).status is TimerStatus.FIRED
    assert not first.done() and (await world.row("a")).status is TimerStatus.PENDING
    release.set()
    assert (await first).claimed == 1
    await until(lambda: sorted(t.key for t in world.sender.timers) == ["a", "b"])


async def test_a_burst_in_one_partition_never_slices_anothers_round(world: World) -> None:
    for i in range(300):
        await world.put(id=f"a-{i:03d}", key=f"a{i:03d}", partition=0)
    for i in range(3):
        await world.put(id=f"b-{i}", key=f"b{i}", partition=1)
    runner = world.runner(partitions=[0, 1], batch_limit=200)
    burst = await one_round(runner, 0)
    # two partitions fired: each burst's first slice is half a round's (32 / 2)
    assert (burst.claimed, burst.full) == (16, True), "p0's burst: its first slice"
    firing = runner.firing_of(0)
    assert firing is not None and firing.rounds.bursting and not runner.bursting
    steady = await one_round(runner, 1)
    assert (steady.claimed, steady.full) == (3, False), "p1's rows, all at once"
    other = runner.firing_of(1)
    assert other is not None and not other.rounds.bursting
    assert (await one_round(runner, 0)).claimed == 32, "p0's slice doubles on its own"
    loads = [partitions for partitions, _, _ in world.store.due_calls]
    assert loads == [frozenset({0}), frozenset({1})], "each partition loads its own rows"


async def test_a_partition_whose_sends_hang_keeps_to_its_share_of_them(world: World) -> None:
    for i in range(6):
        await world.put(id=f"a-{i}", key=f"a{i}", partition=0)
    await world.put(id="b", key="b", partition=1)
    answer = always("COMMITTED")

    async def hangs_in_0(timer: Timer) -> SendResult:
        if timer.partition == 0:
            return await never(timer)
        return answer(timer)  # type: ignore[return-value]

    runner = world.runner(hangs_in_0, partitions=[0, 1], max_in_flight=4)
    assert runner.share == 2
    stats = await one_round(runner, 0)
    assert (stats.claimed, stats.deferred) == (2, 4), "its share of 4 sends: 2"
    assert (await one_round(runner, 0)).claimed == 0, "its sends hang: none more claimed"
    assert (await one_round(runner, 1)).claimed == 1, "p1 sends all the same"
    await until(answered(runner, 1))
    await one_round(runner, 1)
    assert (await world.row("b")).status is TimerStatus.FIRED
    assert runner.in_flight == 2
    await runner.stop_all()  # p0's sends cut short, their claims given back
    assert (await world.row("a0")).status is TimerStatus.PENDING


async def test_a_partition_round_of_a_firing_stopped_or_replaced_does_nothing(
    world: World,
) -> None:
    await world.put()
    runner = world.runner(partitions=[0])
    old = runner.firing_of(0)
    await runner.stop_partition(0)
    new = runner.start_partition(0)
    async with runner.partition_round(0, of=old) as r:
        assert not r.owned, "the round of a firing stopped claims nothing"
    assert world.sender.timers == []
    assert (await one_round(runner, 0)).claimed == 1 and new is runner.firing_of(0)
    await until(answered(runner, 0))
    assert [t.id for t in world.sender.timers] == [make_timer().id]
