"""A partition's firing reaches the store through its partition's own handle (#19): a
firing started with one (`start_partition(store=PartitionStore(handle))`, as a node's task
starts it) loads, claims, writes outcomes and sweeps through it, never through the
runner's store; once its partition was let go (revoked, even if served again since for a
newer take) the handle refuses, and that firing alone stops (`PartitionFiring.fault`,
`Round.failed`) while the others fire on. A firing given no store uses the runner's, as
the seed's runner does. Fake clock, fake sender, both store backends."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fakes import T0, World, raw_store, until, world

from app.timers.runner import Round, SendResult, TimerRunner
from app.timers.runner.partition_store import PartitionStore, store_of
from app.timers.runner.stats import RoundStats
from tables import StoreClosed, Timer, TimerChange, TimerStatus
from tables.rules import OnceRule

__all__ = ["raw_store", "world"]  # the fixtures, imported for pytest

SOON = OnceRule(at=T0 + 50)


class SpyHandle:
    """A partition's handle of the store, its calls named as they come."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.partition: int = handle.partition
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        call = getattr(self.handle, name)

        async def spied(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return await call(*args, **kwargs)

        return spied


def own(world: World, p: int) -> tuple[PartitionStore, SpyHandle]:
    """A store of `p`'s own, as a node's task takes `p` (after its restore)."""
    spy = SpyHandle(world.store.inner.partition(p))
    return PartitionStore(spy), spy


async def let_go(world: World, p: int) -> None:
    """`p` revoked and served again (a newer take's): the handles made before are refused."""
    await world.store.inner.revoke({p})
    await world.store.inner.assign({p})


def started(
    world: World, own_stores: dict[int, PartitionStore], plain: tuple[int, ...] = ()
) -> TimerRunner:
    runner = world.runner(partitions=())
    for p, store in own_stores.items():
        runner.start_partition(p, store=store)
    for p in plain:
        runner.start_partition(p)
    return runner


async def one_round(runner: TimerRunner, p: int) -> Round:
    """A round of partition `p`, its claims committed (as its node's task would)."""
    async with runner.partition_round(p) as r:
        r.claims_committed(r.to_commit)
    return r


def refused(r: Round) -> list[int]:
    faults = []
    for p, (_firing, exc) in sorted(r.failed.items()):
        assert isinstance(exc, StoreClosed) and exc.partition == p, exc
        faults.append(p)
    return faults


async def test_a_partitions_rounds_reach_the_store_through_its_own_handle_alone(
    world: World,
) -> None:
    await world.put(id="a", key="a", partition=0)
    store, spy = own(world, 0)
    runner = started(world, {0: store})
    r = await one_round(runner, 0)
    assert r.stats.claimed == 1 and r.failed == {}
    await until(lambda: world.sender.request_ids == ["a#0"] and not runner.in_flight)
    await one_round(runner, 0)  # its outcome written
    assert (await world.row("a")).status is TimerStatus.FIRED
    assert {"due_rows", "firing", "settle", "expire"} <= set(spy.calls)
    # Not one call of the runner's store: loads, claims, outcome, take-over, sweep.
    assert world.store.due_calls == [] and world.store.settle_calls == []
    assert world.store.firing_calls == []
    assert world.store.find_calls == 0


async def test_a_firing_whose_partition_was_let_go_claims_nothing_and_stops_alone(
    world: World,
) -> None:
    await world.put(id="a", key="a", partition=0, rule=SOON)
    await world.put(id="b", key="b", partition=1, rule=SOON)
    (s0, _), (s1, _) = own(world, 0), own(world, 1)
    runner = started(world, {0: s0, 1: s1})
    for p in (0, 1):
        assert (await one_round(runner, p)).stats.loaded == 0  # in the wheels, not due
    await let_go(world, 0)  # served again, for a newer take: not this firing's
    world.clock.set(T0 + 50)
    r = await one_round(runner, 0)  # its claim refused by its handle
    assert refused(r) == [0] and r.stats.claimed == 0
    assert (await world.row("a")).status is TimerStatus.PENDING
    r = await one_round(runner, 1)
    assert r.failed == {} and r.stats.claimed == 1
    await until(lambda: world.sender.request_ids == ["b#0"] and not runner.in_flight)
    await one_round(runner, 1)
    assert (await world.row("b")).status is TimerStatus.FIRED
    # Stopped (loaded no more) until its owner starts it again with a new take's handle.
    firing = runner.firing_of(0)
    assert firing is not None and not firing.live
    assert refused(await one_round(runner, 0)) == [0]
    await runner.stop_partition(0)
    s0, _ = own(world, 0)
    runner.start_partition(0, store=s0)
    assert (await one_round(runner, 0)).stats.claimed == 1
    await until(lambda: world.sender.request_ids == ["b#0", "a#0"])


async def test_a_firing_whose_store_is_let_go_before_its_load_stops_alone(
    world: World,
) -> None:
    await world.put(id="a", key="a", partition=0)
    await world.put(id="b", key="b", partition=1)
    (s0, _), (s1, _) = own(world, 0), own(world, 1)
    runner = started(world, {0: s0, 1: s1})
    await let_go(world, 0)
    r = await one_round(runner, 0)  # its load refused
    assert refused(r) == [0] and r.stats.loaded == 0
    assert (await one_round(runner, 1)).stats.claimed == 1
    await until(lambda: world.sender.request_ids == ["b#0"])


async def test_an_outcome_of_a_firing_let_go_while_it_was_sent_is_refused(
    world: World,
) -> None:
    answer: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()

    async def held_in_0(timer: Timer) -> SendResult:
        return await answer if timer.partition == 0 else SendResult("COMMITTED")

    await world.put(id="a", key="a", partition=0)
    await world.put(id="b", key="b", partition=1)
    (s0, _), (s1, _) = own(world, 0), own(world, 1)
    runner = started(world, {0: s0, 1: s1})
    world.sender.script = held_in_0
    for p in (0, 1):
        assert (await one_round(runner, p)).stats.claimed == 1
    await until(lambda: sorted(world.sender.request_ids) == ["a#0", "b#0"])
    await let_go(world, 0)
    answer.set_result(SendResult("COMMITTED"))
    await until(lambda: not runner.in_flight)
    assert refused(await one_round(runner, 0)) == [0]
    # Its claim stays as it was: the newer take's firing takes it over.
    assert (await world.row("a")).status is TimerStatus.FIRING
    assert (await one_round(runner, 1)).failed == {}
    assert (await world.row("b")).status is TimerStatus.FIRED


async def test_the_seeds_round_writes_each_partitions_part_through_its_own_store(
    world: World,
) -> None:
    """Firings with and without stores of their own in one round (`round`): each part
    goes to its own, and only the partition whose handle is refused stops."""
    for p, id in enumerate("abc"):
        await world.put(id=id, key=id, partition=p, rule=SOON)
    (s0, _), (s1, spy1) = own(world, 0), own(world, 1)
    runner = started(world, {0: s0, 1: s1}, plain=(2,))
    assert (await runner.run_round()).loaded == 0  # in the wheels, not due
    await let_go(world, 0)
    world.clock.set(T0 + 50)
    async with runner.round() as r:
        r.claims_committed(r.to_commit)
    assert refused(r) == [0] and r.stats.claimed == 2
    await until(lambda: sorted(world.sender.request_ids) == ["b#0", "c#0"])
    await until(lambda: not runner.in_flight)
    stats: RoundStats = await runner.run_round()
    assert stats.written == 2
    assert [(await world.row(k)).status for k in "abc"] == [
        TimerStatus.PENDING,
        TimerStatus.FIRED,
        TimerStatus.FIRED,
    ]
    assert "settle" in spy1.calls
    # The runner's store wrote partition 2's rows alone.
    assert {c.loaded.partition for calls in world.store.settle_calls for c in calls} == {2}


async def parked(world: World, id: str, p: int) -> Timer:
    """A timer of `p` put, then PARKED by a conditional write, as the runner parks."""
    loaded = await world.put(id=id, key=id, partition=p)
    row = loaded.model_copy(update={"status": TimerStatus.PARKED, "attempts": 5})
    assert await world.store.inner.settle([TimerChange(loaded=loaded, next=row)]) == 1
    return row


async def test_an_operators_retry_in_a_partition_goes_through_its_own_store(
    world: World,
) -> None:
    a = await parked(world, "a", 0)
    await parked(world, "b", 1)
    (s0, spy0), (s1, _) = own(world, 0), own(world, 1)
    runner = started(world, {0: s0, 1: s1})
    assert await runner.retry(a.target, partitions={0}) == 1
    assert {"parked", "settle"} <= set(spy0.calls) and world.store.settle_calls == []
    assert (await world.row("a")).status is TimerStatus.PENDING
    await let_go(world, 1)  # refused: nothing of it is written
    with pytest.raises(StoreClosed):
        await runner.retry(a.target, partitions={1})
    assert (await world.row("b")).status is TimerStatus.PARKED


async def test_a_partitions_own_store_refuses_another_partitions_call(world: World) -> None:
    store, _ = own(world, 0)
    with pytest.raises(ValueError, match=r"\[1\] asked of partition 0"):
        await store.due_rows({1}, T0, 10)
    assert await store.due_rows(set(), T0, 10) == []
    with pytest.raises(ValueError, match=r"\[1\] asked of partition 0"):
        await store.expire(1, T0, 0, 10)


def test_a_call_of_one_firing_goes_to_its_own_store_and_one_of_several_to_each() -> None:
    class F:
        def __init__(self, partition: int, store: Any) -> None:
            self.partition, self.store = partition, store

    default: Any = object()
    mine: Any = object()
    assert store_of([F(0, None), F(1, None)], default) is default
    assert store_of([F(0, mine)], default) is mine
    routed = store_of([F(0, mine), F(1, None)], default)
    assert routed is not mine and routed is not default
    assert store_of([F(0, mine)], default, others=True) is not mine


async def test_a_lookup_over_several_stores_asks_the_rows_own_partition_alone(
    world: World,
) -> None:
    """The seed's round finds a row (a claim's retry after a part failed) through the
    row's own partition: another partition let go does not refuse it."""
    a = await world.put(id="a", key="a", partition=0, rule=SOON)
    b = await world.put(id="b", key="b", partition=1, rule=SOON)
    (s0, spy0), (s1, _) = own(world, 0), own(world, 1)
    firings: Any = [type("F", (), {"partition": p, "store": s})() for p, s in ((1, s1), (0, s0))]
    routed = store_of(firings, world.store)
    await let_go(world, 1)
    found = await routed.find(a.owner, "a")
    assert found is not None and found.id == "a" and "find" in spy0.calls
    with pytest.raises(StoreClosed):  # its own partition's lookup is refused, as before
        await routed.find(b.owner, "b")


async def test_a_take_whose_partition_is_still_fired_by_an_earlier_take_fails(
    world: World,
) -> None:
    s0, _ = own(world, 0)
    runner = started(world, {0: s0})
    assert runner.start_partition(0, store=s0).store is s0  # the same take: nothing to do
    await let_go(world, 0)
    newer, _ = own(world, 0)
    with pytest.raises(RuntimeError, match="still fired by an earlier take"):
        runner.start_partition(0, store=newer)
