"""A batch the store wrote only part of (#19 review): RocksDB writes a settle as one
WriteBatch per partition, so a batch across partitions can land in one and fail in the
next (`StoreError`: an I/O error, say). The runner then writes each partition's part apart
(`apart`): a part that had landed is refused by its own conditional write, yet it is
written, and its claims are sent in this round, not left to lapse unsent."""

from __future__ import annotations

from typing import Any

import pytest
from fakes import (
    PARTITIONS,
    T0,
    TARGET,
    FakeLocal,
    World,
    rocks,
    until,
)

from app.timers.runner import TimerRunner
from tables import StoreError
from tables.partitioner import partition_of
from tables.timer import TimerChange, TimerStatus

__all__ = ["rocks"]  # the fixture, imported for pytest


def failing_writes_to(world: World, partition: int) -> None:
    """Every RocksDB write to `partition` fails; the others' land."""
    inner = world.store.inner
    write = inner._write

    def _write(p: int, batch: Any, options: Any = None) -> None:
        if p == partition:
            raise StoreError(f"RocksDB write to partition {p} failed: disk")
        write(p, batch, options)

    inner._write = _write


async def one_round(runner: TimerRunner) -> None:
    async with runner.round() as r:
        r.claims_committed(r.to_commit)


async def test_a_claim_that_landed_before_another_partitions_write_failed_is_sent(
    rocks: World,
) -> None:
    await rocks.put(id="a", key="a", partition=0)  # written first: its batch lands
    await rocks.put(id="b", key="b", partition=1)
    runner = rocks.runner(partitions=[0, 1])
    failing_writes_to(rocks, 1)
    async with runner.round() as r:
        r.claims_committed(r.to_commit)
    assert list(r.failed) == [1]
    assert (await rocks.row("a")).status is TimerStatus.FIRING  # its claim landed
    assert r.stats.lost_claims == 0 and r.stats.claimed == 1
    await until(lambda: rocks.sender.request_ids == ["a#0"] and not runner.in_flight)
    await one_round(runner)  # writes its outcome
    assert (await rocks.row("a")).status is TimerStatus.FIRED


async def test_rows_taken_from_the_wheel_by_a_round_that_failed_are_loaded_again(
    rocks: World,
) -> None:
    """A claim batch that fails with anything but a `StoreError` fails the round (the loop
    tries again): the rows it took from the wheels are claimed by the next round, not
    left out of the wheels until their next reload (a poll interval on)."""
    await rocks.put(id="a", key="a", partition=0)
    runner = rocks.runner(partitions=[0], poll_interval_ms=60_000)
    rocks.store.fail_settle = lambda n: n == 1
    with pytest.raises(OSError):
        await runner.run_round()
    assert (await rocks.row("a")).status is TimerStatus.PENDING
    stats = await runner.run_round()  # the same instant: no reload is due
    assert stats.claimed == 1 and rocks.sender.request_ids == ["a#0"]


async def test_a_previous_owners_claims_are_taken_over_after_a_round_that_failed(
    rocks: World,
) -> None:
    """The FIRING rows of a partition just started are claimed again at once: a round that
    failed to write those claims leaves them to the next round, not to their lapse."""
    rocks.runner()
    loaded = await rocks.put(id="a", key="a", partition=0)
    claim = loaded.model_copy(update={"status": TimerStatus.FIRING, "due_at": T0 + 30_000})
    assert await rocks.store.inner.settle([TimerChange(loaded=loaded, next=claim)]) == 1
    runner = TimerRunner(rocks.store, rocks.sender, rocks.clock, rocks.ledger)
    runner.start_partition(0)
    rocks.store.fail_settle = lambda n: n == 1  # its claim batch
    with pytest.raises(OSError):
        await runner.run_round()
    stats = await runner.run_round()
    assert stats.claimed == 1 and rocks.sender.request_ids == ["a#0"]


async def test_a_timer_handed_over_by_a_round_that_failed_has_its_cycle_woken_next_round(
    rocks: World,
) -> None:
    """An in-process timer handed to its partition in a round whose claim batch then
    failed: the node never woke that partition's cycle (the round raised), and the timer,
    in hand, is not handed over again. The next round names its partition again
    (`Round.in_process`), or on a quiet partition it would never fire."""
    local = FakeLocal()
    assert local.targets is not None
    here = partition_of(TARGET.id, PARTITIONS)
    there = (here + 1) % PARTITIONS
    await rocks.put(id="in", key="in", partition=here)
    await rocks.put(id="out", key="out", partition=there)
    rocks.runner()  # makes the world's sender
    runner = TimerRunner(
        rocks.store, rocks.sender, rocks.clock, rocks.ledger, in_process=local.targets
    )
    runner.start_partition(here, in_process=local.targets).fresh = False
    runner.start_partition(there).fresh = False
    rocks.store.fail_settle = lambda n: n == 1  # the remote timer's claim
    with pytest.raises(OSError):
        async with runner.round():
            pass
    async with runner.round() as r:
        r.claims_committed(r.to_commit)
    assert here in r.in_process
    assert [t.id for t in runner.in_process_due(here)] == ["in"]
