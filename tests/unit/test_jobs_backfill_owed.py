"""A slot a backfill ran ahead of its instance's ticks is not run again by a rule change.

A Backfill of a slot of the current tick timer runs it under its live tick's request id,
so its tick is a DUPLICATE; but a new rule replacing the timer runs the slots it owes
(`app.jobs.slot_runs`) under the change's request id, and counted every slot after the
last one that ticked: a backfilled one ran twice. The instance keeps those slots
(`ScheduleState.backfilled`) until its ticks pass them, and the change passes over them."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_jobs import CONTEXT, Instance, Recorder, tick_command, types

from app.jobs import (
    BACKFILLED,
    ENABLED,
    RESCHEDULED,
    TICKED,
    BackfillSlot,
    Job,
    JobScope,
    backfill_command,
    enable_command,
    reschedule_command,
    schedule_aggregate,
)
from app.jobs.runs import OwedSlots, owed_slots
from app.jobs.schedule_state import (
    MAX_BACKFILLED_RUNS,
    BackfilledRun,
    ScheduleState,
    with_backfilled,
)
from app.protocol.wire import SCHEDULE_SET, ResultCode
from tables import IntervalRule
from tables.slots import Slot

MIN = 60_000


def _behind(recorder: Recorder, coalesce: bool = False) -> tuple[Job, Instance]:
    """A minutely instance whose slot 17 ticked, then slots 18 and 19 came due and did
    not tick (its node is behind), and an operator backfilled slot 18."""
    job = Job(
        "sweep", JobScope.SYSTEM, IntervalRule(start=0, every=MIN, coalesce=coalesce), recorder
    )
    instance = Instance(schedule_aggregate(CONTEXT, [job], 8))
    assert instance.run(enable_command(CONTEXT, job), now=16 * MIN + 1).code is (
        ResultCode.COMMITTED
    )
    assert instance.tick(17).code is ResultCode.COMMITTED
    timer = instance.state.timer_id
    assert timer is not None
    ref = instance.log[-1].aggregate
    d = instance.run(backfill_command(ref, BackfillSlot(timer, 18, 18 * MIN)), now=19 * MIN + 5)
    assert types(d) == [BACKFILLED]
    return job, instance


def _ran(recorder: Recorder) -> list[int]:
    return [run.slot for run in recorder.runs]


@pytest.mark.parametrize("change", ["reschedule", "enable", "default"])
def test_a_change_of_rule_does_not_run_a_backfilled_slot_again(change: str) -> None:
    recorder = Recorder()
    job, instance = _behind(recorder)
    assert [(r.first, r.last) for r in instance.state.backfilled] == [(18, 18)]
    faster = {"every": 2 * MIN}
    if change == "reschedule":
        d = instance.run(reschedule_command(CONTEXT, job, faster))
    elif change == "enable":
        d = instance.run(enable_command(CONTEXT, job, rule=faster))
    else:  # slot 20 is backfilled too, then slot 19's late tick takes a new default
        timer = instance.state.timer_id
        assert timer is not None
        ref = instance.log[-1].aggregate
        instance.run(backfill_command(ref, BackfillSlot(timer, 20, 20 * MIN)), now=20 * MIN + 5)
        every = IntervalRule(start=0, every=2 * MIN, coalesce=False)
        instance.agg = schedule_aggregate(
            CONTEXT, [Job("sweep", JobScope.SYSTEM, every, recorder)], 8
        )
        d = instance.run(tick_command(ref, timer, 19, 19 * MIN))
    assert [e.body.get("slot") for e in d.events if e.type == TICKED] == [19]
    assert types(d)[-2:] == [ENABLED if change == "enable" else RESCHEDULED, SCHEDULE_SET]
    # Each slot once: 18 (and 20) backfilled.
    assert sorted(_ran(recorder)) == [17, 18, 19] + ([20] if change == "default" else [])
    assert instance.state.backfilled == []  # the new timer's slots count afresh


def test_a_coalescing_rules_latest_slot_backfilled_is_not_run_again() -> None:
    # Its timer would send the latest slot due alone, 19: backfilled, it owes nothing.
    recorder = Recorder()
    job, instance = _behind(recorder, coalesce=True)
    ref = instance.log[-1].aggregate
    timer = instance.state.timer_id
    assert timer is not None
    d = instance.run(backfill_command(ref, BackfillSlot(timer, 19, 19 * MIN)))
    assert d.code is ResultCode.COMMITTED, d
    assert [(r.first, r.last) for r in instance.state.backfilled] == [(18, 19)]
    d = instance.run(reschedule_command(CONTEXT, job, {"every": 2 * MIN}))
    assert types(d) == [RESCHEDULED, SCHEDULE_SET]
    assert _ran(recorder) == [17, 18, 19]


def test_the_ticks_pass_the_backfilled_slots() -> None:
    recorder = Recorder()
    _, instance = _behind(recorder)
    # The live tick of 18 is its backfill's DUPLICATE; 19's passes it.
    assert instance.tick(19).code is ResultCode.COMMITTED
    assert instance.state.backfilled == []
    stored = instance.state.model_dump(mode="json")
    assert "backfilled" not in stored  # left out while empty, as before it existed
    assert ScheduleState.model_validate(stored) == instance.state


def test_a_backfill_needing_a_run_past_the_bound_is_refused() -> None:
    recorder = Recorder()
    job = Job("sweep", JobScope.SYSTEM, IntervalRule(start=0, every=MIN, coalesce=False), recorder)
    instance = Instance(schedule_aggregate(CONTEXT, [job], 8))
    instance.run(enable_command(CONTEXT, job), now=MIN - 1)
    timer = instance.state.timer_id
    assert timer is not None
    ref = instance.log[-1].aggregate
    instance.now = 1_000 * MIN
    # Every other slot: each a run of its own.
    for n in range(MAX_BACKFILLED_RUNS):
        slot = 2 * n + 1
        d = instance.run(backfill_command(ref, BackfillSlot(timer, slot, slot * MIN)))
        assert d.code is ResultCode.COMMITTED, d
    far = 2 * MAX_BACKFILLED_RUNS + 1
    d = instance.run(backfill_command(ref, BackfillSlot(timer, far, far * MIN)))
    assert d.code is ResultCode.SCHEDULE_JOB_INVALID, d
    assert "its live tick runs it" in d.message
    # One that joins a run is kept.
    d = instance.run(backfill_command(ref, BackfillSlot(timer, 2, 2 * MIN)))
    assert d.code is ResultCode.COMMITTED, d
    assert len(instance.state.backfilled) == MAX_BACKFILLED_RUNS - 1


# --- the pure parts ------------------------------------------------------------------------


@given(st.lists(st.integers(0, 60), max_size=40))
def test_backfilled_runs_hold_each_slot_added_and_no_other(slots: list[int]) -> None:
    runs: list[BackfilledRun] = []
    for slot in slots:
        runs = with_backfilled(runs, slot, slot * MIN)
    held = {i for r in runs for i in range(r.first, r.last + 1)}
    assert held == set(slots)
    for run in runs:
        assert run.last_due_at == run.last * MIN
    # In order, apart: two runs that touch are one.
    assert all(a.last + 1 < b.first for a, b in pairwise(runs))


@given(
    last=st.integers(0, 20),
    backfilled=st.sets(st.integers(21, 60)),
    now_slot=st.integers(21, 60),
    limit=st.integers(1, 50),
)
def test_a_timer_owes_each_due_slot_not_run_nor_backfilled(
    last: int, backfilled: set[int], now_slot: int, limit: int
) -> None:
    rule = IntervalRule(start=0, every=MIN, coalesce=False).model_dump(mode="json")
    runs: list[BackfilledRun] = []
    for slot in sorted(backfilled):
        if slot <= now_slot:  # a backfill runs a slot due by then (and now is later)
            runs = with_backfilled(runs, slot, slot * MIN)
    state = ScheduleState(
        job="j",
        enabled=True,
        rule=rule,
        timer_id="t",
        timer_set_at=0,
        last_slot=last,
        last_due_at=last * MIN,
        backfilled=runs,
    )
    due = [s for s in range(last + 1, now_slot + 1) if s not in backfilled]
    owed = owed_slots(state, now_slot * MIN, limit)
    if not due:
        assert owed is None
        return
    assert owed == OwedSlots([Slot(s, s * MIN) for s in due[:limit]], len(due[limit:]))
