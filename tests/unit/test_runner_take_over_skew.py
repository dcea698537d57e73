"""A partition's new owner claims again at once every claim its previous owner left,
whatever its deadline: one written on a clock ahead of the new owner's (or before the wall
clock stepped back) lapses that far ahead, an hour say, and waited out, its timer fired an
hour late and was never overdue on the new owner's clock. A hunt: the take-over read the
claims lapsing within `claim_timeout` alone."""

from __future__ import annotations

import asyncio
import logging
from typing import cast

import pytest
from fakes import T0, World, raw_store, until, world

from app.timers.runner import TimerOptions, TimerRunner
from app.timers.runner.ports import FiringStore
from app.timers.runner.settling import taken_over
from tables.exceptions import StoreError
from tables.rules import OnceRule
from tables.timer import Timer, TimerChange, TimerStatus

__all__ = ["raw_store", "world"]

HOUR = 3_600_000


async def claimed_at(world: World, id: str, deadline: int) -> Timer:
    """`id`'s row, claimed by the partition's previous owner until `deadline`."""
    loaded = await world.put(id=id, key=id, partition=0)
    claim = loaded.model_copy(update={"status": TimerStatus.FIRING, "due_at": deadline})
    assert await world.store.inner.settle([TimerChange(loaded=loaded, next=claim)]) == 1
    return claim


def taking_over(world: World) -> TimerRunner:
    world.runner(partitions=())  # makes the world's sender
    runner = TimerRunner(world.store, world.sender, world.clock, world.ledger)
    runner.start_partition(0)  # fresh: a take-over
    return runner


async def test_a_claim_from_a_clock_an_hour_ahead_is_taken_over_at_once(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    await claimed_at(world, "ahead", T0 + HOUR + 30_000)  # claimed at T0 + 1 h
    await claimed_at(world, "here", T0 + 20_000)  # claimed 10 s ago on this clock
    await world.put(id="later", key="later", partition=0, rule=OnceRule(at=T0 + 2 * HOUR))
    runner = taking_over(world)
    with caplog.at_level(logging.WARNING, logger="app.timers.runner.settling"):
        stats = await runner.run_round()
    assert stats.claimed == 2
    await until(lambda: sorted(world.sender.request_ids) == ["ahead#0", "here#0"])
    [warning] = [r.getMessage() for r in caplog.records]
    assert warning.startswith("1 claims taken over lapse past claim_timeout (30000 ms)")
    assert f"up to {HOUR + 30_000} ms" in warning
    assert "or by a previous owner with a longer claim_timeout" in warning
    assert (await world.row("later")).status is TimerStatus.PENDING


async def test_a_claim_lapsed_already_is_taken_once_from_the_wheel(world: World) -> None:
    await claimed_at(world, "lapsed", T0 - 1)
    stats = await taking_over(world).run_round()
    assert stats.claimed == 1 and stats.lapsed == 1 and stats.lost_claims == 0
    await until(lambda: world.sender.request_ids == ["lapsed#0"])


class ScanningStore:
    """A store whose scans of claims answer at once (no await that yields), noting what
    each was asked; partition 1's row is corrupt."""

    def __init__(self) -> None:
        self.asked: list[set[int]] = []

    async def firing(self, partitions: set[int], limit: int) -> list[Timer]:
        self.asked.append(partitions)
        if 1 in partitions:
            raise StoreError("a corrupt row")
        return []


async def test_a_take_over_of_many_partitions_lets_the_event_loop_go_between_them() -> None:
    """Each fresh partition's claims are scanned apart, the event loop let go between two
    scans, a partition's fault its own. Before, every fresh partition's due index was
    scanned in one slice of the loop (a rebalance handing over hundreds of partitions held
    every other task that long)."""
    store = ScanningStore()
    scans_seen: list[int] = []

    async def meanwhile() -> None:
        scans_seen.append(len(store.asked))

    other = asyncio.create_task(meanwhile())
    decided, faults = await taken_over(cast(FiringStore, store), {2, 0, 1}, T0, TimerOptions())
    assert store.asked == [{0}, {1}, {2}] and scans_seen == [1]
    assert decided == [] and list(faults) == [1]
    await other
