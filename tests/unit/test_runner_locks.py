"""The runner's locks are per partition, and none is held across a ledger call (#19): a
partition's claims, outcome writes and stop never wait on another partition's ledger
call (a park's record, an operator's resolve: up to 10 s on Kafka); and an operator's
request that resolves a target while one of its parks is under way leaves no PARKED timer
that no ledger entry names. Fake clock, scripted sender, both store backends."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from fakes import (
    SpyLedger,
    World,
    always,
    make_timer,
    raw_store,
    until,
    world,
)

from app.timers.runner import SendResult, TimerRunner
from tables.refs import AggregateRef
from tables.timer import Outcome, Timer, TimerStatus

__all__ = ["raw_store", "world"]  # the fixtures, imported for pytest


class HeldLedger(SpyLedger):
    """A ledger whose `record` (once `hold_record`) or `resolve` (once `hold_resolve`)
    waits for `release` after doing its work, as a slow broker's acknowledgement would."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self.hold_record = False
        self.hold_resolve = False
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def record(
        self, subscription: str, target: AggregateRef, timers: Sequence[Timer]
    ) -> None:
        await super().record(subscription, target, timers)
        if self.hold_record:
            self.entered.set()
            await self.release.wait()

    async def resolve(self, subscription: str, target: AggregateRef) -> bool:
        resolved = await super().resolve(subscription, target)
        if self.hold_resolve:
            self.entered.set()
            await self.release.wait()
        return resolved


def held(world: World) -> HeldLedger:
    world.ledger = ledger = HeldLedger(world.store.inner)
    return ledger


def parks_in_0(timer: Timer) -> SendResult:
    """Partition 0's timer fails (and parks at once), the others' are committed."""
    return SendResult("ERROR" if timer.partition == 0 else "COMMITTED")


async def test_outcomes_and_a_stop_of_one_partition_never_wait_on_anothers_park(
    world: World,
) -> None:
    ledger = held(world)
    ledger.hold_record = True
    await world.put(id="a", key="a", partition=0)
    await world.put(id="b", key="b", partition=1)
    runner = world.runner(parks_in_0, partitions=[0, 1], retry={"max_attempts": 1})
    round_ = asyncio.create_task(runner.run_round())
    await until(ledger.entered.is_set)  # partition 0's park waits on the ledger
    # Partition 1's outcome is written meanwhile, and its stop returns.
    assert (await world.row("b")).status is TimerStatus.FIRED
    stop = asyncio.create_task(runner.stop_partition(1))
    await until(stop.done)
    assert runner.partitions == frozenset({0})
    # The park's row is written only once the ledger holds its target.
    assert (await world.row("a")).status is TimerStatus.FIRING
    ledger.release.set()
    stats = await round_
    assert (stats.fired, stats.parked) == (1, 1)
    assert (await world.row("a")).status is TimerStatus.PARKED


async def test_an_operators_resolve_holds_no_other_partitions_claims_outcomes_or_stop(
    world: World,
) -> None:
    ledger = held(world)
    await world.put(id="a", key="a", partition=0)
    runner = world.runner(always("ERROR"), partitions=[0, 1], retry={"max_attempts": 1})
    assert (await runner.run_round()).parked == 1
    ledger.hold_resolve = True
    retry = asyncio.create_task(runner.retry(make_timer().target, partitions={0}))
    await until(ledger.entered.is_set)  # resolving the entry, its row already retried
    assert (await world.row("a")).status is TimerStatus.PENDING
    # Partition 1's timer is claimed, sent and its outcome written meanwhile.
    world.sender.script = always("COMMITTED")
    runner.offer([await world.put(id="b", key="b", partition=1)])  # as a node's put does
    round_ = asyncio.create_task(runner.run_round())
    await until(round_.done)
    assert (await round_).fired == 1 and (await world.row("b")).outcome is Outcome.COMMITTED
    stop = asyncio.create_task(runner.stop_partition(1))
    await until(stop.done)
    ledger.release.set()
    assert await retry == 1
    assert await ledger.entries() == []


async def test_a_target_resolved_while_one_of_its_parks_is_under_way_keeps_an_entry(
    world: World,
) -> None:
    """The park records the target, then (the ledger slow to answer) an operator's retry
    finds no PARKED row yet and resolves the entry; the park's row is written after. The
    retry waits for that park and records the target again: its PARKED row is named."""
    ledger = held(world)
    ledger.hold_record = True
    await world.put(id="a", key="a", partition=0)
    runner: TimerRunner = world.runner(always("ERROR"), retry={"max_attempts": 1})
    round_ = asyncio.create_task(runner.run_round())
    await until(ledger.entered.is_set)
    ledger.hold_record = False  # the retry's own record answers at once
    target = make_timer().target
    retry = asyncio.create_task(runner.retry(target, partitions={0}))
    await until(lambda: ledger._entries == {})  # resolved while the park waits
    ledger.release.set()
    assert await retry == 0, "nothing was PARKED when it looked"
    await round_
    row = await world.row("a")
    assert row.status is TimerStatus.PARKED
    entries = await ledger.entries()
    assert [(e.target, e.timers) for e in entries] == [(target, ("a#0",))]
