"""What an outcome write the store refused or failed leaves behind (fake clock, both store
backends, as `test_runner_loop`).

- A park records its target in the ledger, then writes its PARKED row, conditionally: a
  row cancelled by its owner while its last attempt was in flight refuses it. The name
  it recorded is taken out by the partition's next round (`Unparked.refused`), unless
  the row is PARKED by then; a crash between the two writes still leaves a name, never a
  PARKED row no entry names.
"""

from __future__ import annotations

from fakes import OWNER, T0, TARGET, Script, World, always, make_timer, raw_store, world

from app.timers.runner import SendResult
from app.timers.unparked import Unparked
from tables.ledger import LedgerEntry
from tables.timer import Timer, TimerStatus

__all__ = ["raw_store", "world"]  # the fixtures, imported for pytest

SUB = "tickwheel.timers"


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
