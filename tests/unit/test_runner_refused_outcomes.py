"""What an outcome write the store refused or failed leaves behind (fake clock, both store
backends, as `test_runner_loop`).

- A park records its target in the ledger, then writes its PARKED row, conditionally: a
  row cancelled by its owner while its last attempt was in flight refuses it. The name
  it recorded is taken out by the partition's next round (`Unparked.refused`), unless
  the row is PARKED by then; a crash between the two writes still leaves a name, never a
  PARKED row no entry names.
- A timer's BUSY count (`PartitionFiring.busy`) went only with its own next outcome: one
  whose row left by another hand (cancelled, replaced) kept it until the partition
  stopped. A round looks a bounded number of them up and drops those whose rows are gone
  (`PartitionFiring.prune_busy`).
"""

from __future__ import annotations

from fakes import OWNER, T0, TARGET, Script, World, always, make_timer, raw_store, world

from app.timers.runner import SendResult, TimerRunner
from app.timers.runner.partition import BUSY_LOOK_EVERY_MS, BusyCount, PartitionFiring
from app.timers.unparked import Unparked
from tables.ledger import LedgerEntry
from tables.timer import Timer, TimerStatus

__all__ = ["raw_store", "world"]  # the fixtures, imported for pytest

SUB = "tickwheel.timers"


def firing(runner: TimerRunner) -> PartitionFiring:
    found = runner.firing_of(0)
    assert found is not None
    return found


def cancelled_meanwhile(world: World, code: str) -> Script:
    """A send whose timer its owner cancels while it is in flight, answered `code`."""

    async def script(_timer: Timer) -> SendResult:
        row = await world.row()
        assert await world.store.inner.cancel(OWNER, "remind", row.version + 1)
        return SendResult(code)

    return script


# --- a park whose row was not written ------------------------------------------------------


async def test_a_park_refused_as_its_row_was_cancelled_leaves_no_name_in_the_ledger(
    world: World,
) -> None:
    await world.put()
    runner = world.runner(script=cancelled_meanwhile(world, "ERROR"), retry={"max_attempts": 1})
    stats = await runner.run_round()
    assert (stats.parked, stats.written) == (0, 0)
    assert (await world.row()).status is TimerStatus.CANCELLED
    # Recorded first (a crash before the row leaves a name, never a PARKED row unnamed).
    assert [e.timers for e in await world.ledger.entries()] == [("t-1#0",)]
    await runner.run_round()
    assert await world.ledger.entries() == [], "a name of no PARKED timer stayed"


async def test_a_park_whose_write_failed_leaves_no_name_until_it_parks(world: World) -> None:
    """The store failed the outcome write: the claim lapses and is sent again; meanwhile
    the ledger names nothing, and the park that comes then names it again."""
    await world.put()
    runner = world.runner(script=always("ERROR"), retry={"max_attempts": 1})
    world.store.fail_settle = lambda n: n == 2  # the claim lands, its outcome fails
    await runner.run_round()
    row = await world.row()
    assert row.status is TimerStatus.FIRING
    assert [e.timers for e in await world.ledger.entries()] == [("t-1#0",)]
    await runner.run_round()
    assert await world.ledger.entries() == []
    world.clock.set(row.due_at)  # the claim lapses: sent again, parked
    assert (await runner.run_round()).parked == 1
    assert (await world.row()).status is TimerStatus.PARKED
    await runner.run_round()
    assert await world.ledger.entries() == [
        LedgerEntry(subscription=SUB, target=TARGET, timers=("t-1#0",), error_code="ERROR")
    ]


async def test_a_refused_park_keeps_its_name_when_its_row_is_parked_by_then(
    world: World,
) -> None:
    """The round looks at the rows as they are: one PARKED after all (the write landed
    though it failed, another hand parked it) stays named."""
    runner = world.runner(script=always("ERROR"), retry={"max_attempts": 1})
    await world.put()
    assert (await runner.run_round()).parked == 1
    row = await world.row()
    notes = Unparked(0)
    notes.refused([row, make_timer(id="t-2", partition=1)])  # another partition's: its own
    assert len(notes) == 1
    assert await notes.forget(world.store, world.ledger, SUB, T0) == 0
    assert [e.timers for e in await world.ledger.entries()] == [("t-1#0",)]


# --- BUSY counts of timers gone -------------------------------------------------------------


async def test_the_busy_count_of_a_timer_cancelled_after_it_goes_in_a_later_round(
    world: World,
) -> None:
    await world.put()
    await world.put(id="t-2", key="other")
    runner = world.runner(script=always("BUSY"))
    await runner.run_round()
    busy = firing(runner).busy
    assert busy.keys() == {"t-1", "t-2"}
    assert busy["t-1"].in_a_row == 1
    assert await world.store.inner.cancel(OWNER, "remind", (await world.row()).version + 1)
    world.clock.advance(BUSY_LOOK_EVERY_MS)
    await runner.run_round()
    assert busy.keys() == {"t-2"}, "the cancelled timer's count stayed"
    assert busy["t-2"].in_a_row == 2, "a live timer's count is kept (sent again: counted on)"


async def test_the_busy_count_of_a_timer_whose_outcome_was_refused_goes_at_once(
    world: World,
) -> None:
    await world.put()
    runner = world.runner(script=cancelled_meanwhile(world, "BUSY"))
    assert (await runner.run_round()).written == 0
    assert firing(runner).busy == {}


async def test_busy_counts_are_looked_at_a_bounded_number_at_a_time_in_turn(
    world: World,
) -> None:
    f = firing(world.runner())
    for n in range(5):
        f.busy[f"t-{n}"] = BusyCount(1, OWNER, f"k{n}")
    await world.put(id="t-3", key="k3")
    await world.put(id="t-4", key="k4")
    found = world.store.find_calls
    assert await f.prune_busy(world.store, T0, limit=2) == 2  # t-0, t-1: no rows
    assert world.store.find_calls - found == 2
    assert list(f.busy) == ["t-2", "t-3", "t-4"]
    # Some went: it looks again at once, the live ones last in turn.
    assert await f.prune_busy(world.store, T0, limit=2) == 1
    assert list(f.busy) == ["t-4", "t-3"]
    assert await f.prune_busy(world.store, T0, limit=2) == 0
    found = world.store.find_calls
    assert await f.prune_busy(world.store, T0 + BUSY_LOOK_EVERY_MS - 1, limit=2) == 0
    assert world.store.find_calls == found, "none went last time: it waits"
