"""A timer parked as it is claimed (its rule's arithmetic raised: `decisions.guarded`) is
parked as an outcome's park is: its target recorded in the failure ledger first, then the
row PARKED; if the ledger refuses, its fallback (tried again an hour later). A hunt: the
claim's batch wrote it PARKED directly, no ledger entry naming it, counted as expired."""

from __future__ import annotations

import pytest
from fakes import T0, World, raw_store, world

from app.timers.runner import TimerOptions, decisions
from tables.timer import Outcome, TimerChange, TimerStatus

__all__ = ["raw_store", "world"]

SUB = TimerOptions.PARKED_SUBSCRIPTION
HOUR = 3_600_000


@pytest.fixture
def broken_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: object) -> object:
        raise OverflowError("rule arithmetic broke")

    monkeypatch.setattr(decisions, "caught_up", broken)


@pytest.mark.usefixtures("broken_rules")
async def test_a_park_at_claim_time_is_recorded_in_the_ledger_first(world: World) -> None:
    await world.put(id="t-1")
    stats = await world.runner().run_round()
    row = await world.row()
    assert (row.status, row.outcome, row.error_code) == (
        TimerStatus.PARKED,
        Outcome.FAILED,
        "RULE_ERROR",
    )
    entry = await world.ledger.entry(SUB, row.target)
    assert entry is not None and entry.timers == (row.request_id,)
    # Recorded while the row was still as loaded: the ledger, then the row.
    assert world.ledger.seen == [TimerStatus.PENDING]
    assert (stats.parked, stats.expired, stats.claimed) == (1, 0, 0)
    assert world.sender.sends == []


@pytest.mark.usefixtures("broken_rules")
async def test_a_park_at_claim_time_the_ledger_refuses_is_tried_again_later(
    world: World,
) -> None:
    world.ledger.failures = 1
    await world.put(id="t-1")
    stats = await world.runner().run_round()
    row = await world.row()
    assert (row.status, row.due_at, row.error_code) == (
        TimerStatus.PENDING,
        T0 + HOUR,
        "RULE_ERROR",
    )
    assert await world.ledger.entry(SUB, row.target) is None
    assert (stats.parked, stats.expired, stats.ledger_failures) == (0, 0, 1)


async def test_a_previous_owners_claim_parked_as_it_is_taken_over_is_named(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    timer = await world.put(id="t-1")
    loaded = await world.row()
    # Claimed by the partition's previous owner, which is gone: its claim holds 30 s more.
    claim = loaded.model_copy(update={"status": TimerStatus.FIRING, "due_at": T0 + 30_000})
    assert await world.store.inner.settle([TimerChange(loaded=loaded, next=claim)]) == 1
    runner = world.runner(partitions=())
    runner.start_partition(timer.partition)

    def broken(*_args: object) -> object:
        raise OverflowError("rule arithmetic broke")

    monkeypatch.setattr(decisions, "caught_up", broken)
    stats = await runner.run_round()
    row = await world.row()
    assert row.status is TimerStatus.PARKED
    entry = await world.ledger.entry(SUB, row.target)
    assert entry is not None and entry.timers == (row.request_id,)
    assert world.ledger.seen == [TimerStatus.FIRING]
    assert (stats.parked, stats.expired) == (1, 0)
