"""A send cut short by a stop before its task's first turn (the stop right after the round
that claimed it) gives its claim back, as one cut short while it runs does: its handler,
which gives the claim back, never ran, so the row stayed FIRING until its claim lapsed.
The next owner takes a previous owner's claims over at once only when their deadlines fall
within its own claim timeout: on a clock behind the old owner's it waited the skew."""

from __future__ import annotations

from typing import Any

import pytest
from fakes import T0, FakeClock, FakeSender, World, always, raw_store, world

import app.timers.runner.sending
from app.timers.runner import TimerOptions, TimerRunner
from tables.timer import TimerStatus

__all__ = ["raw_store", "world"]


async def test_a_send_cut_before_its_first_turn_gives_its_claim_back(world: World) -> None:
    await world.put(id="t-1")
    world.clock.set(T0 + 10_000)  # this node's clock, 10 s ahead of the next owner's
    runner = world.runner()
    claimed = await runner.run_round(wait=False)  # its send spawned, not begun
    assert claimed.claimed == 1
    stats = await runner.stop_partition(0)
    assert world.sender.sends == []
    row = await world.row()
    # Given back: due at its slot's own time (its first attempt), no claim to lapse.
    assert (row.status, row.due_at, row.attempts) == (TimerStatus.PENDING, T0, 0)
    assert stats.released == 1

    later = FakeClock(T0 + 1_000)
    sender = FakeSender(later, always("COMMITTED"))
    successor = TimerRunner(world.store, sender, later, world.ledger, TimerOptions(), ())
    successor.start_partition(0)
    await successor.run_round()
    assert sender.request_ids == ["t-1#0"]
    assert (await world.row()).status is TimerStatus.FIRED


async def test_a_claim_not_given_back_still_answers_whoever_waits(
    world: World, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The give-back itself failing (a bug) leaves its claim to lapse, said loudly; the
    # stop waiting on its answers ends all the same.
    def broken(claimed: Any, now: int) -> Any:
        raise RuntimeError("no release")

    monkeypatch.setattr(app.timers.runner.sending, "release", broken)
    await world.put(id="t-1")
    world.clock.set(T0 + 10_000)
    runner = world.runner()
    assert (await runner.run_round(wait=False)).claimed == 1
    firing = runner._firings[0]
    await runner.stop_partition(0)
    assert firing.answered.is_set()
    assert world.sender.sends == []
    assert "giving back the claim of" in caplog.text
    assert (await world.row()).status is TimerStatus.FIRING  # lapses at its deadline
