"""A job failing for weeks keeps its newest failed slots, not one parked timer per slot.

Each failed slot of an instance has a `run:` timer, retried, then parked until an operator
retries or skips it. Unbounded, a job ticking every minute and failing for a week left
~10,000 parked timers that nothing removed. An instance now keeps its newest
`max_failed_runs` failed slots (`MAX_FAILED_RUNS` by default): a slot failing past it
cancels the run timer of the oldest (`ScheduleState.failed_runs`, `runs_to_drop`). First
the aggregate alone, then with a memory timer table and a `TimerRunner` on a fake clock.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from fakes import T0, StillClock

from app.jobs import (
    RAN,
    RUN_FAILED,
    TICK,
    Job,
    JobRun,
    JobScope,
    ScheduleState,
    enable_command,
    ref_of,
    run_key,
    schedule_aggregate,
)
from app.jobs.runs import MAX_DROPS_PER_FAILURE, MAX_FAILED_RUNS, runs_to_drop
from app.jobs.schedule_state import apply_schedule_event
from app.model.aggregate import Event
from app.model.decide import StoredAggregate, decide
from app.protocol.wire import SCHEDULE_CANCELLED, CommandEnvelope, ResultCode
from app.timers.runner import SendResult, TimerOptions, TimerRunner
from app.timers.runner.options import RetryPolicy
from app.timers.sender import timer_command
from app.timers.subscription import CancelTimer, PutTimer, TimerOp, timer_op
from tables import open_timer_store
from tables.ledger import MemoryFailureLedger
from tables.rules import IntervalRule
from tables.store import TimerStore
from tables.timer import Outcome, Timer, TimerStatus

CONTEXT = "ops"
SEC = 1000
MIN = 60 * SEC
RULE = IntervalRule(start=T0, every=MIN)
INSTANCE = ref_of(CONTEXT, "report")
OPTIONS = TimerOptions(retry=RetryPolicy(max_attempts=2))


@dataclass
class Handler:
    """Raises while `failing`; counts its runs by slot."""

    failing: bool = True
    runs: list[tuple[int, bool]] = field(default_factory=list)

    def __call__(self, run: JobRun) -> None:
        self.runs.append((run.slot, run.retried))
        if self.failing:
            raise RuntimeError(f"down at slot {run.slot}")


class Instance:
    """One schedule instance decided as a node decides it (state, dedup, log), keeping
    `keep` failed slots."""

    def __init__(self, handler: Handler, keep: int = MAX_FAILED_RUNS) -> None:
        self.job = Job("report", JobScope.SYSTEM, RULE, handler)
        self.agg = schedule_aggregate(CONTEXT, [self.job], 1, max_failed_runs=keep)
        self.stored: StoredAggregate | None = None
        self.seen: set[str] = set()
        self.cancelled: list[str] = []

    def run(self, cmd: CommandEnvelope, now: int) -> tuple[ResultCode, list[TimerOp]]:
        d = decide(self.agg, self.stored, cmd, now=now, seen=cmd.request_id in self.seen)
        if d.stored is None:
            return d.code, []
        self.stored = d.stored
        self.seen.add(cmd.request_id)
        self.cancelled += [e.body["key"] for e in d.events if e.type == SCHEDULE_CANCELLED]
        return d.code, [op for e in d.events if (op := timer_op(e, 0)) is not None]

    @property
    def state(self) -> ScheduleState:
        assert self.stored is not None
        return ScheduleState.model_validate(self.stored.state)

    def tick(self, slot: int) -> tuple[ResultCode, list[TimerOp]]:
        timer = self.state.timer_id
        assert timer is not None
        cmd = CommandEnvelope(
            request_id=f"{timer}#{slot}",
            type=TICK,
            aggregate=INSTANCE,
            not_before=T0 + slot * MIN,
            issued_at=T0 + slot * MIN,
        )
        return self.run(cmd, T0 + slot * MIN)

    def key(self, slot: int) -> str:
        timer = self.state.timer_id
        assert timer is not None
        return run_key(timer, slot)


def enabled(handler: Handler, keep: int = MAX_FAILED_RUNS) -> Instance:
    s = Instance(handler, keep)
    code, _ = s.run(enable_command(CONTEXT, s.job, now=T0 - SEC), T0 - SEC)
    assert code is ResultCode.COMMITTED
    return s


# --- the aggregate alone -----------------------------------------------------------------


def test_a_job_failing_every_slot_keeps_its_newest_failed_slots() -> None:
    s = enabled(Handler())
    slots = MAX_FAILED_RUNS + 30
    for n in range(slots):
        assert s.tick(n)[0] is ResultCode.COMMITTED
        assert len(s.state.failed_runs) <= MAX_FAILED_RUNS
    # The newest MAX_FAILED_RUNS wait to run again; the older ones' run timers were
    # cancelled, oldest first, one per failure past the bound.
    assert s.state.failed_runs == [s.key(n) for n in range(30, slots)]
    assert s.cancelled == [s.key(n) for n in range(30)]


def test_a_failed_slot_that_ran_leaves_the_list_and_is_never_dropped() -> None:
    handler = Handler()
    s = enabled(handler, keep=2)
    _, ops = s.tick(0)
    (put,) = [op for op in ops if isinstance(op, PutTimer)]
    handler.failing = False
    code, _ = s.run(timer_command(put.timer, T0 + SEC), T0 + SEC)
    assert code is ResultCode.COMMITTED
    assert s.state.failed_runs == [], "its Ran took it off"
    handler.failing = True
    for n in (1, 2, 3):
        s.tick(n)
    assert s.state.failed_runs == [s.key(2), s.key(3)]
    assert s.cancelled == [s.key(1)], "slot 0 ran: only a slot still waiting is dropped"


def test_a_backlog_folded_from_an_older_log_drains_a_few_runs_a_failure() -> None:
    """A state folded again from a log written before the bound names every failed slot:
    one failure does not cancel them all in one transaction."""
    s = enabled(Handler(), keep=1_000)
    for n in range(25):
        s.tick(n)
    assert len(s.state.failed_runs) == 25 and s.cancelled == []
    s.agg = schedule_aggregate(CONTEXT, [s.job], 1, max_failed_runs=5)
    s.tick(25)
    assert len(s.cancelled) == MAX_DROPS_PER_FAILURE
    assert len(s.state.failed_runs) == 26 - MAX_DROPS_PER_FAILURE
    s.tick(26)
    assert s.state.failed_runs == [s.key(n) for n in range(20, 27)]
    s.tick(27)
    assert s.state.failed_runs == [s.key(n) for n in range(23, 28)], "drained"
    assert s.cancelled == [s.key(n) for n in range(23)]


def test_runs_to_drop() -> None:
    keys = [f"run:k#{n}" for n in range(8)]
    assert runs_to_drop(keys[:4], keep=5) == []
    assert runs_to_drop(keys[:5], keep=5) == keys[:1]
    assert runs_to_drop(keys, keep=1) == keys[: min(8, MAX_DROPS_PER_FAILURE)]
    assert runs_to_drop(keys, keep=3) == keys[:6]


def test_a_state_without_failures_is_written_as_before() -> None:
    s = enabled(Handler(failing=False))
    s.tick(0)
    assert "failed_runs" not in s.state.model_dump(mode="json")
    with pytest.raises(ValueError, match="max_failed_runs"):
        schedule_aggregate(CONTEXT, [], 1, max_failed_runs=0)


def test_the_fold_takes_a_run_failed_without_its_key() -> None:
    """An event of another writer may leave the key out: the slot names its run timer."""
    s = enabled(Handler())
    s.tick(0)
    assert s.state.failed_runs == [s.key(0)]
    body = {"slot": 1, "due_at": T0 + MIN, "timer_id": s.state.timer_id, "error": "x"}
    event = Event(type=RUN_FAILED, body=body, id="e-1", version=9, created_at=T0)
    state = apply_schedule_event(s.state, event)
    assert state.failed_runs == [s.key(0), s.key(1)]
    ran = Event(type=RAN, body={**body, "request_id": "r"}, id="e-2", version=10, created_at=T0)
    assert apply_schedule_event(state, ran).failed_runs == [s.key(0)]


# --- with the timer machinery ------------------------------------------------------------


class Cluster:
    """The instance, its timer table (fed by its events) and a runner on a fake clock."""

    def __init__(self, store: TimerStore, handler: Handler, keep: int) -> None:
        self.store = store
        self.instance = Instance(handler, keep)
        self.clock = StillClock(T0 - SEC)
        self.ledger = MemoryFailureLedger()
        self.runner = TimerRunner(store, self, self.clock, self.ledger, OPTIONS, [0])

    async def decide(self, cmd: CommandEnvelope) -> ResultCode:
        code, ops = self.instance.run(cmd, self.clock.now())
        for op in ops:
            if isinstance(op, PutTimer):
                await self.store.put(op.timer)
            elif isinstance(op, CancelTimer):
                await self.store.cancel(op.owner, op.key, op.version)
        return code

    async def send(self, timer: Timer) -> SendResult:
        return SendResult((await self.decide(timer_command(timer, self.clock.now()))).value)

    async def run_until(self, until: int, step: int = 5 * SEC) -> None:
        while self.clock.t < until:
            self.clock.t += step
            await self.runner.run_round()

    async def runs(self) -> dict[int, Timer]:
        """The run timers of the instance, by slot."""
        rows = await self.store.timers_of(INSTANCE)
        return {int(t.key.rpartition("#")[2]): t for t in rows if t.key.startswith("run:")}


@pytest.fixture
async def store() -> AsyncIterator[TimerStore]:
    s = open_timer_store("memory://", partitions=1)
    yield s
    await s.close()


async def test_a_failing_job_parks_only_its_newest_slots(store: TimerStore) -> None:
    handler = Handler()
    c = Cluster(store, handler, keep=3)
    assert await c.decide(enable_command(CONTEXT, c.instance.job)) is ResultCode.COMMITTED
    await c.run_until(T0 + 8 * MIN + 30 * SEC)  # slot 8 retried, then parked
    runs = await c.runs()
    assert sorted(runs) == list(range(9)), "every slot ticked and failed"
    parked = sorted(n for n, t in runs.items() if t.status is TimerStatus.PARKED)
    assert parked == [6, 7, 8], "the newest three wait for an operator"
    for n in range(6):
        assert (runs[n].status, runs[n].outcome) == (TimerStatus.CANCELLED, Outcome.CANCELLED)
    assert c.instance.state.failed_runs == [c.instance.key(n) for n in (6, 7, 8)]

    # Fixed, the operator's retry runs the three kept; none is left waiting.
    handler.failing = False
    mark = len(handler.runs)
    assert await c.runner.retry(INSTANCE) == 3
    await c.run_until(c.clock.t + 10 * SEC)
    assert sorted(n for n, retried in handler.runs[mark:] if retried) == [6, 7, 8]
    runs = await c.runs()
    assert all(runs[n].outcome is Outcome.COMMITTED for n in (6, 7, 8))
    assert c.instance.state.failed_runs == []
