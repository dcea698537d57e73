"""Any sequence of rule changes, ticks and clock steps runs each slot of an instance once.

A fake firing loop sends the current tick timer's slots as the runner does (each in turn,
or a coalescing rule's latest due alone), late or on time; reschedules and new defaults
land at any millisecond, a slot's due time too, and the clock steps back. The live runs'
due times must rise strictly: a slot, or an instant, run twice would repeat one."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_jobs import CONTEXT, Instance, Recorder, tick_command

from app.jobs import (
    TICK_KEY,
    Job,
    JobScope,
    backfill_command,
    backfill_slots,
    enable_command,
    reschedule_command,
    schedule_aggregate,
    tick_timers,
)
from app.protocol.wire import SCHEDULE_SET, CommandEnvelope, ResultCode
from tables import IntervalRule
from tables.rules import parse_rule
from tables.slots import Slot, caught_up, first_slot, next_slot

MIN = 60_000
T0 = 100 * MIN


def _rule(every: int, coalesce: bool) -> IntervalRule:
    return IntervalRule(start=0, every=every * MIN, coalesce=coalesce)


@dataclass
class Loop:
    """An instance, its job's current default, a clock, and the slot each tick timer
    sends next (as the timer table keeps it)."""

    recorder: Recorder = field(default_factory=Recorder)
    clock: int = T0
    instance: Instance | None = None
    cursors: dict[str, Slot | None] = field(default_factory=dict)

    def job(self, every: int, coalesce: bool) -> Job:
        return Job("sweep", JobScope.SYSTEM, _rule(every, coalesce), self.recorder)

    def decide(self, cmd: CommandEnvelope) -> ResultCode:
        instance = self.instance
        assert instance is not None
        instance.now = self.clock - 1  # decided at the clock's millisecond, whatever before
        code = instance.run(cmd, now=self.clock).code
        assert code in (ResultCode.COMMITTED, ResultCode.UNCHANGED), code
        return code

    def fire(self) -> None:
        """The current timer's slots due by the clock, sent as its firing loop sends them."""
        assert self.instance is not None
        for _ in range(50):
            state = self.instance.state
            if not state.enabled or state.timer_id is None or state.rule is None:
                return
            rule = parse_rule(state.rule)
            timer = state.timer_id
            if timer not in self.cursors:
                self.cursors[timer] = first_slot(rule, state.timer_set_at or 0)
            slot = self.cursors[timer]
            if slot is None or slot.due_at > self.clock:
                return
            slot = caught_up(rule, slot, self.clock).slot
            ref = self.instance.log[-1].aggregate
            self.decide(tick_command(ref, timer, slot.index, slot.due_at))
            self.cursors[timer] = next_slot(rule, slot)

    def next_due(self) -> int | None:
        assert self.instance is not None
        slot = self.cursors.get(self.instance.state.timer_id or "")
        return None if slot is None else slot.due_at


everies = st.integers(1, 3)
# Whole minutes as often as not: a step past several slots, not a few milliseconds.
durations = st.integers(0, 7).map(lambda m: m * MIN) | st.integers(0, 7 * MIN)


def _steps(coalesce: st.SearchStrategy[bool], back: bool) -> st.SearchStrategy[tuple[object, ...]]:
    kinds = [
        st.tuples(st.just("advance"), durations),
        st.tuples(st.just("to_due"), st.just(0)),
        st.tuples(st.just("reschedule"), everies, coalesce),
        st.tuples(st.just("follow"), st.just(0)),
        st.tuples(st.just("default"), everies, coalesce),
    ]
    if back:
        kinds.append(st.tuples(st.just("back"), durations.filter(bool)))
    return st.one_of(kinds)


def _play(coalesce: bool, ops: list[tuple[object, ...]]) -> Loop:
    """Plays `ops`, checking after each that the live runs' due times rise strictly."""
    loop = Loop()
    job = loop.job(1, coalesce)
    loop.instance = Instance(schedule_aggregate(CONTEXT, [job], 8))
    loop.decide(enable_command(CONTEXT, job))
    for op in ops:
        kind = op[0]
        if kind == "advance":
            loop.clock += int(op[1])  # type: ignore[call-overload]
            loop.fire()
        elif kind == "to_due":
            # To a slot's due time, not sent yet: what comes next lands at that millisecond.
            due = loop.next_due()
            if due is not None and due > loop.clock:
                loop.clock = due
        elif kind == "back":
            loop.clock -= int(op[1])  # type: ignore[call-overload]
        elif kind == "reschedule":
            rule = {"every": int(op[1]) * MIN, "coalesce": op[2]}  # type: ignore[call-overload]
            loop.decide(reschedule_command(CONTEXT, job, rule))
        elif kind == "follow":
            loop.decide(reschedule_command(CONTEXT, job, None))
        else:  # a release changes the job's default: the next tick takes it
            job = loop.job(int(op[1]), bool(op[2]))  # type: ignore[call-overload]
            loop.instance.agg = schedule_aggregate(CONTEXT, [job], 8)
        dues = [r.due_at for r in loop.recorder.runs]
        assert dues == sorted(set(dues)), dues
    return loop


@settings(max_examples=60, deadline=None)
@given(st.booleans(), st.lists(_steps(st.booleans(), back=True), max_size=25))
@example(False, [("reschedule", 2, False), ("follow", 0)])  # at a slot's due time
@example(True, [("default", 1, False), ("advance", 0)])  # a tick at its due time
@example(False, [("advance", 5 * MIN), ("back", 3 * MIN), ("reschedule", 1, True)])
def test_no_slot_runs_twice(coalesce: bool, ops: list[tuple[object, ...]]) -> None:
    _play(coalesce, ops)


@settings(max_examples=40, deadline=None)
@given(st.lists(_steps(st.just(False), back=False), max_size=25))
@example([("default", 2, False), ("advance", 5 * MIN)])  # a tick taking it, behind
def test_no_slot_of_a_rule_that_does_not_coalesce_is_dropped(
    ops: list[tuple[object, ...]],
) -> None:
    """Each timer's slots from when it was set to when the next replaced it (that instant
    included: a change runs what the old timer owes then) run, the last's up to now."""
    loop = _play(False, ops)
    assert loop.instance is not None
    loop.fire()
    timers = [
        (parse_rule(e.body["rule"]), e.created_at)
        for e in loop.instance.log
        if e.type == SCHEDULE_SET and e.body.get("key") == TICK_KEY
    ]
    owed: set[int] = set()
    for i, (rule, set_at) in enumerate(timers):
        end = timers[i + 1][1] if i + 1 < len(timers) else loop.clock
        slot = first_slot(rule, set_at)
        while slot is not None and slot.due_at <= end:
            owed.add(slot.due_at)
            slot = next_slot(rule, slot)
    assert [r.due_at for r in loop.recorder.runs] == sorted(owed)


@settings(max_examples=40, deadline=None)
@given(st.booleans(), st.lists(_steps(st.booleans(), back=True), max_size=25))
@example(True, [("reschedule", 1, False)])  # at a slot's due time: the current timer's
@example(False, [("reschedule", 1, False), ("advance", MIN), ("reschedule", 2, False)])
def test_a_backfill_after_them_runs_no_slot_again(
    coalesce: bool, ops: list[tuple[object, ...]]
) -> None:
    """A backfill of everything up to now runs each instant once, and runs each slot it
    plans or finds it ran (a dry run lists no slot the node would answer UNCHANGED)."""
    loop = _play(coalesce, ops)
    assert loop.instance is not None
    ref = loop.instance.log[-1].aggregate
    for slot in backfill_slots(tick_timers(loop.instance.log), 0, loop.clock):
        loop.instance.now = loop.clock - 1
        code = loop.instance.run(backfill_command(ref, slot), now=loop.clock).code
        assert code in (ResultCode.COMMITTED, ResultCode.DUPLICATE), (slot, code)
    dues = [r.due_at for r in loop.recorder.runs]
    assert len(dues) == len(set(dues)), dues
