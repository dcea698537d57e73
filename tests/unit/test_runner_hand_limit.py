"""A partition's cycle behind its rounds (a burst fired in-process): its rounds hand it no
more than `hand_limit` timers at a time, never load and build those in hand again, and
take again as soon as its outcomes bring it under the limit.

The fakes of `fakes` (fake clock, both store backends), as `test_runner_partition`.
"""

from __future__ import annotations

from fakes import FakeLocal, World, raw_store, world
from test_runner_partition import runner_with

from app.timers.runner import PartitionFiring, SendResult, TimerLoop, TimerRunner
from app.timers.runner.claiming import hand_limit
from tables.timer import TimerStatus

__all__ = ["raw_store", "world"]  # the fixtures, imported for pytest

TIMERS = 10
BATCH = 2  # a round's limit: two rounds' worth in hand at most


async def _due_in_process(world: World) -> tuple[TimerRunner, FakeLocal, PartitionFiring]:
    """`TIMERS` timers due, fired in-process, by a runner of a round's limit `BATCH`."""
    for i in range(TIMERS):
        await world.put(id=f"t-{i}", key=f"k{i}")
    local = FakeLocal()
    runner = runner_with(world, local, batch_limit=BATCH)
    firing = runner.firing_of(0)
    assert firing is not None
    return runner, local, firing


async def test_a_cycle_behind_its_rounds_is_handed_at_most_its_limit_each_built_once(
    world: World,
) -> None:
    runner, local, firing = await _due_in_process(world)
    limit = hand_limit(runner.options)
    assert limit == 2 * BATCH
    loaded = 0
    for _ in range(6):
        # The wheel loaded again each round (as a cycle's wake or a reschedule asks): the
        # rows in hand are still PENDING in the store, and come back with every load.
        runner.invalidate()
        loaded += (await runner.run_round()).loaded
    assert loaded == limit, "the rows in hand are never loaded and built again"
    assert len(firing.in_hand) == limit, "no more handed while the cycle is behind"

    # The cycle catches up: the round is woken at once, and takes the next ones.
    taken = await runner.still_due(local.fired)
    assert len(taken) == limit
    firing.answered.clear()
    await runner.record_outcomes([(t, SendResult("COMMITTED")) for t in taken[:-1]])
    assert firing.answered.is_set(), "under its limit again: its round is woken"
    fired = {t.id for t in taken[:-1]}
    left = [taken[-1]]
    while len(fired) < TIMERS:
        runner.invalidate()
        await runner.run_round()
        handed = await runner.still_due(runner.in_process_due(0))
        assert len(firing.in_hand) <= limit
        batch = left + handed
        await runner.record_outcomes([(t, SendResult("COMMITTED")) for t in batch])
        assert not fired & {t.id for t in batch}, "each fired once"
        fired |= {t.id for t in batch}
        left = []
    for i in range(TIMERS):
        assert (await world.row(f"k{i}")).status is TimerStatus.FIRED


async def test_a_held_up_partitions_round_waits_for_its_cycle_not_again_at_once(
    world: World,
) -> None:
    """Held up, its rounds take nothing: the next waits for the wake its cycle gives as it
    catches up (or the poll interval), in a partition's loop and in the seed's alike,
    never again at once (a round after round until the cycle caught up)."""
    runner, local, firing = await _due_in_process(world)
    while len(firing.in_hand) < hand_limit(runner.options):
        await runner.run_round()
    now = world.clock.now()
    async with runner.partition_round(0) as r:
        pass
    assert TimerLoop(runner)._next_round_at(r.stats) > now, "a partition's loop"
    assert TimerLoop(runner)._next_round_at(await runner.run_round()) > now, "the seed's"
    firing.answered.clear()
    runner.answered.clear()
    taken = await runner.still_due(local.fired)
    await runner.record_outcomes([(t, SendResult("COMMITTED")) for t in taken])
    assert firing.answered.is_set() and runner.answered.is_set(), "both woken"
