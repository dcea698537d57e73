"""Trigger and backfill of job instances (issue 22): the schedule aggregate's decisions, the
slots a backfill finds in an instance's log, and the commands the CLI makes of them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import orjson
import pytest
from fakes import T0, sent_base
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

import app.cli.common
import app.cli.job_options
import app.cli.job_runs
from app.cli import cli
from app.cli.job_actions import instance_commands
from app.errors import JobsCliError
from app.jobs import (
    BACKFILLED,
    DEFAULT_REQUEST_ID_WINDOW_MS,
    RUN,
    TICK,
    TICKED,
    TRIGGER,
    TRIGGERED,
    TRIGGERED_SLOT,
    BackfillError,
    BackfillSlot,
    Job,
    JobRun,
    JobScope,
    ScheduleState,
    TickTimer,
    backfill_command,
    backfill_slots,
    disable_command,
    enable_command,
    ref_of,
    reschedule_command,
    schedule_aggregate,
    tick_timers,
    trigger_command,
)
from app.model.decide import StoredAggregate, decide
from app.protocol.wire import CommandEnvelope, CommandResult, EventEnvelope, ResultCode
from app.service import Service
from tables import DEFAULT_TENANT, AggregateRef, CronRule, IntervalRule
from tables.slots import Slot, first_slot, next_slot

CONTEXT = "ops"
MIN = 60_000
RULE = IntervalRule(start=T0, every=MIN)
TARGET = AggregateRef(context="shop", aggregate="report", id="r-1")


@dataclass
class Handler:
    runs: list[JobRun] = field(default_factory=list)
    failing: bool = False

    def __call__(self, run: JobRun) -> None:
        self.runs.append(run)
        run.send(TARGET, "shop.RunReport", {"slot": run.slot})
        if self.failing:
            raise RuntimeError("report store down")


class Instance:
    """One instance decided as the node decides it: state, dedup by request id, its log."""

    def __init__(self, handler: Handler, rule: IntervalRule | CronRule = RULE) -> None:
        self.job = Job("report", JobScope.SYSTEM, rule, handler)
        self.agg = schedule_aggregate(CONTEXT, [self.job], 1)
        self.stored: StoredAggregate | None = None
        self.seen: set[str] = set()
        self.log: list[EventEnvelope] = []
        self.sent: list[CommandEnvelope] = []

    def run(self, cmd: CommandEnvelope, now: int) -> ResultCode:
        d = decide(self.agg, self.stored, cmd, now=now, seen=cmd.request_id in self.seen)
        if d.stored is not None:
            self.stored = d.stored
            self.seen.add(cmd.request_id)
            self.log += d.events
            self.sent += d.commands
        return d.code

    @property
    def state(self) -> ScheduleState:
        assert self.stored is not None
        return ScheduleState.model_validate(self.stored.state)

    def tick(self, slot: int, now: int) -> ResultCode:
        """The live tick of `slot` of the current timer, as the firing loop sends it."""
        timer = self.state.timer_id
        assert timer is not None
        rule = self.state.rule
        assert rule is not None
        cmd = CommandEnvelope(
            request_id=f"{timer}#{slot}",
            type=TICK,
            aggregate=ref_of(CONTEXT, "report"),
            not_before=T0 + slot * MIN,
            issued_at=now,
        )
        return self.run(cmd, now)

    def backfill(self, start: int, until: int, now: int) -> list[ResultCode]:
        slots = backfill_slots(tick_timers(self.log), start, until)
        return [self.run(backfill_command(ref_of(CONTEXT, "report"), s), now) for s in slots]

    def count(self, type_: str) -> int:
        return sum(e.type == type_ for e in self.log)


def enabled(handler: Handler, rule: IntervalRule | CronRule = RULE) -> Instance:
    s = Instance(handler, rule)
    assert s.run(enable_command(CONTEXT, s.job, now=T0 - 1), T0 - 1) is ResultCode.COMMITTED
    return s


# --- trigger -------------------------------------------------------------------------------


def test_a_trigger_runs_once_now_and_leaves_the_schedule_as_it_was() -> None:
    handler = Handler()
    s = enabled(handler)
    s.tick(1, T0 + MIN)
    before = s.state
    cmd = trigger_command(CONTEXT, s.job, request_id="deploy-42", now=T0 + 90_000)
    assert cmd.type == TRIGGER
    assert s.run(cmd, T0 + 90_000) is ResultCode.COMMITTED
    assert s.state == before, "timer, last slot and rule unchanged"
    (run,) = [r for r in handler.runs if r.triggered]
    assert (run.slot, run.due_at, run.request_id) == (TRIGGERED_SLOT, T0 + 90_000, "deploy-42")
    assert [sent_base(c.request_id) for c in s.sent][-1] == "deploy-42>0"
    # the same trigger again (a retry, or the same command re-sent): it ran once
    assert s.run(cmd, T0 + 91_000) is ResultCode.DUPLICATE
    assert s.count(TRIGGERED) == 1 and len(handler.runs) == 2
    # the live schedule goes on from where it was
    assert s.tick(2, T0 + 2 * MIN) is ResultCode.COMMITTED
    assert s.state.last_slot == 2


def test_a_paused_instance_can_be_triggered_and_stays_paused() -> None:
    handler = Handler()
    s = enabled(handler)
    s.run(disable_command(CONTEXT, s.job, now=T0), T0)
    assert s.run(trigger_command(CONTEXT, s.job, now=T0 + 1), T0 + 1) is ResultCode.COMMITTED
    assert len(handler.runs) == 1 and not s.state.enabled


def test_a_trigger_whose_handler_fails_commits_nothing_and_can_be_sent_again() -> None:
    handler = Handler(failing=True)
    s = enabled(handler)
    cmd = trigger_command(CONTEXT, s.job, request_id="t-1", now=T0)
    assert s.run(cmd, T0) is ResultCode.ERROR
    assert s.count(TRIGGERED) == 0 and s.sent == []
    handler.failing = False
    assert s.run(cmd, T0 + 1) is ResultCode.COMMITTED
    assert s.count(TRIGGERED) == 1


def test_an_instance_never_enabled_cannot_be_triggered_or_backfilled() -> None:
    s = Instance(Handler())
    code = s.run(trigger_command(CONTEXT, s.job, now=T0), T0)
    assert code is ResultCode.SCHEDULE_JOB_INVALID
    slot = BackfillSlot("x/0", 0, T0)
    assert s.run(backfill_command(ref_of(CONTEXT, "report"), slot), T0) is code


# --- backfill on the aggregate ---------------------------------------------------------------


def test_a_live_slot_then_a_backfill_over_it_applies_each_slot_once() -> None:
    handler = Handler()
    s = enabled(handler)
    assert s.tick(2, T0 + 2 * MIN) is ResultCode.COMMITTED  # slots 0, 1 coalesced away
    codes = s.backfill(T0, T0 + 3 * MIN, now=T0 + 3 * MIN + 5)
    assert codes == [ResultCode.COMMITTED] * 2 + [ResultCode.DUPLICATE, ResultCode.COMMITTED]
    assert s.backfill(T0, T0 + 3 * MIN, now=T0 + 4 * MIN) == [ResultCode.DUPLICATE] * 4
    # slot 3 was backfilled before its live tick: the live tick is the duplicate
    assert s.tick(3, T0 + 3 * MIN + 10) is ResultCode.DUPLICATE
    assert sorted(r.slot for r in handler.runs) == [0, 1, 2, 3]
    assert s.count(TICKED) + s.count(BACKFILLED) == 4
    timer = s.state.timer_id
    assert sorted(sent_base(c.request_id) for c in s.sent) == [f"{timer}#{n}>0" for n in range(4)]
    assert s.state.last_slot == 2, "a backfill does not move the live schedule"
    assert s.tick(4, T0 + 4 * MIN) is ResultCode.COMMITTED


def test_a_backfill_is_refused_for_a_slot_not_due_or_not_under_its_own_request_id() -> None:
    s = enabled(Handler())
    ref = ref_of(CONTEXT, "report")
    timer = s.state.timer_id
    assert timer is not None
    future = backfill_command(ref, BackfillSlot(timer, 5, T0 + 5 * MIN))
    assert s.run(future, T0 + MIN) is ResultCode.SCHEDULE_JOB_INVALID
    renamed = backfill_command(ref, BackfillSlot(timer, 1, T0 + MIN))
    renamed = renamed.model_copy(update={"request_id": "my-own"})
    assert s.run(renamed, T0 + 2 * MIN) is ResultCode.SCHEDULE_JOB_INVALID
    assert s.sent == []


def test_a_backfill_of_a_slot_not_due_under_its_rule_is_refused_whatever_its_due_at() -> None:
    """Its due_at is the sender's word: a slot of the current timer due at T0+5 min, sent
    at T0+1 min naming T0, ran early, and its live tick (the same request id) was then a
    DUPLICATE: the slot never ran on time."""
    h = Handler()
    s = enabled(h)
    timer = s.state.timer_id
    assert timer is not None
    lying = backfill_command(ref_of(CONTEXT, "report"), BackfillSlot(timer, 5, T0))
    assert s.run(lying, T0 + MIN) is ResultCode.SCHEDULE_JOB_INVALID
    assert h.runs == []
    assert s.tick(5, T0 + 5 * MIN) is ResultCode.COMMITTED
    assert [r.slot for r in h.runs] == [5]


def test_a_run_of_a_slot_that_has_not_ticked_is_refused() -> None:
    """A `wow.schedule.Run` runs again a slot whose handler failed, so its slot ticked: one
    another writer sends for a slot to come ran it early, and the live tick again (under
    another request id: the target applied both)."""
    h = Handler()
    s = enabled(h)
    timer = s.state.timer_id
    assert timer is not None
    body = {"slot": 3, "due_at": T0 + 3 * MIN, "timer_id": timer, "request_id": f"{timer}#3"}
    forged = CommandEnvelope(
        request_id="forged-run",
        type=RUN,
        aggregate=ref_of(CONTEXT, "report"),
        issued_at=T0 + MIN,
        body=body,
    )
    assert s.run(forged, T0 + MIN) is ResultCode.REJECTED
    assert h.runs == []
    assert s.tick(3, T0 + 3 * MIN) is ResultCode.COMMITTED
    assert [(r.slot, r.retried) for r in h.runs] == [(3, False)]


@pytest.mark.parametrize("ends", [{"count": 1}, {"until": T0 + 30_000}])
def test_a_rule_that_has_ended_is_refused_not_taken_to_tick_never(ends: dict[str, int]) -> None:
    """Its tick timer was cancelled at once (the subscription takes an ended rule for a
    cancel): the instance said enabled and never ran again."""
    h = Handler()
    s = enabled(h)
    assert s.tick(0, T0) is ResultCode.COMMITTED
    rule = {"kind": "interval", "start": T0, "every": MIN, **ends}
    cmd = reschedule_command(CONTEXT, s.job, rule, now=T0 + 5 * MIN)
    assert s.run(cmd, T0 + 5 * MIN) is ResultCode.SCHEDULE_JOB_INVALID
    assert s.state.rule is not None and "count" not in s.state.rule and "until" not in s.state.rule


def test_an_enable_of_a_default_or_kept_rule_that_has_ended_is_refused() -> None:
    """An Enable naming no rule takes the kept override or the default: ended, it was taken
    as any (its tick timer cancelled at once). The same rule sent again to an instance that
    has it is no change, answered as before."""
    ended = IntervalRule(start=T0 - 10 * MIN, every=MIN, count=2)
    s = Instance(Handler(), ended)
    assert s.run(enable_command(CONTEXT, s.job, now=T0), T0) is ResultCode.SCHEDULE_JOB_INVALID
    s = enabled(Handler())
    kept = enable_command(CONTEXT, s.job, rule={"count": 3}, now=T0)
    assert s.run(kept, T0) is ResultCode.COMMITTED
    again = enable_command(CONTEXT, s.job, rule={"count": 3}, now=T0 + 10 * MIN)
    assert s.run(again, T0 + 10 * MIN) is ResultCode.UNCHANGED  # no change, as before
    assert (
        s.run(disable_command(CONTEXT, s.job, now=T0 + 10 * MIN), T0 + 10 * MIN)
        is ResultCode.COMMITTED
    )
    later = enable_command(CONTEXT, s.job, now=T0 + 11 * MIN)
    assert s.run(later, T0 + 11 * MIN) is ResultCode.SCHEDULE_JOB_INVALID


def test_a_backfill_decided_once_its_slot_left_the_request_id_window_is_refused() -> None:
    """The node forgets a request id applied at or before `now - window`; a live run is
    applied at its slot's due time at the earliest, so a slot due then may have run."""
    s = enabled(Handler())
    ref = ref_of(CONTEXT, "report")
    timer = s.state.timer_id
    assert timer is not None
    window = DEFAULT_REQUEST_ID_WINDOW_MS
    slot = backfill_command(ref, BackfillSlot(timer, 1, T0 + MIN))
    assert s.run(slot, T0 + MIN + window) is ResultCode.SCHEDULE_JOB_INVALID
    assert s.sent == [] and s.count(BACKFILLED) == 0
    assert s.run(slot, T0 + MIN + window - 1) is ResultCode.COMMITTED
    assert s.count(BACKFILLED) == 1


@given(window=st.integers(60_000, 10**12), late=st.integers(0, 10**12))
def test_the_window_a_schedule_is_given_bounds_the_slots_it_backfills(
    window: int, late: int
) -> None:
    job = Job("report", JobScope.SYSTEM, RULE, Handler())
    agg = schedule_aggregate(CONTEXT, [job], 1, request_id_window_ms=window)
    enable = enable_command(CONTEXT, job, now=T0 - 1)
    on = decide(agg, None, enable, now=T0 - 1, seen=False)
    timer = ScheduleState.model_validate(on.stored.state if on.stored else {}).timer_id
    assert timer is not None
    cmd = backfill_command(ref_of(CONTEXT, "report"), BackfillSlot(timer, 0, T0))
    got = decide(agg, on.stored, cmd, now=T0 + late, seen=False).code
    expected = ResultCode.SCHEDULE_JOB_INVALID if late >= window else ResultCode.COMMITTED
    assert got is expected


def test_a_paused_window_is_backfilled_under_the_ids_of_the_timer_before_it() -> None:
    handler = Handler()
    s = enabled(handler)
    first = s.state.timer_id
    s.tick(1, T0 + MIN)
    s.run(disable_command(CONTEXT, s.job, now=T0 + 90_000), T0 + 90_000)
    # resumed after slots 2 and 3: a new timer, whose first slot is 4
    s.run(enable_command(CONTEXT, s.job, now=T0 + 4 * MIN - 1), T0 + 4 * MIN - 1)
    second = s.state.timer_id
    assert second != first
    s.tick(4, T0 + 4 * MIN)
    slots = backfill_slots(tick_timers(s.log), T0 + MIN, T0 + 5 * MIN)
    assert [x.request_id for x in slots] == [
        f"{first}#1",
        f"{first}#2",
        f"{first}#3",
        f"{second}#4",
        f"{second}#5",
    ]
    codes = s.backfill(T0 + MIN, T0 + 4 * MIN, now=T0 + 4 * MIN + 1)
    dup, ok = ResultCode.DUPLICATE, ResultCode.COMMITTED
    assert codes == [dup, ok, ok, dup]
    assert sorted(r.slot for r in handler.runs) == [1, 2, 3, 4]


def test_a_timer_set_by_a_node_whose_clock_is_behind_ends_the_one_it_retired() -> None:
    """Node X enabled the instance at T0 + 5 s by its clock; the partition moved to node Y,
    3 s behind, which rescheduled it at T0 + 2 s by its own. Timers ordered by `set_at`
    put the retired one last: a backfill gave it every slot of the range, the new timer's
    that ran live among them, under request ids never applied, and they ran again on the
    old rule. In the log's order the retired timer ends where its successor began."""
    handler = Handler()
    s = Instance(handler)
    assert s.run(enable_command(CONTEXT, s.job, now=T0 + 5_000), T0 + 5_000) is ResultCode.COMMITTED
    retired = s.state.timer_id
    every_2 = reschedule_command(CONTEXT, s.job, {"every": 2 * MIN}, now=T0 + 2_000)
    assert s.run(every_2, T0 + 2_000) is ResultCode.COMMITTED
    timer, rule = s.state.timer_id, IntervalRule.model_validate(s.state.rule)
    assert timer is not None and timer != retired and rule.every == 2 * MIN
    slot = first_slot(rule, T0 + 2_000)
    for _ in range(5):  # the new timer's live ticks
        assert slot is not None
        tick = CommandEnvelope(
            request_id=f"{timer}#{slot.index}",
            type=TICK,
            aggregate=ref_of(CONTEXT, "report"),
            not_before=slot.due_at,
            issued_at=slot.due_at,
        )
        assert s.run(tick, slot.due_at) is ResultCode.COMMITTED
        slot = next_slot(rule, slot)
    live = [r.due_at for r in handler.runs]
    assert live == [T0 + k * 2 * MIN for k in range(1, 6)]

    planned = backfill_slots(tick_timers(s.log), T0, T0 + 12 * MIN)
    assert {x.timer_id for x in planned} == {timer}
    assert [x.due_at for x in planned] == [T0 + k * 2 * MIN for k in range(1, 7)]
    codes = s.backfill(T0, T0 + 12 * MIN, now=T0 + 12 * MIN + 1)
    assert codes == [ResultCode.DUPLICATE] * 5 + [ResultCode.COMMITTED]
    assert [r.due_at for r in handler.runs] == [*live, T0 + 12 * MIN], "each slot ran once"


def test_a_backfill_whose_handler_fails_commits_nothing_and_runs_again_later() -> None:
    handler = Handler(failing=True)
    s = enabled(handler)
    assert s.backfill(T0, T0 + MIN, now=T0 + MIN) == [ResultCode.ERROR] * 2
    assert s.count(BACKFILLED) == 0 and s.sent == []
    handler.failing = False
    assert s.backfill(T0, T0 + MIN, now=T0 + MIN) == [ResultCode.COMMITTED] * 2


# --- the slots of a range --------------------------------------------------------------------


def test_the_slots_of_a_range_follow_each_timer_and_end_with_it() -> None:
    a = TickTimer("a/0", RULE, T0, [Slot(0, T0)])
    every_5 = IntervalRule(start=T0, every=5 * MIN)
    b = TickTimer("b/0", every_5, T0 + 10 * MIN + 1, [Slot(3, T0 + 15 * MIN)])
    slots = backfill_slots([a, b], T0 + 8 * MIN, T0 + 20 * MIN)
    assert [(x.timer_id, x.slot) for x in slots] == [
        ("a/0", 8),
        ("a/0", 9),
        ("a/0", 10),  # due before b was set: still a's
        ("b/0", 3),
        ("b/0", 4),
    ]
    assert backfill_slots([a, b], T0 - 5 * MIN, T0 - 1) == [], "before the first timer: none"
    assert backfill_slots([], T0, T0 + MIN) == []


def test_a_timer_ends_where_any_later_one_began_whose_clock_was_behind() -> None:
    """a, then b, then c, in the log's order; c was set by a node whose clock was behind
    b's node's, before b by the clocks: from c's start the slots are c's, not a's too."""
    a = TickTimer("a/0", RULE, T0, [Slot(0, T0)])
    b = TickTimer("b/0", RULE, T0 + 10 * MIN + 1, [Slot(11, T0 + 11 * MIN)])
    c = TickTimer("c/0", RULE, T0 + 5 * MIN + 1, [Slot(6, T0 + 6 * MIN)])
    slots = backfill_slots([a, b, c], T0, T0 + 8 * MIN)
    assert [(x.timer_id, x.slot) for x in slots] == [
        *[("a/0", k) for k in range(6)],
        ("c/0", 6),
        ("c/0", 7),
        ("c/0", 8),
    ]


def test_a_range_of_too_many_slots_or_upside_down_is_refused() -> None:
    a = TickTimer("a/0", IntervalRule(start=0, every=1), 0, [Slot(0, 0)])
    assert len(backfill_slots([a], 0, 9_999)) == 10_000
    with pytest.raises(BackfillError, match="more than 10000 slots"):
        backfill_slots([a], 0, 10_000)
    with pytest.raises(BackfillError, match=r"ends \(4\) before it starts \(5\)"):
        backfill_slots([a], 5, 4)


def _cron_slots(rule: CronRule, set_at: int, n: int) -> list[Slot]:
    slots: list[Slot] = []
    slot = first_slot(rule, set_at)
    while slot is not None and len(slots) < n:
        slots.append(slot)
        slot = next_slot(rule, slot)
    return slots


@given(
    st.integers(min_value=0, max_value=200), st.integers(min_value=0, max_value=60), st.booleans()
)
def test_cron_slot_indexes_are_those_the_timer_steps_through(
    lo: int, width: int, anchored: bool
) -> None:
    rule = CronRule(expr="*/7 * * * *", zone="Europe/Berlin")
    live = _cron_slots(rule, T0, 300)
    known = [live[0], *(live[::37] if anchored else [])]
    timer = TickTimer("c/0", rule, T0, known)
    start, end = live[lo].due_at - 1, live[lo + width].due_at
    got = backfill_slots([timer], start, end)
    assert [(x.slot, x.due_at) for x in got] == [tuple(s) for s in live[lo : lo + width + 1]]


def test_cron_indexes_count_from_the_last_slot_the_log_knows() -> None:
    # After a long catch-up the runner estimates an index: the log's tick tells it.
    rule = CronRule(expr="0 * * * *")
    live = _cron_slots(rule, T0, 5)
    timer = TickTimer("c/0", rule, T0, [live[0], Slot(900, live[3].due_at)])
    got = backfill_slots([timer], live[2].due_at, live[4].due_at)
    assert [x.slot for x in got] == [2, 900, 901]


def test_tick_timers_reads_the_tick_timers_and_their_known_slots() -> None:
    s = enabled(Handler())
    s.tick(3, T0 + 3 * MIN)
    s.run(reschedule_command(CONTEXT, s.job, {"every": 2 * MIN}, now=T0 + 200_000), T0 + 200_000)
    timers = tick_timers(s.log)
    assert [t.set_at for t in timers] == [T0 - 1, T0 + 200_000]
    assert timers[0].known == [Slot(0, T0), Slot(3, T0 + 3 * MIN)]
    assert timers[1].rule == IntervalRule(start=T0, every=2 * MIN)
    assert timers[1].known == [Slot(2, T0 + 4 * MIN)]


# --- the CLI's commands ----------------------------------------------------------------------


def test_a_trigger_request_id_is_kept_or_suffixed_per_instance() -> None:
    sweep = Job("sweep", JobScope.SHARDED, RULE, Handler())
    (one,) = instance_commands("trigger", CONTEXT, sweep, partitions=4, partition=1, request_id="r")
    assert (one.type, one.request_id) == (TRIGGER, "trigger:r")
    many = instance_commands("trigger", CONTEXT, sweep, partitions=4, request_id="r")
    assert [c.request_id for c in many] == [
        f"trigger:r@{DEFAULT_TENANT}/{c.aggregate.id}" for c in many
    ]
    again = instance_commands("trigger", CONTEXT, sweep, partitions=4, request_id="r")
    assert [c.request_id for c in again] == [c.request_id for c in many]
    fresh = instance_commands("trigger", CONTEXT, sweep, partitions=4)
    assert len({c.request_id for c in fresh}) == 4
    for bad in (" r", "", "r\n1", "r\x1b[2J"):
        with pytest.raises(JobsCliError, match=re.escape(f"--request-id {bad!r}: give 1-200")):
            instance_commands("trigger", CONTEXT, sweep, partitions=4, request_id=bad)


# --- the CLI, its Kafka reads and writes replaced by an instance decided here ---------------

BACKFILL_ARGS = ["jobs", "backfill", "--service", f"{__name__}:SERVICE", "--context", CONTEXT]
BACKFILL_ARGS += ["--job", "report"]
CLI_HANDLER = Handler()
SERVICE = Service(
    aggregates=(), jobs={CONTEXT: (Job("report", JobScope.SYSTEM, RULE, CLI_HANDLER),)}
)


@pytest.fixture
def cli_instance(monkeypatch: pytest.MonkeyPatch) -> Instance:
    """The CLI's reads see `s.log`; its sends are decided by `s` at the fake now."""
    s = enabled(Handler())
    s.tick(1, T0 + MIN)
    now = T0 + 3 * MIN

    async def events(
        bootstrap: object, ref: AggregateRef, partitions: int, limits: object
    ) -> list[EventEnvelope]:
        assert ref == ref_of(CONTEXT, "report")
        return list(s.log)

    async def send(
        bootstrap: object,
        partitions: int,
        commands: list[CommandEnvelope],
        wait: float,
        replication: object,
    ) -> dict[str, CommandResult]:
        return {
            c.request_id: CommandResult(
                request_id=c.request_id, aggregate=c.aggregate, code=s.run(c, now), decided_at=now
            )
            for c in commands
        }

    async def no_check(kafka: object) -> None:
        return None

    monkeypatch.setattr(app.cli.job_runs, "read_instance_events", events)
    monkeypatch.setattr(app.cli.job_options, "send_and_wait", send)
    monkeypatch.setattr(app.cli.job_runs, "now_ms", lambda: now)
    monkeypatch.setattr(app.cli.common, "check_access", no_check)
    return s


def _range(start: int, end: int) -> list[str]:
    return [*BACKFILL_ARGS, "--from", str(start), "--until", str(end)]


def test_backfill_dry_run_prints_the_slots_and_sends_nothing(cli_instance: Instance) -> None:
    timer = cli_instance.state.timer_id
    result = CliRunner().invoke(cli, [*_range(T0, T0 + 2 * MIN), "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    lines = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert [(x["slot"], x["due_at"], x["request_id"]) for x in lines] == [
        (n, T0 + n * MIN, f"{timer}#{n}") for n in range(3)
    ]
    assert cli_instance.count(BACKFILLED) == 0
    text = CliRunner().invoke(cli, [*_range(T0, T0 + 2 * MIN), "--dry-run"])
    assert text.exit_code == 0 and "3 slot(s) to backfill; dry run: nothing sent" in text.stderr
    assert f"slot 1\t2027-01-15T08:01:00.000+00:00\t{timer}#1" in text.stdout


def test_backfill_runs_the_range_and_says_which_slots_had_run(cli_instance: Instance) -> None:
    result = CliRunner().invoke(cli, [*_range(T0, T0 + 2 * MIN), "--json"])
    assert result.exit_code == 0, result.output
    codes = [orjson.loads(line)["code"] for line in result.stdout.splitlines()]
    assert codes == ["COMMITTED", "DUPLICATE", "COMMITTED"]
    again = CliRunner().invoke(cli, _range(T0, T0 + 2 * MIN))
    assert again.exit_code == 0 and again.stdout.count(": DUPLICATE") == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--from", "yesterday", "--until", "0"], "--from"),
        (["--from", str(T0 + MIN), "--until", str(T0)], f"--until {T0} is before --from"),
        (["--from", str(T0), "--until", str(T0 + 4 * MIN)], "is after now (2027-01-15T08:03"),
        (["--from", "0", "--until", str(T0), "--tenant", "t1"], "--tenant is for TENANT jobs"),
    ],
)
def test_backfill_of_bad_input_exits_2_with_one_line(
    cli_instance: Instance, args: list[str], message: str
) -> None:
    result = CliRunner().invoke(cli, [*BACKFILL_ARGS, *args])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ") and message in line, line
    assert cli_instance.count(BACKFILLED) == 0


def test_backfill_of_too_many_slots_exits_2_and_sends_nothing(
    cli_instance: Instance, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app.cli.job_runs, "MAX_BACKFILL_SLOTS", 2)
    result = CliRunner().invoke(cli, _range(T0, T0 + 2 * MIN))
    assert result.exit_code == 2, result.output
    assert "the range has more than 2 slots: backfill a shorter one" in result.stderr
    assert cli_instance.count(BACKFILLED) == 0


def test_backfill_of_too_many_slots_over_its_instances_exits_2_and_sends_nothing(
    cli_instance: Instance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One instance's limit times its instances (1,000 tenants, 1,024 shards) held ~15 GB
    of commands: a backfill's slots in all are bounded too (`MAX_BACKFILL_TOTAL_SLOTS`)."""
    monkeypatch.setattr(app.cli.job_runs, "MAX_BACKFILL_TOTAL_SLOTS", 2, raising=False)
    for extra in ([], ["--dry-run"]):
        result = CliRunner().invoke(cli, [*_range(T0, T0 + 2 * MIN), *extra])
        assert result.exit_code == 2, result.output
        (line,) = result.stderr.splitlines()
        assert "the backfill has more than 2 slots over its instances" in line, line
        assert "(--from, --until) or fewer instances (--tenant, --partition)" in line, line
    assert cli_instance.count(BACKFILLED) == 0


def test_trigger_of_bad_input_exits_2_with_one_line() -> None:
    args = ["jobs", "trigger", "--service", f"{__name__}:SERVICE", "--context", CONTEXT]
    for extra, message, code in (
        # a job not declared does not exist: 1, as on every command (`app.cli.common`)
        (["--job", "nope"], "unknown job 'nope' in ops", 1),
        (["--job", "report", "--partition", "1"], "--partition is for SHARDED jobs", 2),
        (["--job", "report", "--request-id", ""], "--request-id '': give 1-200", 2),
    ):
        result = CliRunner().invoke(cli, [*args, *extra])
        assert result.exit_code == code, result.output
        (line,) = result.stderr.splitlines()
        assert message in line, line


def test_backfill_of_slots_older_than_the_request_id_window_exits_2_and_sends_nothing(
    cli_instance: Instance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live run's request id is forgotten after TICKWHEEL_REQUEST_ID_WINDOW_MS (#20): a
    backfill of a slot that old could not be told it ran live, and would run it again."""
    window = 7 * 24 * 60 * MIN
    monkeypatch.setenv("TICKWHEEL_REQUEST_ID_WINDOW_MS", str(window))
    # Slot 0 ran live at T0: less than an hour (DECIDED_WITHIN_MS) before its request id
    # may be forgotten, it is refused; slot 2, due two minutes later, is not.
    held_after = T0 + MIN
    now = held_after + window - app.cli.job_runs.DECIDED_WITHIN_MS
    monkeypatch.setattr(app.cli.job_runs, "now_ms", lambda: now)
    for extra in ([], ["--dry-run"]):
        result = CliRunner().invoke(cli, [*_range(T0, T0 + 2 * MIN), *extra])
        assert result.exit_code == 2, result.output
        (line,) = result.stderr.splitlines()
        assert "slot 0 was due at 2027-01-15T08:00:00.000+00:00" in line, line
        assert "TICKWHEEL_REQUEST_ID_WINDOW_MS" in line and "could run twice" in line, line
    assert cli_instance.count(BACKFILLED) == 0
    # A slot due after that is still told apart from one that ran.
    later = CliRunner().invoke(cli, [*_range(T0 + 2 * MIN, T0 + 2 * MIN), "--json"])
    assert later.exit_code == 0, later.output
    assert [orjson.loads(x)["code"] for x in later.stdout.splitlines()] == ["COMMITTED"]
