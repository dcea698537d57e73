"""The runner's sweep: each round, one owned partition's finished rows past their
retention are deleted (fake clock, both store backends, as `test_runner_partition`)."""

from __future__ import annotations

import pytest
from fakes import MIN, World, make_timer, raw_store, world

from app.timers.runner import TimerOptions
from tables.timer import TimerStatus

__all__ = ["raw_store", "world"]  # the fixtures, imported for pytest

DAY = 24 * 60 * MIN


async def test_a_fired_timer_is_deleted_once_its_retention_is_over(world: World) -> None:
    await world.put()
    runner = world.runner(finished_retention=2 * DAY)
    assert (await runner.run_round()).fired == 1
    fired = await world.row()
    assert fired.status is TimerStatus.FIRED
    world.clock.advance(2 * DAY - MIN)
    assert (await runner.run_round()).swept == 0, "within its retention: kept"
    assert await world.store.inner.find(fired.owner, fired.key) == fired
    world.clock.advance(2 * MIN)
    assert (await runner.run_round()).swept == 1
    assert await world.store.inner.find(fired.owner, fired.key) is None


async def test_one_partition_a_round_in_turn_at_most_the_limit(world: World) -> None:
    for n in range(5):
        await world.put(id=f"t-{n}", key=f"k{n}", partition=n % 2)
    runner = world.runner(partitions=(0, 1), finished_retention=2 * DAY, sweep_limit=2)
    await runner.run_round()
    assert sum([(await world.row(f"k{n}")).status is TimerStatus.FIRED for n in range(5)]) == 5
    world.clock.advance(3 * DAY)
    swept = [(await runner.run_round()).swept for _ in range(4)]
    # Partition 0 holds 3 (k0, k2, k4), partition 1 holds 2 (k1, k3); the firing round
    # took partition 0's turn: turns 1, 0, 1, 0.
    assert swept == [2, 2, 0, 1]
    for n in range(5):
        assert await world.store.inner.find(make_timer().owner, f"k{n}") is None


async def test_a_sweep_that_fails_is_logged_and_the_round_goes_on(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    await world.put()
    runner = world.runner(finished_retention=2 * DAY)
    await runner.run_round()
    world.clock.advance(3 * DAY)
    await world.put(id="t-2", key="later")  # due 3 days ago: expired by the round

    async def refused(*_: object) -> int:
        raise OSError("store unavailable")

    world.store.expire = refused  # type: ignore[method-assign,assignment]
    stats = await runner.run_round()
    assert stats.swept == 0 and stats.expired == 1, "the round decided its timers"
    assert "sweeping partition 0's finished timers failed" in caplog.text
    assert (await world.row()).status is TimerStatus.FIRED, "kept: swept on a later turn"


def test_the_retention_must_exceed_expires_after() -> None:
    with pytest.raises(ValueError, match="finished_retention"):
        TimerOptions(expires_after=DAY, finished_retention=DAY)
    assert TimerOptions().finished_retention == 7 * DAY
