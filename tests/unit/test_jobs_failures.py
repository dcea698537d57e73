"""A failing job handler does not stop its job (issue 10, item 8).

The tick of a slot whose handler raised commits `wow.Ticked` and a `run:` timer of the
instance; that timer's `wow.schedule.Run` runs the slot again, retried, parked and put in
the ledger by the ordinary timer machinery. First the aggregate alone (`decide`/`fold`),
then a small cluster without Kafka: the schedule aggregate, a memory timer table fed by
its events, and a `TimerRunner` on a fake clock whose sender decides each command.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from fakes import T0, StillClock, sent_base

from app.jobs import (
    RAN,
    RUN,
    RUN_FAILED,
    TICK,
    TICK_KEY,
    TICKED,
    Job,
    JobRun,
    JobScope,
    ScheduleState,
    disable_command,
    enable_command,
    ref_of,
    run_key,
    schedule_aggregate,
)
from app.model.decide import StoredAggregate, decide
from app.protocol.wire import SCHEDULE_SET, CommandEnvelope, EventEnvelope, ResultCode
from app.timers.runner import SendResult, TimerOptions, TimerRunner
from app.timers.runner.options import RetryPolicy, backoff_ms
from app.timers.sender import timer_command
from app.timers.subscription import CancelTimer, PutTimer, timer_op
from tables import open_timer_store
from tables.ledger import MemoryFailureLedger
from tables.refs import AggregateRef
from tables.rules import IntervalRule
from tables.store import TimerStore
from tables.timer import Outcome, Timer, TimerStatus

CONTEXT = "ops"
SEC = 1000
MIN = 60 * SEC
RULE = IntervalRule(start=T0, every=MIN)
REPORT = AggregateRef(context="shop", aggregate="report", id="r-1")
OPTIONS = TimerOptions(retry=RetryPolicy(max_attempts=3))
SUB = TimerOptions.PARKED_SUBSCRIPTION


@dataclass
class Handler:
    """Sends one command per slot; raises for the slots in `failing` (while they are)."""

    failing: set[int] = field(default_factory=set)
    calls: list[tuple[int, bool]] = field(default_factory=list)
    retried_at: list[int] = field(default_factory=list)

    def __call__(self, run: JobRun) -> None:
        self.calls.append((run.slot, run.retried))
        if run.retried:
            self.retried_at.append(run.now)
        run.send(REPORT, "shop.RunReport", {"slot": run.slot})
        if run.slot in self.failing:
            raise RuntimeError(f"report store down at slot {run.slot}")


class Schedule:
    """One schedule instance decided as the node decides it: state, dedup, log."""

    def __init__(self, handler: Handler) -> None:
        self.job = Job("report", JobScope.SYSTEM, RULE, handler)
        self.agg = schedule_aggregate(CONTEXT, [self.job], 1)
        self.stored: StoredAggregate | None = None
        self.seen: set[str] = set()
        self.log: list[EventEnvelope] = []
        self.sent: list[CommandEnvelope] = []
        self.codes: list[tuple[str, ResultCode]] = []

    def run(self, cmd: CommandEnvelope, now: int) -> tuple[ResultCode, list[EventEnvelope]]:
        d = decide(self.agg, self.stored, cmd, now=now, seen=cmd.request_id in self.seen)
        self.codes.append((cmd.type, d.code))
        if d.stored is not None:
            self.stored = d.stored
            self.seen.add(cmd.request_id)
            self.log += d.events
            self.sent += d.commands
        return d.code, d.events

    @property
    def state(self) -> ScheduleState:
        assert self.stored is not None
        return ScheduleState.model_validate(self.stored.state)

    def events(self, type_: str) -> list[dict[str, Any]]:
        return [dict(e.body) for e in self.log if e.type == type_]


def tick(s: Schedule, slot: int, now: int) -> tuple[ResultCode, list[EventEnvelope]]:
    timer = s.state.timer_id
    assert timer is not None
    cmd = CommandEnvelope(
        request_id=f"{timer}#{slot}",
        type=TICK,
        aggregate=ref_of(CONTEXT, "report"),
        not_before=T0 + slot * MIN,
        issued_at=now,
    )
    return s.run(cmd, now)


def run_command(event: EventEnvelope, now: int) -> CommandEnvelope:
    """The Run a `run:` timer's ScheduleSet sends, as the firing loop sends it."""
    op = timer_op(event, 0)
    assert isinstance(op, PutTimer)
    return timer_command(op.timer, now)


# --- the aggregate alone -----------------------------------------------------------------


def test_a_failing_tick_commits_ticked_and_a_run_timer_but_none_of_its_commands() -> None:
    handler = Handler(failing={2})
    s = Schedule(handler)
    s.run(enable_command(CONTEXT, s.job, now=T0 - SEC), T0 - SEC)
    code, events = tick(s, 2, T0 + 2 * MIN)
    assert code is ResultCode.COMMITTED
    assert [e.type for e in events] == [TICKED, RUN_FAILED, SCHEDULE_SET]
    assert s.sent == [], "a failed handler's commands never leave"
    assert s.state.last_slot == 2
    (failed,) = s.events(RUN_FAILED)
    timer_id = s.state.timer_id
    assert timer_id is not None
    assert failed["key"] == run_key(timer_id, 2)
    assert "report store down at slot 2" in failed["error"]
    body = dict(events[2].body)
    assert body["key"] == run_key(timer_id, 2)
    assert body["rule"] == {"kind": "once", "at": T0 + 2 * MIN, "coalesce": True}
    assert body["command"]["type"] == RUN
    # The next slot ticks as ever.
    assert tick(s, 3, T0 + 3 * MIN)[0] is ResultCode.COMMITTED
    assert [c.body["slot"] for c in s.sent] == [3]


def test_a_run_that_succeeds_commits_ran_with_the_slots_commands_once() -> None:
    handler = Handler(failing={2})
    s = Schedule(handler)
    s.run(enable_command(CONTEXT, s.job, now=T0 - SEC), T0 - SEC)
    _, events = tick(s, 2, T0 + 2 * MIN)
    run = run_command(events[2], T0 + 2 * MIN)
    assert s.run(run, T0 + 2 * MIN + SEC)[0] is ResultCode.ERROR, "still failing"
    handler.failing.clear()
    code, ran = s.run(run, T0 + 2 * MIN + 2 * SEC)
    assert code is ResultCode.COMMITTED and [e.type for e in ran] == [RAN]
    assert s.events(RAN)[0]["slot"] == 2
    assert [(c.body["slot"], sent_base(c.request_id)) for c in s.sent] == [
        (2, f"{run.request_id}>0")
    ]
    assert handler.calls == [(2, False), (2, True), (2, True)]
    # Sent again (a lost result): the target's dedup answers, nothing runs twice.
    assert s.run(run, T0 + 3 * MIN)[0] is ResultCode.DUPLICATE
    assert len(s.sent) == 1


def test_a_disabled_instances_failed_slot_waits_and_runs_once_enabled() -> None:
    """A disabled instance runs no failed slot, but keeps it: its run is answered ERROR, so
    its run timer retries it, then parks it, and a retry after the enable runs it (jobs
    hunt: it was answered UNCHANGED, the run timer counted the slot done, and the slot,
    whose backfill is its tick's DUPLICATE, was never run again)."""
    handler = Handler(failing={1})
    s = Schedule(handler)
    s.run(enable_command(CONTEXT, s.job, now=T0 - SEC), T0 - SEC)
    _, events = tick(s, 1, T0 + MIN)
    s.run(disable_command(CONTEXT, s.job), T0 + MIN + SEC)
    handler.failing.clear()
    code, _ = s.run(run_command(events[2], T0 + MIN), T0 + 2 * MIN)
    assert code is ResultCode.ERROR
    assert s.sent == [] and handler.calls == [(1, False)]
    s.run(enable_command(CONTEXT, s.job, now=T0 + 3 * MIN), T0 + 3 * MIN)
    assert s.run(run_command(events[2], T0 + MIN), T0 + 4 * MIN)[0] is ResultCode.COMMITTED
    assert handler.calls == [(1, False), (1, True)] and len(s.sent) == 1


@pytest.mark.parametrize(
    "body",
    [{}, {"slot": 1}, {"slot": -1, "due_at": 0, "timer_id": "t", "request_id": "r"}],
)
def test_a_run_that_names_no_slot_is_rejected(body: dict[str, Any]) -> None:
    s = Schedule(Handler())
    s.run(enable_command(CONTEXT, s.job, now=T0 - SEC), T0 - SEC)
    cmd = CommandEnvelope(
        request_id="by-hand", type=RUN, aggregate=ref_of(CONTEXT, "report"), issued_at=T0
    )
    code, _ = s.run(cmd.model_copy(update={"body": body}), T0)
    assert code is ResultCode.REJECTED


def test_run_keys_differ_by_slot_and_timer_and_fit_a_timer_key() -> None:
    keys = {run_key(t, n) for t in ("a", "b", "x" * 500) for n in (0, 1, 10**12)}
    assert len(keys) == 9
    assert all(k.startswith("run:") and len(k) <= 200 for k in keys)


# --- with the timer machinery ------------------------------------------------------------


class Cluster:
    """The schedule, its timer table (fed by its events) and a runner on a fake clock."""

    def __init__(self, store: TimerStore, handler: Handler) -> None:
        self.store = store
        self.schedule = Schedule(handler)
        self.clock = StillClock(T0 - SEC)
        self.ledger = MemoryFailureLedger()
        self.runner = TimerRunner(store, self, self.clock, self.ledger, OPTIONS, [0])
        self.ticked_at: dict[int, int] = {}

    async def decide(self, cmd: CommandEnvelope) -> ResultCode:
        code, events = self.schedule.run(cmd, self.clock.now())
        for e in events:
            if e.type == TICKED:
                self.ticked_at[e.body["slot"]] = self.clock.now()
            op = timer_op(e, 0)
            if isinstance(op, PutTimer):
                await self.store.put(op.timer)
            elif isinstance(op, CancelTimer):
                await self.store.cancel(op.owner, op.key, op.version)
        return code

    async def send(self, timer: Timer) -> SendResult:
        """The runner's sender: the command decided at once, its result code back."""
        return SendResult((await self.decide(timer_command(timer, self.clock.now()))).value)

    async def run_until(self, until: int, step: int = SEC) -> None:
        while self.clock.t < until:
            self.clock.t += step
            await self.runner.run_round()

    async def run_timers(self) -> list[Timer]:
        timers = []
        for e in self.schedule.log:
            if e.type == SCHEDULE_SET and e.body["key"] != TICK_KEY:
                row = await self.store.find(e.aggregate, e.body["key"])
                assert row is not None
                timers.append(row)
        return timers


@pytest.fixture
async def store() -> AsyncIterator[TimerStore]:
    s = open_timer_store("memory://", partitions=1)
    yield s
    await s.close()


async def enabled(store: TimerStore, handler: Handler) -> Cluster:
    c = Cluster(store, handler)
    assert await c.decide(enable_command(CONTEXT, c.schedule.job)) is ResultCode.COMMITTED
    return c


def report_slots(c: Cluster) -> list[int]:
    return sorted(cmd.body["slot"] for cmd in c.schedule.sent)


async def test_a_slot_that_keeps_failing_is_parked_in_the_ledger_while_later_slots_run(
    store: TimerStore,
) -> None:
    handler = Handler(failing={1})
    c = await enabled(store, handler)
    await c.run_until(T0 + 5 * MIN)
    # Every slot ticked on time, the failing one included: the schedule never stopped.
    assert c.ticked_at == {n: T0 + n * MIN for n in range(6)}
    assert report_slots(c) == [0, 2, 3, 4, 5]
    (run,) = await c.run_timers()
    assert (run.status, run.attempts, run.outcome) == (
        TimerStatus.PARKED,
        OPTIONS.retry.max_attempts,
        Outcome.FAILED,
    )
    assert handler.calls.count((1, True)) == OPTIONS.retry.max_attempts
    (entry,) = await c.ledger.entries()
    assert (entry.subscription, entry.target) == (SUB, ref_of(CONTEXT, "report"))
    tick_row = await store.find(ref_of(CONTEXT, "report"), TICK_KEY)
    assert tick_row is not None and tick_row.status is TimerStatus.PENDING
    assert tick_row.slot == 6

    # The operator fixes the store and retries the instance's parked slots.
    handler.failing.clear()
    assert await c.runner.retry(ref_of(CONTEXT, "report")) == 1
    assert await c.ledger.entries() == []
    await c.run_until(c.clock.t + 2 * SEC)
    assert report_slots(c) == [0, 1, 2, 3, 4, 5]
    assert [b["slot"] for b in c.schedule.events(RAN)] == [1]
    (run,) = await c.run_timers()
    assert (run.status, run.outcome) == (TimerStatus.FIRED, Outcome.COMMITTED)


async def test_the_retries_of_a_failed_slot_follow_timer_options_retry(
    store: TimerStore,
) -> None:
    """Run again at once (the round after the tick), then after each backoff, then parked."""
    handler = Handler(failing={0})
    c = await enabled(store, handler)
    await c.run_until(T0 + 30 * SEC, step=100)
    expected = [T0 + 100]
    for failures in range(1, OPTIONS.retry.max_attempts):
        expected.append(expected[-1] + backoff_ms(OPTIONS.retry, failures))
    assert handler.retried_at == expected
    (run,) = await c.run_timers()
    assert run.status is TimerStatus.PARKED


async def test_a_slot_that_fails_once_runs_on_its_first_retry(store: TimerStore) -> None:
    handler = Handler(failing={2})
    c = await enabled(store, handler)
    await c.run_until(T0 + 2 * MIN)
    handler.failing.clear()
    await c.run_until(T0 + 4 * MIN)
    assert report_slots(c) == [0, 1, 2, 3, 4]
    assert handler.calls.count((2, True)) == 1
    (run,) = await c.run_timers()
    assert (run.status, run.outcome) == (TimerStatus.FIRED, Outcome.COMMITTED)
    assert await c.ledger.entries() == []


async def test_an_operators_skip_drops_the_parked_slot(store: TimerStore) -> None:
    handler = Handler(failing={0})
    c = await enabled(store, handler)
    await c.run_until(T0 + MIN)
    (run,) = await c.run_timers()
    assert run.status is TimerStatus.PARKED
    assert await c.runner.skip(ref_of(CONTEXT, "report")) == 1
    (run,) = await c.run_timers()
    assert (run.status, run.outcome) == (TimerStatus.CANCELLED, Outcome.SKIPPED)
    assert await c.ledger.entries() == []
    await c.run_until(T0 + 2 * MIN)
    assert report_slots(c) == [1, 2]


async def test_a_job_failing_every_slot_ticks_on_and_parks_each_slot(
    store: TimerStore,
) -> None:
    handler = Handler(failing=set(range(100)))
    c = await enabled(store, handler)
    await c.run_until(T0 + 4 * MIN)
    assert sorted(c.ticked_at) == [0, 1, 2, 3, 4]
    runs = await c.run_timers()
    assert len(runs) == 5 and len({r.key for r in runs}) == 5
    assert [r.status for r in runs[:4]] == [TimerStatus.PARKED] * 4
    assert report_slots(c) == []
    # One ledger entry per target: the instance, however many of its slots are parked.
    (entry,) = await c.ledger.entries()
    assert len(entry.timers) >= 4
