"""TimerRunner and TimerLoop against the TimerStore, with a fake clock and a fake sender.

One test per sentence of the TimerRunner seed. Nothing sleeps in real time: the clock
only moves when a test moves it, and the loop's waits are the clock's.
"""

from __future__ import annotations

import asyncio

import pytest
from fakes import (
    EVERY_MIN,
    MIN,
    OWNER,
    PARTITIONS,
    T0,
    TARGET,
    Sent,
    World,
    always,
    make_timer,
    never,
    raw_store,
    scripted,
    until,
    world,
)

from app.timers.runner import (
    SENT,
    Decision,
    RoundStats,
    SendResult,
    TimerLoop,
    TimerOptions,
    TimerRunner,
    backoff_ms,
    decisions,
)
from app.timers.runner import runner as runner_module
from app.timers.runner.loop import FAILED_ROUND_RETRY_MS
from app.timers.runner.options import RetryPolicy
from tables.ledger import LedgerEntry
from tables.rules import IntervalRule, OnceRule
from tables.timer import Outcome, Timer, TimerChange, TimerStatus

__all__ = ["raw_store", "world"]  # the fixtures, imported for pytest


async def rounds_until_settled(world: World, runner: TimerRunner, limit: int = 50) -> Timer:
    """Runs rounds, moving the clock to each due time, until the timer leaves the wheel."""
    for _ in range(limit):
        row = await world.row()
        if row.status not in (TimerStatus.PENDING, TimerStatus.FIRING):
            return row
        world.clock.set(row.due_at)
        await runner.run_round()
    raise AssertionError("the timer never settled")


# --- sending from the row as loaded -------------------------------------------------------


async def test_a_timer_is_sent_from_the_row_as_loaded_looked_up_once_to_see_it_unchanged(
    world: World,
) -> None:
    timer = await world.put()
    runner = world.runner()
    stats = await runner.run_round()
    assert (stats.loaded, stats.claimed, stats.sent, stats.fired) == (1, 1, 1, 1)
    # Once, as the send starts: a cycle may have written over the claim meanwhile.
    assert world.store.find_calls == 1
    [sent] = world.sender.timers
    assert sent.model_dump(exclude={"status", "due_at"}) == timer.model_dump(
        exclude={"status", "due_at"}
    )
    assert (sent.status, sent.due_at) == (TimerStatus.FIRING, T0 + 30_000)
    assert world.sender.sends == [Sent("t-1#0", TARGET, "Remind", T0, T0)]
    assert (await world.row()).status is TimerStatus.FIRED


async def test_an_expired_one_off_is_cancelled_as_expired_and_not_sent(world: World) -> None:
    await world.put()
    world.clock.set(T0 + TimerOptions().expires_after + 1)
    stats = await world.runner().run_round()
    assert stats.expired == 1 and world.sender.sends == []
    row = await world.row()
    assert (row.status, row.outcome) == (TimerStatus.CANCELLED, Outcome.EXPIRED)


async def test_an_expired_slot_of_a_recurring_timer_moves_on_to_its_next_slot(
    world: World,
) -> None:
    await world.put(rule=EVERY_MIN)
    runner = world.runner(expires_after=MIN // 2)
    world.clock.set(T0 + MIN // 2 + 1)
    stats = await runner.run_round()
    assert stats.expired == 1 and world.sender.sends == []
    row = await world.row()
    assert (row.status, row.slot, row.slot_due_at, row.outcome) == (
        TimerStatus.PENDING,
        1,
        T0 + MIN,
        Outcome.EXPIRED,
    )
    assert stats.next_due == T0 + MIN
    world.clock.set(T0 + MIN)
    await runner.run_round()
    assert world.sender.request_ids == ["t-1#1"]


async def test_a_timer_cancelled_after_it_was_loaded_fails_the_claim_and_is_not_sent(
    world: World,
) -> None:
    await world.put()

    async def cancel(rows: list[Timer]) -> None:
        assert [r.id for r in rows] == ["t-1"]
        assert await world.store.inner.cancel(OWNER, "remind", 1)

    world.store.after_due = cancel
    stats = await world.runner().run_round()
    assert (stats.claimed, stats.lost_claims, stats.sent) == (0, 1, 0)
    assert world.sender.sends == []
    assert (await world.row()).status is TimerStatus.CANCELLED


async def test_of_a_batch_of_claims_only_those_written_are_sent(world: World) -> None:
    await world.put(id="kept", key="kept")
    await world.put(id="gone", key="gone")

    async def cancel(_rows: list[Timer]) -> None:
        assert await world.store.inner.cancel(OWNER, "gone", 1)

    world.store.after_due = cancel
    stats = await world.runner().run_round()
    assert (stats.claimed, stats.lost_claims) == (1, 1)
    assert world.sender.request_ids == ["kept#0"]
    # Which claims were written (asked only when some were not), then the one sent, as its
    # send starts.
    assert world.store.find_calls == 3
    assert (await world.row("gone")).status is TimerStatus.CANCELLED


async def test_a_timer_rescheduled_after_it_was_loaded_is_not_sent(world: World) -> None:
    await world.put()

    async def reschedule(_rows: list[Timer]) -> None:
        assert await world.store.inner.put(make_timer(id="t-2", version=2))

    world.store.after_due = reschedule
    runner = world.runner()
    assert (await runner.run_round()).lost_claims == 1
    assert world.sender.sends == []
    world.store.after_due = None
    await runner.run_round()
    assert world.sender.request_ids == ["t-2#0"]


async def test_a_lapsed_claim_is_claimed_and_sent_again_with_the_same_request_id(
    world: World,
) -> None:
    """A node that died after its claim: the next owner sends the timer at the deadline."""
    await world.put()
    loaded = await world.row()
    deadline = T0 + 30_000
    dead = loaded.model_copy(update={"status": TimerStatus.FIRING, "due_at": deadline})
    assert await world.store.inner.settle([TimerChange(loaded=loaded, next=dead)]) == 1
    runner = world.runner(script=always("DUPLICATE"))
    world.clock.set(deadline - 1)
    assert (await runner.run_round()).loaded == 0
    world.clock.set(deadline)
    stats = await runner.run_round()
    assert stats.sent == 1 and world.sender.request_ids == ["t-1#0"]
    row = await world.row()
    assert (row.status, row.outcome) == (TimerStatus.FIRED, Outcome.DUPLICATE)


async def test_a_crash_between_sending_and_writing_sends_again_and_the_target_dedups(
    world: World,
) -> None:
    world.store.fail_settle = lambda n: n == 2  # the first round's outcome batch
    await world.put()
    runner = world.runner(script=scripted({"t-1#0": ["COMMITTED", "DUPLICATE"]}))
    await runner.run_round()
    assert (await world.row()).status is TimerStatus.FIRING
    row = await rounds_until_settled(world, runner)
    assert world.sender.request_ids == ["t-1#0", "t-1#0"]
    assert (row.status, row.outcome) == (TimerStatus.FIRED, Outcome.DUPLICATE)


# --- outcomes -----------------------------------------------------------------------------


@pytest.mark.parametrize("code", ["COMMITTED", "DUPLICATE", "UNCHANGED", "REJECTED"])
async def test_a_fired_slot_of_a_one_off_is_fired(world: World, code: str) -> None:
    await world.put()
    await world.runner(script=always(code)).run_round()
    row = await world.row()
    assert (row.status, row.outcome, row.attempts) == (TimerStatus.FIRED, Outcome(code), 0)


@pytest.mark.parametrize("code", ["COMMITTED", "DUPLICATE", "UNCHANGED", "REJECTED"])
async def test_a_fired_slot_of_a_recurring_timer_is_pending_at_its_next_slot(
    world: World, code: str
) -> None:
    await world.put(rule=EVERY_MIN)
    runner = world.runner(script=always(code))
    stats = await runner.run_round()
    row = await world.row()
    assert (row.status, row.slot, row.slot_due_at, row.due_at, row.outcome) == (
        TimerStatus.PENDING,
        1,
        T0 + MIN,
        T0 + MIN,
        Outcome(code),
    )
    assert stats.next_due == T0 + MIN
    world.clock.set(T0 + MIN)
    await runner.run_round()
    assert world.sender.request_ids == ["t-1#0", "t-1#1"]


async def test_a_send_to_another_context_acknowledged_by_the_broker_is_fired_as_sent(
    world: World,
) -> None:
    await world.put()
    await world.runner(script=always(SENT)).run_round()
    row = await world.row()
    assert (row.status, row.outcome) == (TimerStatus.FIRED, Outcome.SENT)


@pytest.mark.parametrize("code", ["ERROR", "SCHEDULE_NOT_DUE", "CONTENDED", "???"])
async def test_a_technical_failure_is_retried_with_backoff_until_parked(
    world: World, code: str
) -> None:
    await world.put()
    runner = world.runner(script=always(code))
    policy = RetryPolicy()
    for attempt in range(1, policy.max_attempts):
        now = world.clock.now()
        assert (await runner.run_round()).retried == 1
        row = await world.row()
        assert (row.status, row.attempts, row.outcome) == (
            TimerStatus.PENDING,
            attempt,
            Outcome.FAILED,
        )
        assert row.due_at == now + backoff_ms(policy, attempt)
        world.clock.set(row.due_at - 1)
        assert (await runner.run_round()).loaded == 0, "not before the backoff"
        world.clock.set(row.due_at)
    assert (await runner.run_round()).parked == 1
    row = await world.row()
    assert (row.status, row.attempts) == (TimerStatus.PARKED, policy.max_attempts)
    assert (row.error_code, row.error_text) == (code, None)  # #22: the result's code kept
    assert world.ledger.seen == [TimerStatus.FIRING], "the ledger first, then PARKED"
    assert await world.ledger.entries() == [
        LedgerEntry(
            subscription="tickwheel.timers", target=TARGET, timers=("t-1#0",), error_code=code
        )
    ]
    assert world.sender.request_ids == ["t-1#0"] * policy.max_attempts
    assert {s.not_before for s in world.sender.sends} == {T0}


async def test_a_park_whose_row_was_cancelled_meanwhile_is_not_counted_as_parked(
    world: World,
) -> None:
    """The outcome's conditional write is refused (the row was cancelled while its last
    attempt was in flight): the round counts what it wrote, not what it decided."""
    await world.put()

    async def cancelled_meanwhile(timer: Timer) -> SendResult:
        row = await world.row()
        assert await world.store.inner.cancel(OWNER, "remind", row.version + 1)
        return SendResult("ERROR")

    runner = world.runner(script=cancelled_meanwhile, retry={"max_attempts": 1})
    stats = await runner.run_round()
    assert (stats.sent, stats.parked, stats.written) == (1, 0, 0)
    assert (await world.row()).status is TimerStatus.CANCELLED


async def test_a_partitions_stop_says_what_its_last_writes_did(world: World) -> None:
    """An outcome that came back before the stop is written by it, and counted (a node adds
    it to its rounds' metrics)."""
    await world.put()
    runner = world.runner(script=always("ERROR"), retry={"max_attempts": 1})
    assert (await runner.run_round(wait=False)).parked == 0
    await until(lambda: runner.in_flight == 0)
    stats = await runner.stop_partition(0)
    assert (stats.parked, stats.written) == (1, 1)
    assert (await world.row()).status is TimerStatus.PARKED


async def test_a_failing_ledger_leaves_the_timer_pending_and_its_last_attempt_sent_again(
    world: World,
) -> None:
    world.ledger.failures = 1
    await world.put()
    runner = world.runner(script=always("ERROR"), retry={"max_attempts": 2})
    await runner.run_round()
    world.clock.set((await world.row()).due_at)
    stats = await runner.run_round()
    assert (stats.parked, stats.ledger_failures) == (0, 1)
    row = await world.row()
    assert (row.status, row.attempts) == (TimerStatus.PENDING, 1)
    assert row.due_at == world.clock.now() + backoff_ms(RetryPolicy(), 2)
    assert await world.ledger.entries() == []
    row = await rounds_until_settled(world, runner)
    assert (row.status, row.attempts) == (TimerStatus.PARKED, 2)
    assert world.sender.request_ids == ["t-1#0"] * 3
    assert len(await world.ledger.entries()) == 1


async def test_busy_is_backpressure_then_counts_as_an_attempt_and_parks_in_the_end(
    world: World,
) -> None:
    await world.put()
    runner = world.runner(script=always("BUSY"), max_busy_retries=2, retry={"max_attempts": 2})
    seen: list[tuple[TimerStatus, int, int]] = []
    for _ in range(10):
        now = world.clock.now()
        await runner.run_round()
        row = await world.row()
        seen.append((row.status, row.attempts, row.due_at - now))
        if row.status is TimerStatus.PARKED:
            break
        world.clock.set(row.due_at)
    initial = RetryPolicy().initial_backoff_ms
    assert [s[:2] for s in seen] == [
        (TimerStatus.PENDING, 0),
        (TimerStatus.PENDING, 0),
        (TimerStatus.PENDING, 1),
        (TimerStatus.PARKED, 2),
    ]
    assert [s[2] for s in seen[:3]] == [initial, initial, backoff_ms(RetryPolicy(), 1)]
    assert (await world.row()).outcome is Outcome.BUSY


async def test_a_sender_that_raises_is_a_technical_failure(world: World) -> None:
    def broken(_timer: Timer) -> SendResult:
        raise ConnectionError("no transport")

    await world.put()
    await world.runner(script=broken).run_round()
    row = await world.row()
    assert (row.status, row.attempts, row.outcome) == (TimerStatus.PENDING, 1, Outcome.FAILED)


async def test_a_send_not_answered_in_time_is_a_technical_failure(world: World) -> None:
    await world.put()
    runner = world.runner(script=never, send_timeout=5_000)
    round_ = asyncio.create_task(runner.run_round())
    await until(lambda: len(world.sender.sends) == 1 and bool(world.clock.sleeping_until))
    assert world.clock.sleeping_until == [T0 + 5_000]
    world.clock.advance(5_000)
    stats = await round_
    assert stats.retried == 1 and world.sender.cancelled == ["t-1#0"]
    row = await world.row()
    assert (row.status, row.attempts) == (TimerStatus.PENDING, 1)


# --- slots: catch-up and not_before ---------------------------------------------------------


async def test_a_coalescing_timer_far_behind_sends_only_the_latest_slot(world: World) -> None:
    await world.put(rule=EVERY_MIN)
    world.clock.set(T0 + 10 * MIN + 5)
    await world.runner().run_round()
    assert world.sender.sends == [
        Sent("t-1#10", TARGET, "Remind", T0 + 10 * MIN, T0 + 10 * MIN + 5)
    ]
    row = await world.row()
    assert (row.slot, row.skipped, row.status) == (11, 10, TimerStatus.PENDING)


async def test_a_timer_that_does_not_coalesce_sends_every_slot_in_turn(world: World) -> None:
    await world.put(rule=IntervalRule(start=T0, every=MIN, coalesce=False))
    world.clock.set(T0 + 3 * MIN + 5)
    runner = world.runner()
    for _ in range(5):
        await runner.run_round()
    assert [(s.request_id, s.not_before) for s in world.sender.sends] == [
        (f"t-1#{n}", T0 + n * MIN) for n in range(4)
    ]
    assert (await world.row()).skipped == 0


async def test_every_send_of_a_slot_carries_its_own_due_time(world: World) -> None:
    await world.put(rule=EVERY_MIN)
    runner = world.runner(script=scripted({"t-1#0": ["ERROR", "BUSY", "ERROR"]}))
    world.clock.set(T0 + 5)
    for _ in range(4):
        await runner.run_round()
        world.clock.set((await world.row()).due_at)
    assert world.sender.request_ids == ["t-1#0"] * 4
    assert {s.not_before for s in world.sender.sends} == {T0}
    assert [s.at for s in world.sender.sends] == sorted({s.at for s in world.sender.sends})


# --- operator -------------------------------------------------------------------------------


async def park(world: World) -> TimerRunner:
    await world.put()
    runner = world.runner(script=always("ERROR"), retry={"max_attempts": 1})
    assert (await runner.run_round()).parked == 1
    return runner


async def test_an_operator_retry_sends_a_parked_timer_again_due_now(world: World) -> None:
    runner = await park(world)
    world.clock.advance(MIN)
    anywhere = TimerRunner(world.store, world.sender, world.clock, world.ledger)
    assert anywhere.partitions == frozenset()
    assert await anywhere.retry(TARGET) == 1
    row = await world.row()
    assert (row.status, row.due_at, row.attempts, row.slot_due_at) == (
        TimerStatus.PENDING,
        T0 + MIN,
        0,
        T0,
    )
    assert await world.ledger.entries() == []
    world.sender.script = always("COMMITTED")
    await runner.run_round()
    assert world.sender.sends[-1] == Sent("t-1#0", TARGET, "Remind", T0, T0 + MIN)
    assert (await world.row()).status is TimerStatus.FIRED


async def test_busy_refusals_count_again_from_zero_after_an_operator_retry(
    world: World,
) -> None:
    await world.put()
    runner = world.runner(script=always("BUSY"), max_busy_retries=1, retry={"max_attempts": 1})
    row = await rounds_until_settled(world, runner)
    assert (row.status, len(world.sender.sends)) == (TimerStatus.PARKED, 2)
    assert await runner.retry(TARGET) == 1
    await runner.run_round()
    row = await world.row()
    assert (row.status, row.attempts, row.outcome) == (TimerStatus.PENDING, 0, Outcome.BUSY)


async def test_an_operator_skip_cancels_a_parked_timer_as_skipped(world: World) -> None:
    runner = await park(world)
    assert await runner.skip(TARGET) == 1
    row = await world.row()
    assert (row.status, row.outcome) == (TimerStatus.CANCELLED, Outcome.SKIPPED)
    assert await world.ledger.entries() == []
    assert await runner.skip(TARGET) == 0


# --- partitions ---------------------------------------------------------------------------


async def test_only_the_owned_partitions_are_sent_and_start_is_idempotent(world: World) -> None:
    for p in range(PARTITIONS):
        await world.put(id=f"t-{p}", key=f"k{p}", partition=p)
    runner = world.runner(partitions=[0])
    assert runner.partitions == frozenset({0})
    assert runner.parked_subscription == "tickwheel.timers"
    await runner.run_round()
    assert world.sender.request_ids == ["t-0#0"]
    runner.start_partition(2)
    runner.start_partition(2)
    assert runner.partitions == frozenset({0, 2})
    await runner.run_round()
    assert world.sender.request_ids == ["t-0#0", "t-2#0"]


async def test_one_due_query_and_two_settle_batches_per_round(world: World) -> None:
    for p in range(PARTITIONS):
        await world.put(id=f"t-{p}", key=f"k{p}", partition=p)
    runner = world.runner(partitions=range(PARTITIONS), batch_limit=50, poll_interval_ms=100)
    stats = await runner.run_round()
    # One query loads the wheel: every owned partition, up to one poll interval ahead.
    assert world.store.due_calls == [(frozenset({0, 1, 2}), T0 + 100, 50)]
    claims, outcomes = world.store.settle_calls
    assert [c.next.status for c in claims] == [TimerStatus.FIRING] * 3
    assert [c.next.status for c in outcomes] == [TimerStatus.FIRED] * 3
    assert (stats.sent, stats.written) == (3, 3)


async def test_stop_partition_cancels_the_send_in_progress_and_writes_what_was_sent(
    world: World,
) -> None:
    await world.put(id="fast", key="fast")
    await world.put(id="slow", key="slow")
    runner = world.runner(script=lambda t: never(t) if t.id == "slow" else SendResult("COMMITTED"))
    round_ = asyncio.create_task(runner.run_round())
    await until(lambda: len(world.sender.sends) == 2)
    assert (await world.row("fast")).status is TimerStatus.FIRING, "not written yet"
    await runner.stop_partition(0)
    assert world.sender.cancelled == ["slow#0"]
    fast, slow = await world.row("fast"), await world.row("slow")
    assert (fast.status, fast.outcome) == (TimerStatus.FIRED, Outcome.COMMITTED)
    # Given back, due now, for the next owner to send again.
    assert (slow.status, slow.due_at, slow.attempts) == (TimerStatus.PENDING, T0, 0)
    assert runner.partitions == frozenset()
    stats = await round_
    assert stats.sent == 2, "both went out; one came back"
    await runner.stop_partition(0)  # nothing when not owned


async def test_a_partition_stopped_while_its_timers_load_is_not_claimed(world: World) -> None:
    await world.put()
    runner = world.runner()

    async def hand_off(_rows: list[Timer]) -> None:
        await runner.stop_partition(0)

    world.store.after_due = hand_off
    stats = await runner.run_round()
    assert (stats.loaded, stats.claimed, world.store.settle_calls) == (1, 0, [])
    assert (await world.row()).status is TimerStatus.PENDING


async def test_a_partition_stopped_while_its_claims_are_written_gives_them_back(
    world: World,
) -> None:
    await world.put()
    runner = world.runner()
    stopping: list[asyncio.Task[RoundStats]] = []

    async def hand_off() -> None:
        if not stopping:
            stopping.append(asyncio.create_task(runner.stop_partition(0)))
            await asyncio.sleep(0)

    world.store.before_settle = hand_off
    stats = await runner.run_round()
    await stopping[0]
    assert (stats.claimed, world.sender.sends) == (0, [])
    row = await world.row()
    assert (row.status, row.due_at) == (TimerStatus.PENDING, T0)


async def test_a_new_owner_reads_the_store_again(world: World) -> None:
    await world.put()
    old = world.runner(script=never)
    round_ = asyncio.create_task(old.run_round())
    await until(lambda: len(world.sender.sends) == 1)
    await old.stop_partition(0)
    await round_
    new = world.runner()
    await new.run_round()
    assert world.sender.request_ids == ["t-1#0"]
    assert (await world.row()).status is TimerStatus.FIRED


# --- the loop -------------------------------------------------------------------------------


async def test_the_loop_runs_rounds_at_the_poll_interval_and_stops_cleanly(world: World) -> None:
    runner = world.runner(poll_interval_ms=100)
    loop = TimerLoop(runner)
    loop.start()
    loop.start()  # nothing when running
    await until(lambda: loop.rounds == 1 and world.clock.sleeping_until == [T0 + 100])
    await world.put(rule=OnceRule(at=T0 + 100))
    world.clock.advance(100)
    await until(lambda: len(world.sender.sends) == 1)
    await loop.stop()
    assert not loop.running and world.clock.sleeping_until == []


async def test_a_wake_up_runs_a_round_at_once(world: World) -> None:
    loop = TimerLoop(world.runner(poll_interval_ms=10_000))
    loop.start()
    await until(lambda: loop.rounds == 1 and bool(world.clock.sleeping_until))
    await world.put()
    loop.wake()
    await until(lambda: len(world.sender.sends) == 1)
    assert world.clock.now() == T0
    await loop.stop()


async def test_the_loop_runs_at_once_when_the_next_slot_is_due_already(world: World) -> None:
    await world.put(rule=IntervalRule(start=T0, every=MIN, coalesce=False))
    world.clock.set(T0 + 2 * MIN)
    loop = TimerLoop(world.runner(poll_interval_ms=20_000))
    loop.start()
    # Three slots back to back, the clock never moved; then a wait for the poll interval.
    for _ in range(2000):
        if (await world.row()).slot == 3 and world.clock.sleeping_until == [T0 + 2 * MIN + 20_000]:
            break
        await asyncio.sleep(0)
    assert [s.request_id for s in world.sender.sends] == ["t-1#0", "t-1#1", "t-1#2"]
    assert world.clock.sleeping_until == [T0 + 2 * MIN + 20_000]
    await loop.stop()


async def test_a_failing_round_observer_does_not_stop_the_loop(world: World) -> None:
    seen: list[RoundStats] = []

    def observer(stats: RoundStats) -> None:
        seen.append(stats)
        raise ValueError("a metric refused it")

    loop = TimerLoop(world.runner(poll_interval_ms=100), on_round=observer)
    loop.start()
    await until(lambda: loop.rounds == 1 and bool(world.clock.sleeping_until))
    await world.put(rule=OnceRule(at=T0 + 100))
    world.clock.advance(100)
    await until(lambda: len(world.sender.sends) == 1)
    assert loop.running and len(seen) >= 2
    await loop.stop()


async def test_a_failing_round_does_not_stop_the_loop(world: World) -> None:
    calls = 0

    async def flaky(_rows: list[Timer]) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError("store unavailable")

    world.store.after_due = flaky
    await world.put()
    loop = TimerLoop(world.runner())
    loop.start()
    await until(lambda: loop.rounds == 1 and bool(world.clock.sleeping_until))
    assert world.sender.sends == []
    world.clock.advance(100)
    await until(lambda: len(world.sender.sends) == 1)
    await loop.stop()


async def test_rounds_whose_outcome_writes_keep_failing_are_a_failing_loop(world: World) -> None:
    """An outcome write that raises (not `StoreError`) is not written and its claim lapses,
    as before; but it counts as a failure: swallowed, a loop whose timers were re-sent at
    every lapse and never settled read as passing (`/healthz` ready) for good."""
    world.store.fail_settle = lambda n: n % 2 == 0  # claims land; each outcome batch raises
    await world.put()
    loop = TimerLoop(world.runner())
    loop.start()
    for sends in range(1, 4):
        await until(lambda: loop.write_failures_in_a_row == sends)  # noqa: B023
        world.clock.set((await world.row()).due_at)  # the claim lapses: sent again
    assert world.sender.request_ids == ["t-1#0"] * 3
    assert (await world.row()).status is TimerStatus.FIRING  # never settled
    assert loop.failing
    world.store.fail_settle = lambda n: False  # the store is well again
    await until(lambda: not loop.failing)
    assert (await world.row()).status is TimerStatus.FIRED
    await loop.stop()


def test_round_stats_keep_the_earliest_due_time() -> None:
    stats = RoundStats()
    stats.due_by(5)
    stats.due_by(9)
    stats.due_by(3)
    assert stats.next_due == 3


async def test_a_timer_its_rule_arithmetic_fails_on_is_parked_and_the_others_fire(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One timer the slot arithmetic raises on (a bug, or a rule no bound foresaw) is that
    timer's problem: parked for an operator, while the round fires every other timer."""
    await world.put(key="poison")
    await world.put(key="fine", id="t-2")
    claim = decisions.expire_or_claim

    def refuse_poison(timer: Timer, now: int, options: TimerOptions) -> Decision:
        if timer.key == "poison":
            raise ValueError("next_slot went back")
        return claim(timer, now, options)

    monkeypatch.setattr(runner_module, "expire_or_claim", refuse_poison)
    runner = world.runner()
    stats = await runner.run_round()
    assert stats.fired == 1
    assert (await world.row("poison")).status is TimerStatus.PARKED
    assert (await world.row("fine")).status is TimerStatus.FIRED


async def test_a_failed_round_is_tried_again_within_a_second_however_long_the_poll(
    world: World,
) -> None:
    runner = world.runner(poll_interval_ms=3_600_000)
    loop = TimerLoop(runner)
    failing = True

    async def round_() -> RoundStats:
        if failing:
            raise RuntimeError("a fault that passes")
        return await TimerLoop.round(loop)

    loop.round = round_  # type: ignore[method-assign]
    loop.start()
    await until(lambda: loop.failures_in_a_row == 1 and bool(world.clock.sleeping_until))
    assert world.clock.sleeping_until == [T0 + FAILED_ROUND_RETRY_MS]
    failing = False
    world.clock.set(T0 + FAILED_ROUND_RETRY_MS)
    await until(lambda: loop.failures_in_a_row == 0)
    await loop.stop()
