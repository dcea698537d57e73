"""A worker's wall clock stepped while a timer's command is out (NTP stepping it back, a VM
resumed after a suspend), on both store backends: never sent before its slot on the
node's own clock, never sent twice at once, never marked expired while its send runs."""

from __future__ import annotations

import asyncio

from fakes import T0, FakeClock, FakeSender, World, always, never, raw_store, world

from app.timers.runner import SendResult, TimerOptions, TimerRunner
from tables.timer import Outcome, Timer

__all__ = ["raw_store", "world"]  # the fixtures, imported for pytest

HOUR = 3_600_000


async def _first_send(world: World) -> None:
    for _ in range(100):
        if world.sender.sends:
            return
        await asyncio.sleep(0)
    raise AssertionError("the first send never left")


async def _sent_and_held(world: World, gate: asyncio.Event) -> TimerRunner:
    """A runner whose timer (due T0) was sent at T0, its answer (COMMITTED) held by `gate`."""
    await world.put()

    async def script(timer: Timer) -> SendResult:
        await gate.wait()
        return SendResult("COMMITTED")

    runner = world.runner(script)
    await runner.run_round(wait=False)
    await _first_send(world)
    return runner


async def test_a_step_back_while_a_send_is_out_sends_its_retry_only_once_its_slot_is_due(
    world: World,
) -> None:
    # Slot due T0, sent at T0; the clock steps back an hour while the send is out, and the
    # target answers BUSY. The retry was due at now + 1 s, an hour before its slot: sent,
    # refused by a target on the same clock as not due, attempt after attempt, and parked.
    await world.put()
    sends: list[tuple[int, int]] = []

    def script(timer: Timer) -> SendResult:
        sends.append((world.clock.now(), timer.slot_due_at))
        if len(sends) == 1:
            world.clock.step(T0 - HOUR)
            return SendResult("BUSY")
        if timer.slot_due_at > world.clock.now():
            return SendResult("SCHEDULE_NOT_DUE", "not due on the target's clock")
        return SendResult("COMMITTED")

    runner = world.runner(script)
    await runner.run_round()
    for _ in range(40):
        row = await world.row()
        if row.outcome is Outcome.COMMITTED:
            break
        if row.due_at > world.clock.now():
            world.clock.step(row.due_at)
        await runner.run_round()
    assert all(now >= due for now, due in sends), sends
    assert (await world.row()).outcome is Outcome.COMMITTED


async def test_a_jump_forward_while_a_send_is_out_neither_claims_nor_sends_it_again(
    world: World,
) -> None:
    # The claim's deadline is wall time, the send's wait is not: past the jump the claim
    # looked lapsed and the next round claimed and sent it again, the first still out.
    gate = asyncio.Event()
    runner = await _sent_and_held(world, gate)
    world.clock.step(T0 + HOUR)
    await runner.run_round(wait=False)
    for _ in range(5):
        await asyncio.sleep(0)
    assert world.sender.request_ids == ["t-1#0"]
    gate.set()
    await runner.run_round()


async def test_a_jump_past_expiry_while_a_send_is_out_does_not_expire_it(world: World) -> None:
    # A VM resumed after more than `expires_after`: the round expired the FIRING row while
    # its send was out, and the target's COMMITTED came back to a row that said EXPIRED.
    gate = asyncio.Event()
    runner = await _sent_and_held(world, gate)
    world.clock.step(T0 + TimerOptions().expires_after + HOUR)
    await runner.run_round(wait=False)
    gate.set()
    for _ in range(20):
        await asyncio.sleep(0)
    await runner.run_round()
    assert (await world.row()).outcome is not Outcome.EXPIRED
    assert world.sender.request_ids == ["t-1#0"]


async def _sent_after_a_node_ahead_gave_it_back(world: World, at: int) -> list[str]:
    """The timer claimed by a node 5 min ahead whose send hangs, given back as its partition
    moves (`stop_partition`); what a node on time at `at` then sends in one round."""
    ahead = FakeClock(T0 + 5 * 60_000)
    a_sender = FakeSender(ahead, never)
    a = TimerRunner(world.store, a_sender, ahead, world.ledger, TimerOptions(), (0,))
    await a.run_round(wait=False)
    for _ in range(100):
        if a_sender.sends:
            break
        await asyncio.sleep(0)
    await a.stop_partition(0)  # a rebalance: its claim given back
    on_time = FakeClock(at)
    b_sender = FakeSender(on_time, always("COMMITTED"))
    b = TimerRunner(world.store, b_sender, on_time, world.ledger, TimerOptions(), (0,))
    await b.run_round()
    return b_sender.request_ids


async def test_a_claim_given_back_by_a_node_whose_clock_runs_ahead_is_due_at_its_slot(
    world: World,
) -> None:
    # Given back due at `now` by a node 5 min ahead, the next owner waited for the skew.
    await world.put()  # due T0
    assert await _sent_after_a_node_ahead_gave_it_back(world, T0 + 1_000) == ["t-1#0"]


async def test_a_retry_given_back_by_a_node_whose_clock_runs_ahead_is_not_held_for_the_skew(
    world: World,
) -> None:
    # A retry's claim was given back due at that node's `now`: the next owner, on time,
    # waited the whole skew for a retry that was due already.
    await world.put()  # due T0
    first = FakeSender(world.clock, always("ERROR"))
    r0 = TimerRunner(world.store, first, world.clock, world.ledger, TimerOptions(), (0,))
    await r0.run_round()
    assert (await world.row()).due_at == T0 + 1_000  # failed once: retried in 1 s
    await r0.stop_partition(0)
    assert await _sent_after_a_node_ahead_gave_it_back(world, T0 + 2_000) == ["t-1#0"]
    assert (await world.row()).outcome is Outcome.COMMITTED
