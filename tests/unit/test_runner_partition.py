"""The runner inside a partition task: timers fired in-process, claims committed before a
remote send, a previous owner's claims taken over at once, and the wheel.

The fakes of `fakes` (fake clock, scripted sender, both store backends), as `test_runner_loop`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fakes import (
    EVERY_MIN,
    MIN,
    OWNER,
    T0,
    FakeLocal,
    World,
    make_timer,
    raw_store,
    until,
    world,
)

from app.timers.runner import SendResult, TimerLoop, TimerOptions, TimerRunner
from tables.exceptions import StoreError
from tables.timer import Outcome, Timer, TimerChange, TimerStatus

__all__ = ["raw_store", "world"]  # the fixtures, imported for pytest


def runner_with(world: World, local: FakeLocal | None = None, **options: Any) -> TimerRunner:
    world.runner()  # makes the world's sender
    runner = TimerRunner(
        world.store,
        world.sender,
        world.clock,
        world.ledger,
        TimerOptions.model_validate(options),
        (0,),
        in_process=None if local is None else local.targets,
    )
    if local is not None:
        local.runner = runner
    return runner


async def test_a_local_target_is_handed_to_its_partition_and_settled_with_its_outcome(
    world: World,
) -> None:
    await world.put()
    local = FakeLocal()
    runner = runner_with(world, local)
    stats = await runner.run_round()
    assert world.sender.sends == [], "decided in-process: no command round trip"
    assert stats.claimed == 1 and [t.request_id for t in local.fired] == ["t-1#0"]
    claimed = local.fired[0]
    assert claimed.status is TimerStatus.FIRING
    # Nothing written yet: the claim commits with the partition transaction that decides
    # it and writes its outcome.
    assert (await world.row()).status is TimerStatus.PENDING
    assert len(world.store.settle_calls) == 0
    assert (await runner.run_round()).claimed == 0, "in hand: not handed over twice"
    assert await runner.still_due([claimed]) == [claimed]
    outcome = await runner.record_outcomes([(claimed, SendResult("COMMITTED"))])
    row = await world.row()
    assert (row.status, row.outcome) == (TimerStatus.FIRED, Outcome.COMMITTED)
    assert (outcome.fired, outcome.written) == (1, 1)


@pytest.mark.parametrize("ledger_failures", [0, 1])
async def test_an_in_process_park_is_written_as_its_retry_then_parked_by_the_next_round(
    world: World, ledger_failures: int
) -> None:
    """The cycle that decides a spent in-process timer calls no ledger (it holds its
    partition's lock): it writes the last attempt to send again after the backoff, and the
    partition's next round records the target in the ledger first, then parks the row
    against that retry. A ledger that refuses leaves the retry as it is."""
    world.ledger.failures = ledger_failures
    await world.put()
    local = FakeLocal()
    runner = runner_with(world, local, retry={"max_attempts": 1})
    await runner.run_round()
    [claimed] = local.fired
    stats = await runner.record_outcomes([(claimed, SendResult("ERROR", "no handler"))])
    assert world.ledger.seen == [], "no ledger call from the cycle"
    retry = await world.row()
    assert (retry.status, retry.attempts, retry.outcome) == (
        TimerStatus.PENDING,
        0,
        Outcome.FAILED,
    )
    assert retry.due_at > world.clock.now() and (stats.retried, stats.parked) == (1, 0)
    stats = await runner.run_round()
    assert world.ledger.seen == [TimerStatus.PENDING], "the ledger first, then the row"
    row = await world.row()
    if ledger_failures:
        assert row == retry and await world.ledger.entries() == []
        assert (stats.parked, stats.ledger_failures) == (0, 1)
    else:
        assert (row.status, row.attempts, row.error_text) == (TimerStatus.PARKED, 1, "no handler")
        [entry] = await world.ledger.entries()
        assert entry.timers == (row.request_id,) and stats.parked == 1


async def test_an_in_process_park_is_written_before_its_retry_can_fire_again(
    world: World,
) -> None:
    """A backoff shorter than the ledger's answer: the next round writes the park before
    it claims anything, so the retry row is not handed over to fire a second time while
    the ledger is asked (the partition's cycle runs meanwhile)."""
    await world.put()
    local = FakeLocal()
    runner = runner_with(world, local, retry={"max_attempts": 1, "initial_backoff_ms": 1})
    await runner.run_round()
    [claimed] = local.fired
    await runner.record_outcomes([(claimed, SendResult("ERROR", "no handler"))])
    record = world.ledger.record
    fired_again: list[Timer] = []

    async def slow(*args: Any) -> None:
        """A Kafka round trip: the partition's cycle fires what it was handed meanwhile."""
        world.clock.set(world.clock.now() + 10)  # the retry's backoff is over
        handed = await runner.still_due(runner.in_process_due(0))
        fired_again.extend(handed)
        await runner.record_outcomes([(t, SendResult("ERROR", "again")) for t in handed])
        await record(*args)

    world.ledger.record = slow  # type: ignore[method-assign,assignment]
    for _ in range(3):
        world.clock.set(world.clock.now() + 10)
        await runner.run_round()
    assert fired_again == [] and local.fired == [claimed]
    row = await world.row()
    assert (row.status, row.attempts) == (TimerStatus.PARKED, 1)


async def test_a_timer_cancelled_after_it_was_handed_over_is_not_decided(
    world: World,
) -> None:
    await world.put()
    local = FakeLocal()
    runner = runner_with(world, local)
    await runner.run_round()
    assert await world.store.inner.cancel(OWNER, "remind", 1)
    assert await runner.still_due(local.fired) == []
    assert (await world.row()).status is TimerStatus.CANCELLED


async def test_an_outcome_of_a_timer_never_handed_over_is_refused(world: World) -> None:
    runner = runner_with(world, FakeLocal())
    with pytest.raises(StoreError):
        await runner.record_outcomes([(make_timer(), SendResult("COMMITTED"))])


async def test_a_duplicate_from_the_partition_fires_the_slot_too(world: World) -> None:
    await world.put()
    local = FakeLocal()
    runner = runner_with(world, local)
    await runner.run_round()
    await runner.record_outcomes([(local.fired[0], SendResult("DUPLICATE"))])
    assert (await world.row()).outcome is Outcome.DUPLICATE


async def test_a_timer_the_partition_does_not_decide_goes_through_the_sender(
    world: World,
) -> None:
    await world.put()
    local = FakeLocal(accept=False)
    runner = runner_with(world, local)
    await runner.run_round()
    assert local.fired == [] and world.sender.request_ids == ["t-1#0"]


async def test_a_recurring_local_timer_comes_back_from_the_wheel_without_another_query(
    world: World,
) -> None:
    await world.put(rule=EVERY_MIN)
    local = FakeLocal()
    runner = runner_with(world, local, poll_interval_ms=2 * MIN)
    await runner.run_round()
    await runner.record_outcomes([(local.fired[0], SendResult("COMMITTED"))])
    assert (await world.row()).slot == 1
    world.clock.set(T0 + MIN)
    stats = await runner.run_round()
    assert [t.request_id for t in local.fired] == ["t-1#0", "t-1#1"]
    assert stats.loaded == 1 and len(world.store.due_calls) == 1, "the wheel held slot 1"


async def test_a_put_offered_to_the_wheel_fires_at_its_due_instant(world: World) -> None:
    runner = runner_with(world, poll_interval_ms=10_000)
    stats = await runner.run_round()
    assert stats.next_due is None
    timer = await world.put(rule=make_timer().rule.model_copy(update={"at": T0 + 500}))
    runner.offer([await world.row()])
    assert timer.due_at == T0 + 500
    world.clock.set(T0 + 499)
    assert (await runner.run_round()).claimed == 0
    world.clock.set(T0 + 500)
    stats = await runner.run_round()
    assert world.sender.request_ids == ["t-1#0"]
    assert len(world.store.due_calls) == 1, "one load of the wheel for the three rounds"


async def test_a_row_offered_twice_fires_once(world: World) -> None:
    """The same row in the wheel twice (a put offered, then offered again) ties on due time
    and id: the wheel never compares the rows themselves, and the claim fires it once."""
    runner = runner_with(world, poll_interval_ms=10_000)
    await runner.run_round()
    await world.put(rule=make_timer().rule.model_copy(update={"at": T0 + 500}))
    row = await world.row()
    runner.offer([row, row.model_copy()])
    world.clock.set(T0 + 500)
    await runner.run_round()
    assert world.sender.request_ids == ["t-1#0"]


async def test_a_nodes_round_sends_a_remote_timer_only_after_its_claim_committed(
    world: World,
) -> None:
    """A node's round (`round()`): the claim is written when the round hands it over, and
    its command leaves only when the round ends with its partition's claims committed."""
    await world.put()
    world.runner()
    runner = TimerRunner(world.store, world.sender, world.clock, world.ledger, partitions=(0,))
    async with runner.round() as r:
        assert r.to_commit == {0}
        assert (await world.row()).status is TimerStatus.FIRING, "claimed: to be committed"
        assert world.sender.sends == [], "nothing sent before the claims commit"
        r.claims_committed({0})
    await until(lambda: world.sender.request_ids == ["t-1#0"])
    assert r.stats.claimed == 1


async def test_a_claim_that_cannot_commit_is_never_sent(world: World) -> None:
    await world.put()
    world.runner()
    runner = TimerRunner(world.store, world.sender, world.clock, world.ledger, partitions=(0,))
    async with runner.round() as r:
        assert r.to_commit == {0}  # and the node's commit fails: nothing said
    for _ in range(10):
        await asyncio.sleep(0)
    assert world.sender.sends == [] and r.stats.claimed == 0 and runner.in_flight == 0


async def test_a_new_owner_claims_the_previous_owners_claims_at_once(world: World) -> None:
    """The previous owner claimed (FIRING until T0 + 30 s) and froze; the new owner's start
    fenced it, so the new owner sends the slot again now, not at the claim's lapse."""
    loaded = await world.put()
    claimed = loaded.model_copy(update={"status": TimerStatus.FIRING, "due_at": T0 + 30_000})
    assert await world.store.inner.settle([TimerChange(loaded=loaded, next=claimed)]) == 1
    world.runner()
    runner = TimerRunner(world.store, world.sender, world.clock, world.ledger)
    runner.start_partition(0)
    world.clock.set(T0 + 10)
    stats = await runner.run_round()
    assert world.sender.request_ids == ["t-1#0"], "the same request id: the target dedups"
    assert stats.claimed == 1
    row = await world.row()
    assert (row.status, row.outcome) == (TimerStatus.FIRED, Outcome.COMMITTED)
    await runner.run_round()
    assert world.sender.request_ids == ["t-1#0"], "taken over once, not every round"


# --- sends are not waited for -----------------------------------------------------------


class HeldSender:
    """A target that answers only when told: each send waits for its own answer."""

    def __init__(self) -> None:
        self.answers: dict[str, asyncio.Future[SendResult]] = {}

    async def send(self, timer: Timer) -> SendResult:
        answer: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
        self.answers[timer.request_id] = answer
        return await answer

    def answer(self, request_id: str, code: str = "COMMITTED") -> None:
        self.answers[request_id].set_result(SendResult(code))


def held_runner(world: World, **options: Any) -> tuple[TimerRunner, HeldSender]:
    sender = HeldSender()
    runner = TimerRunner(
        world.store, sender, world.clock, world.ledger, TimerOptions.model_validate(options), (0,)
    )
    return runner, sender


async def test_a_target_that_does_not_answer_holds_no_other_timer_up(world: World) -> None:
    """The loop's round returns with its send in flight: the next timer due is sent on
    time although the first target has not answered (nor timed out) yet."""
    await world.put(id="t-1", key="a", rule=make_timer().rule.model_copy(update={"at": T0}))
    await world.put(id="t-2", key="b", rule=make_timer().rule.model_copy(update={"at": T0 + 50}))
    runner, sender = held_runner(world)
    stats = await runner.run_round(wait=False)
    assert stats.claimed == 1
    await until(lambda: "t-1#0" in sender.answers)
    world.clock.set(T0 + 50)
    assert (await runner.run_round(wait=False)).claimed == 1
    await until(lambda: "t-2#0" in sender.answers)
    sender.answer("t-2#0")
    sender.answer("t-1#0")
    await until(lambda: runner.in_flight == 0)
    stats = await runner.run_round(wait=False)  # writes the outcomes that came back
    assert stats.fired == 2
    assert (await world.row("a")).status is TimerStatus.FIRED
    assert (await world.row("b")).status is TimerStatus.FIRED


async def test_no_more_are_claimed_than_may_be_sent_at_once(world: World) -> None:
    for i in range(3):
        await world.put(id=f"t-{i}", key=f"k{i}")
    runner, sender = held_runner(world, max_in_flight=2)
    stats = await runner.run_round(wait=False)
    assert (stats.claimed, stats.deferred) == (2, 1)
    assert runner.in_flight == 2
    rows = [await world.row(f"k{i}") for i in range(3)]
    assert sorted(r.status for r in rows) == sorted(
        [TimerStatus.FIRING, TimerStatus.FIRING, TimerStatus.PENDING]
    ), "the third is not claimed: it waits in the store, not in a claim"
    await until(lambda: len(sender.answers) == 2)
    sender.answer(next(iter(sender.answers)))
    await until(lambda: runner.in_flight == 1)
    stats = await runner.run_round(wait=False)
    assert (stats.fired, stats.claimed, stats.deferred) == (1, 1, 0)


async def test_the_loop_writes_an_outcome_as_soon_as_it_is_in(world: World) -> None:
    """Not at the next poll: the send's answer wakes the loop."""
    await world.put()
    runner, sender = held_runner(world, poll_interval_ms=60_000)
    loop = TimerLoop(runner)
    loop.start()
    await until(lambda: "t-1#0" in sender.answers and bool(world.clock.sleeping_until))
    sender.answer("t-1#0")
    for _ in range(2000):
        if (await world.row()).status is TimerStatus.FIRED:
            break
        await asyncio.sleep(0)
    assert (await world.row()).status is TimerStatus.FIRED
    assert world.clock.now() == T0, "the clock never moved: no poll interval waited"
    await loop.stop()
