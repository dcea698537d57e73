"""The `<context>.schedule` aggregate, run through `decide`/`fold` as the node runs it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from fakes import sent_base
from hypothesis import given, settings
from hypothesis import strategies as st

from app.demo import orders
from app.jobs import (
    DISABLE,
    DISABLED,
    ENABLE,
    ENABLED,
    RESCHEDULED,
    RUN_FAILED,
    TICK,
    TICK_KEY,
    TICKED,
    Job,
    JobRun,
    JobScope,
    ScheduleState,
    disable_command,
    effective_rule,
    enable_command,
    enable_commands,
    instance_ids,
    ref_of,
    reschedule_command,
    schedule_aggregate,
    shard_ref,
)
from app.model.aggregate import (
    AggregateType,
    Decision,
    Rejected,
)
from app.model.decide import Decided, StoredAggregate, decide, fold
from app.protocol.wire import (
    SCHEDULE_CANCELLED,
    SCHEDULE_SET,
    CommandEnvelope,
    EventEnvelope,
    ResultCode,
)
from app.service import Service
from tables import DEFAULT_TENANT, AggregateRef, CronRule, IntervalRule
from tables.partitioner import partition_of
from tables.rules import parse_rule
from tables.slots import first_slot, next_slot, nth_slot

CONTEXT = "ops"
PARTITIONS = 8
NIGHTLY_RULE = CronRule(expr="0 3 * * *", zone="UTC")
SWEEP_RULE = IntervalRule(start=0, every=60_000)
REPORT_RULE = CronRule(expr="0 8 * * 1", zone="Europe/Berlin", coalesce=False)
TARGET = AggregateRef(context="shop", aggregate="order", id="o-1")


@dataclass
class Recorder:
    runs: list[JobRun] = field(default_factory=list)
    send: bool = False

    def __call__(self, run: JobRun) -> None:
        self.runs.append(run)
        if self.send:
            run.send(TARGET, "shop.RemindToPay", {"slot": run.slot})


def make_jobs(recorder: Recorder, nightly_rule: CronRule = NIGHTLY_RULE) -> tuple[Job, Job, Job]:
    return (
        Job("nightly", JobScope.SYSTEM, nightly_rule, recorder),
        Job("sweep", JobScope.SHARDED, SWEEP_RULE, recorder),
        Job("report", JobScope.TENANT, REPORT_RULE, recorder),
    )


class Instance:
    """One schedule aggregate, threaded through commands as the node does (state, dedup)."""

    def __init__(self, agg: AggregateType[ScheduleState]) -> None:
        self.agg = agg
        self.stored: StoredAggregate | None = None
        self.seen: set[str] = set()
        self.log: list[EventEnvelope] = []
        self.now = 1_000_000

    def run(self, cmd: CommandEnvelope, now: int | None = None) -> Decided:
        self.now = max(self.now + 1, now or 0)
        d = decide(self.agg, self.stored, cmd, now=self.now, seen=cmd.request_id in self.seen)
        if d.stored is not None:
            self.stored = d.stored
            self.seen.add(cmd.request_id)
            self.log += d.events
        return d

    @property
    def state(self) -> ScheduleState:
        assert self.stored is not None
        return ScheduleState.model_validate(self.stored.state)

    def tick(self, slot: int, timer_id: str | None = None, due_at: int | None = None) -> Decided:
        timer = timer_id or self.state.timer_id
        assert timer is not None
        # By default the slot's own due time under the current timer, as its timer sends it.
        due = self.due_at(slot) if due_at is None else due_at
        ref = self.log[-1].aggregate
        return self.run(tick_command(ref, timer, slot, due), now=due)

    def due_at(self, slot: int) -> int:
        """When slot `slot` of the current tick timer is due (a slot of no rule: now)."""
        state = self.state
        if state.rule is None:
            return self.now
        rule = parse_rule(state.rule)
        if not isinstance(rule, CronRule):
            found = nth_slot(rule, slot)
        else:  # a cron timer's slots count from its first, at or after it was set
            found = first_slot(rule, state.timer_set_at or 0)
            for _ in range(slot):
                assert found is not None
                found = next_slot(rule, found)
        return self.now if found is None else found.due_at


def tick_command(ref: AggregateRef, timer_id: str, slot: int, due_at: int) -> CommandEnvelope:
    # as the firing loop sends a timer's slot: `<timer id>#<slot>`, not before its due time
    return CommandEnvelope(
        request_id=f"{timer_id}#{slot}",
        type=TICK,
        aggregate=ref,
        not_before=due_at,
        issued_at=due_at,
    )


def types(d: Decided) -> list[str]:
    return [e.type for e in d.events]


def schedule_body(d: Decided) -> dict[str, Any]:
    (body,) = [e.body for e in d.events if e.type == SCHEDULE_SET]
    return body


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def jobs(recorder: Recorder) -> tuple[Job, Job, Job]:
    return make_jobs(recorder)


@pytest.fixture
def agg(jobs: tuple[Job, ...]) -> AggregateType[ScheduleState]:
    return schedule_aggregate(CONTEXT, jobs, PARTITIONS)


@pytest.fixture
def nightly(jobs: tuple[Job, Job, Job]) -> Job:
    return jobs[0]


@pytest.fixture
def sweep(jobs: tuple[Job, Job, Job]) -> Job:
    return jobs[1]


@pytest.fixture
def report(jobs: tuple[Job, Job, Job]) -> Job:
    return jobs[2]


@pytest.fixture
def enabled(agg: AggregateType[ScheduleState], nightly: Job) -> Instance:
    instance = Instance(agg)
    assert instance.run(enable_command(CONTEXT, nightly)).code is ResultCode.COMMITTED
    return instance


# --- instances and their ids ---------------------------------------------------------------


def test_instance_ids_are_the_name_or_one_per_partition(
    nightly: Job, sweep: Job, report: Job
) -> None:
    assert instance_ids(CONTEXT, nightly, PARTITIONS) == {"nightly"}
    assert instance_ids(CONTEXT, report, PARTITIONS) == {"report"}
    ids = instance_ids(CONTEXT, sweep, PARTITIONS)
    assert ids == {shard_ref(CONTEXT, "sweep", p, PARTITIONS).id for p in range(PARTITIONS)}
    assert {partition_of(i, PARTITIONS) for i in ids} == set(range(PARTITIONS))


@pytest.mark.parametrize("partitions", range(1, 65))
def test_shard_ref_is_the_first_id_in_its_partition(partitions: int) -> None:
    for p in range(partitions):
        ref = shard_ref(CONTEXT, "sweep", p, partitions)
        assert (ref.context, ref.aggregate, ref.tenant) == (CONTEXT, "schedule", DEFAULT_TENANT)
        job, part, n = ref.id.split("~")
        assert (job, int(part)) == ("sweep", p)
        assert partition_of(ref.id, partitions) == p
        assert all(partition_of(f"sweep~{p}~{m}", partitions) != p for m in range(int(n)))


def test_shard_ref_refuses_a_partition_out_of_range() -> None:
    with pytest.raises(ValueError, match="not one of 4"):
        shard_ref(CONTEXT, "sweep", 4, 4)


def test_ref_of_is_the_job_name_in_the_default_tenant(nightly: Job) -> None:
    assert ref_of(CONTEXT, "nightly") == AggregateRef(
        context=CONTEXT, aggregate="schedule", tenant=DEFAULT_TENANT, id="nightly"
    )
    assert ref_of(CONTEXT, nightly, "acme").tenant == "acme"


@pytest.mark.parametrize("name", ["", "a~b", "a b", "a.b", "x" * 101])
def test_job_names_are_letters_digits_dash_underscore(name: str, recorder: Recorder) -> None:
    with pytest.raises(ValueError, match="job name"):
        Job(name, JobScope.SYSTEM, NIGHTLY_RULE, recorder)


def test_duplicate_job_names_are_refused(recorder: Recorder) -> None:
    job = Job("nightly", JobScope.SYSTEM, NIGHTLY_RULE, recorder)
    with pytest.raises(ValueError, match="declared twice"):
        schedule_aggregate(CONTEXT, [job, job], PARTITIONS)


# --- Enable, Reschedule, Disable -------------------------------------------------------------


def test_enable_creates_the_instance_and_schedules_its_tick(
    agg: AggregateType[ScheduleState], nightly: Job
) -> None:
    instance = Instance(agg)
    d = instance.run(enable_command(CONTEXT, nightly))
    assert d.code is ResultCode.COMMITTED
    assert types(d) == [ENABLED, SCHEDULE_SET]
    body = schedule_body(d)
    assert body["key"] == TICK_KEY
    assert body["command"] == {"type": TICK, "body": {}}
    assert body["target"] is None  # the owner itself
    assert body["rule"] == NIGHTLY_RULE.model_dump(mode="json")
    state = instance.state
    assert (state.job, state.enabled, state.override) == ("nightly", True, None)
    assert state.timer_id == d.events[1].id
    assert state.last_slot is None


def test_enable_again_unchanged_is_unchanged(enabled: Instance, nightly: Job) -> None:
    before = enabled.stored
    d = enabled.run(enable_command(CONTEXT, nightly))
    assert (d.code, d.events, enabled.stored) == (ResultCode.UNCHANGED, [], before)


def test_enable_with_an_override(agg: AggregateType[ScheduleState], nightly: Job) -> None:
    instance = Instance(agg)
    d = instance.run(enable_command(CONTEXT, nightly, rule={"expr": "*/5 * * * *"}))
    assert types(d) == [ENABLED, SCHEDULE_SET]
    assert schedule_body(d)["rule"] == {
        **NIGHTLY_RULE.model_dump(mode="json"),
        "expr": "*/5 * * * *",
    }
    assert instance.state.override == {"expr": "*/5 * * * *"}


def test_enable_of_an_enabled_instance_with_a_new_override_reschedules(
    enabled: Instance, nightly: Job
) -> None:
    old = enabled.state.timer_id
    d = enabled.run(enable_command(CONTEXT, nightly, rule={"expr": "0 4 * * *"}))
    assert types(d) == [ENABLED, SCHEDULE_SET]
    assert enabled.state.timer_id != old


def test_enable_after_disable_enables_again_with_a_new_timer(
    enabled: Instance, nightly: Job
) -> None:
    first = enabled.state.timer_id
    d = enabled.run(disable_command(CONTEXT, nightly))
    assert types(d) == [DISABLED, SCHEDULE_CANCELLED]
    d = enabled.run(enable_command(CONTEXT, nightly))
    assert d.code is ResultCode.COMMITTED
    assert types(d) == [ENABLED, SCHEDULE_SET]
    assert enabled.state.enabled
    assert enabled.state.timer_id not in (None, first)


def test_enable_keeps_the_kept_override_when_the_command_has_none(
    agg: AggregateType[ScheduleState], nightly: Job
) -> None:
    instance = Instance(agg)
    instance.run(enable_command(CONTEXT, nightly, rule={"zone": "Asia/Tokyo"}))
    instance.run(disable_command(CONTEXT, nightly))
    d = instance.run(enable_command(CONTEXT, nightly))
    assert schedule_body(d)["rule"]["zone"] == "Asia/Tokyo"
    assert instance.state.override == {"zone": "Asia/Tokyo"}


def test_enable_request_ids_are_fresh_so_a_re_enable_is_no_duplicate(nightly: Job) -> None:
    assert (
        enable_command(CONTEXT, nightly).request_id != enable_command(CONTEXT, nightly).request_id
    )
    given_id = enable_command(CONTEXT, nightly, request_id="deploy-42")
    assert given_id.request_id == "deploy-42"


def test_reschedule_sets_and_clears_the_override(enabled: Instance, nightly: Job) -> None:
    d = enabled.run(reschedule_command(CONTEXT, nightly, {"expr": "30 1 * * *"}))
    assert types(d) == [RESCHEDULED, SCHEDULE_SET]
    assert schedule_body(d)["rule"]["expr"] == "30 1 * * *"
    assert enabled.state.override == {"expr": "30 1 * * *"}
    again = enabled.run(reschedule_command(CONTEXT, nightly, {"expr": "30 1 * * *"}))
    assert again.code is ResultCode.UNCHANGED
    d = enabled.run(reschedule_command(CONTEXT, nightly, None))
    assert types(d) == [RESCHEDULED, SCHEDULE_SET]
    assert schedule_body(d)["rule"] == NIGHTLY_RULE.model_dump(mode="json")
    assert enabled.state.override is None


def test_reschedule_to_the_same_rule_keeps_the_timer(enabled: Instance, nightly: Job) -> None:
    timer = enabled.state.timer_id
    d = enabled.run(reschedule_command(CONTEXT, nightly, {"zone": "UTC"}))
    assert types(d) == [RESCHEDULED]
    assert (enabled.state.override, enabled.state.timer_id) == ({"zone": "UTC"}, timer)


def test_reschedule_of_an_instance_not_enabled_is_refused(
    agg: AggregateType[ScheduleState], nightly: Job
) -> None:
    instance = Instance(agg)
    d = instance.run(reschedule_command(CONTEXT, nightly, {"expr": "0 1 * * *"}))
    assert d.code is ResultCode.SCHEDULE_JOB_INVALID
    assert "is not enabled" in d.message
    instance.run(enable_command(CONTEXT, nightly))
    instance.run(disable_command(CONTEXT, nightly))
    d = instance.run(reschedule_command(CONTEXT, nightly, None))
    assert (d.code, d.events) == (ResultCode.SCHEDULE_JOB_INVALID, [])


def test_disable_cancels_the_schedule(enabled: Instance, nightly: Job) -> None:
    d = enabled.run(disable_command(CONTEXT, nightly))
    assert types(d) == [DISABLED, SCHEDULE_CANCELLED]
    assert d.events[1].body == {"key": TICK_KEY}
    assert not enabled.state.enabled
    assert enabled.state.timer_id is None
    assert enabled.run(disable_command(CONTEXT, nightly)).code is ResultCode.UNCHANGED


# --- Tick -----------------------------------------------------------------------------------


def test_tick_commits_ticked_and_runs_the_handler_once(
    enabled: Instance, recorder: Recorder
) -> None:
    recorder.send = True
    timer = enabled.state.timer_id
    assert timer is not None
    due = enabled.due_at(3)  # 03:00 UTC of the fourth day
    assert due == 3 * 3_600_000 + 3 * 86_400_000
    d = enabled.tick(3, due_at=due)
    assert d.code is ResultCode.COMMITTED
    assert types(d) == [TICKED]
    assert d.events[0].body == {"slot": 3, "due_at": due, "timer_id": timer}
    (run,) = recorder.runs
    assert (run.context, run.job, run.instance, run.tenant, run.partition) == (
        CONTEXT,
        "nightly",
        "nightly",
        DEFAULT_TENANT,
        None,
    )
    assert (run.slot, run.due_at, run.request_id) == (3, due, f"{timer}#3")
    # the handler's command commits with the Ticked event, its id derived from the tick's
    (sent,) = d.commands
    assert (sent.aggregate, sent.type, sent.body) == (TARGET, "shop.RemindToPay", {"slot": 3})
    assert sent_base(sent.request_id) == f"{timer}#3>0"
    assert (enabled.state.last_slot, enabled.state.last_due_at) == (3, due)


def test_a_sharded_instance_runs_with_its_partition(
    agg: AggregateType[ScheduleState], sweep: Job, recorder: Recorder
) -> None:
    for p in range(PARTITIONS):
        instance = Instance(agg)
        d = instance.run(enable_command(CONTEXT, sweep, partition=p, partitions=PARTITIONS))
        assert d.code is ResultCode.COMMITTED, d.message
        instance.tick(0)
        assert recorder.runs[-1].partition == p
        assert recorder.runs[-1].instance == shard_ref(CONTEXT, sweep, p, PARTITIONS).id
    assert len(recorder.runs) == PARTITIONS


def test_a_tenant_instance_runs_in_its_tenant(
    agg: AggregateType[ScheduleState], report: Job, recorder: Recorder
) -> None:
    instance = Instance(agg)
    assert instance.run(enable_command(CONTEXT, report, tenant="acme")).code is ResultCode.COMMITTED
    instance.tick(0)
    (run,) = recorder.runs
    assert (run.tenant, run.instance, run.partition) == ("acme", "report", None)


def test_a_repeated_tick_is_a_duplicate_and_runs_nothing(
    enabled: Instance, recorder: Recorder
) -> None:
    assert enabled.tick(1).code is ResultCode.COMMITTED
    assert enabled.tick(1).code is ResultCode.DUPLICATE
    enabled.seen.clear()  # even when the dedup store forgot it, the state remembers
    d = enabled.tick(1)
    assert (d.code, d.events) == (ResultCode.UNCHANGED, [])
    assert [r.slot for r in recorder.runs] == [1]


def test_an_older_slot_runs_nothing(enabled: Instance, recorder: Recorder) -> None:
    enabled.tick(5)
    assert enabled.tick(4).code is ResultCode.UNCHANGED
    assert enabled.tick(6).code is ResultCode.COMMITTED
    assert [r.slot for r in recorder.runs] == [5, 6]


def test_a_tick_of_an_older_timer_runs_nothing(
    enabled: Instance, nightly: Job, recorder: Recorder
) -> None:
    old = enabled.state.timer_id
    enabled.run(reschedule_command(CONTEXT, nightly, {"expr": "0 5 * * *"}))
    assert enabled.tick(9, timer_id=old).code is ResultCode.UNCHANGED
    # the new timer's slots count afresh: its slot 0 runs
    assert enabled.tick(0).code is ResultCode.COMMITTED
    assert [r.slot for r in recorder.runs] == [0]


def test_a_disabled_instance_runs_nothing(
    enabled: Instance, nightly: Job, recorder: Recorder
) -> None:
    timer = enabled.state.timer_id
    enabled.run(disable_command(CONTEXT, nightly))
    assert enabled.tick(1, timer_id=timer).code is ResultCode.UNCHANGED
    assert recorder.runs == []


@pytest.mark.parametrize("request_id", ["by-hand", "t#\u00b2"])  # isdigit(), not int()'s
def test_a_tick_not_sent_by_a_timer_is_rejected(enabled: Instance, request_id: str) -> None:
    cmd = CommandEnvelope(
        request_id=request_id, type=TICK, aggregate=ref_of(CONTEXT, "nightly"), issued_at=1
    )
    d = enabled.run(cmd)
    assert d.code is ResultCode.REJECTED
    assert "<timer id>#<slot>" in d.message


def test_a_failing_handler_commits_the_tick_and_a_run_timer_not_its_commands(
    agg: AggregateType[ScheduleState], nightly: Job, recorder: Recorder
) -> None:
    """The schedule ticks on; the slot runs again on its own timer (test_jobs_failures)."""
    failures = [RuntimeError("disk full")]

    def flaky(run: JobRun) -> None:
        run.send(TARGET, "shop.RemindToPay", {"slot": run.slot})
        if failures:
            raise failures.pop()
        recorder(run)

    flaky_agg = schedule_aggregate(
        CONTEXT, [Job("nightly", JobScope.SYSTEM, NIGHTLY_RULE, flaky)], 1
    )
    instance = Instance(flaky_agg)
    instance.run(enable_command(CONTEXT, nightly))
    d = instance.tick(2)
    assert d.code is ResultCode.COMMITTED and d.commands == []
    assert types(d) == [TICKED, RUN_FAILED, SCHEDULE_SET]
    assert "disk full" in d.events[1].body["error"]
    assert instance.tick(2).code is ResultCode.DUPLICATE, "the slot ran (and failed) already"
    assert instance.tick(3).code is ResultCode.COMMITTED
    assert [r.slot for r in recorder.runs] == [3]


# --- the default rule changes under the instances --------------------------------------------


def redeploy(instance: Instance, recorder: Recorder, nightly_rule: CronRule) -> None:
    """The node restarts with another default rule: same stored state, new model."""
    instance.agg = schedule_aggregate(CONTEXT, make_jobs(recorder, nightly_rule), PARTITIONS)


def test_a_changed_default_reschedules_from_the_next_tick(
    enabled: Instance, recorder: Recorder
) -> None:
    old = enabled.state.timer_id
    new_default = CronRule(expr="0 4 * * *", zone="UTC")
    redeploy(enabled, recorder, new_default)
    d = enabled.tick(1)
    assert types(d) == [TICKED, RESCHEDULED, SCHEDULE_SET]
    assert schedule_body(d)["rule"] == new_default.model_dump(mode="json")
    assert [r.slot for r in recorder.runs] == [1]  # the slot due under the old rule ran
    assert enabled.state.timer_id not in (None, old)
    assert enabled.tick(2, timer_id=old).code is ResultCode.UNCHANGED
    assert types(enabled.tick(0)) == [TICKED]  # the new rule is the default: no reschedule


def test_a_changed_default_that_has_ended_is_not_taken(
    enabled: Instance, recorder: Recorder
) -> None:
    """A new default with no slot left (its `until` passed): scheduled, its tick timer would
    be cancelled at once and the instance never run again. It ticks on as before."""
    old = enabled.state.timer_id
    redeploy(enabled, recorder, CronRule(expr="0 4 * * *", zone="UTC", start=0, until=1))
    d = enabled.tick(1)
    assert types(d) == [TICKED]
    assert enabled.state.timer_id == old


def test_a_partial_override_follows_the_defaults_other_parts(
    agg: AggregateType[ScheduleState], nightly: Job, recorder: Recorder
) -> None:
    instance = Instance(agg)
    instance.run(enable_command(CONTEXT, nightly, rule={"expr": "*/5 * * * *"}))
    redeploy(instance, recorder, CronRule(expr="0 4 * * *", zone="Europe/Berlin", coalesce=False))
    d = instance.tick(1)
    assert types(d) == [TICKED, RESCHEDULED, SCHEDULE_SET]
    rule = schedule_body(d)["rule"]
    assert (rule["expr"], rule["zone"], rule["coalesce"]) == ("*/5 * * * *", "Europe/Berlin", False)
    assert instance.state.override == {"expr": "*/5 * * * *"}


def test_a_full_override_keeps_its_rule(
    agg: AggregateType[ScheduleState], nightly: Job, recorder: Recorder
) -> None:
    full = {"kind": "cron", "expr": "15 2 * * *", "zone": "UTC", "start": 0, "coalesce": True}
    instance = Instance(agg)
    instance.run(enable_command(CONTEXT, nightly, rule=full))
    redeploy(instance, recorder, CronRule(expr="0 4 * * *", zone="Europe/Berlin", coalesce=False))
    d = instance.tick(1)
    assert types(d) == [TICKED]
    assert instance.state.rule == full


def test_an_override_of_another_kind_is_a_rule_of_its_own() -> None:
    rule = effective_rule(NIGHTLY_RULE, {"kind": "interval", "start": 0, "every": 1_000})
    assert rule == IntervalRule(start=0, every=1_000)
    assert effective_rule(NIGHTLY_RULE, None) == NIGHTLY_RULE
    assert effective_rule(NIGHTLY_RULE, {"coalesce": False}) == CronRule(
        expr="0 3 * * *", coalesce=False
    )


def test_a_tick_of_a_job_no_longer_declared_disables_the_instance(
    enabled: Instance, recorder: Recorder
) -> None:
    timer = enabled.state.timer_id
    enabled.agg = schedule_aggregate(CONTEXT, make_jobs(recorder)[1:], PARTITIONS)
    d = enabled.tick(1)
    assert types(d) == [DISABLED, SCHEDULE_CANCELLED]
    assert "no longer declared" in d.events[0].body["reason"]
    assert not enabled.state.enabled
    assert recorder.runs == []
    assert enabled.tick(2, timer_id=timer).code is ResultCode.UNCHANGED


# --- refusals ---------------------------------------------------------------------------------


def _enable(job: str, ref: AggregateRef, rule: object = None) -> CommandEnvelope:
    body: dict[str, Any] = {"job": job}
    if rule is not None:
        body["rule"] = rule
    return CommandEnvelope(
        request_id=f"e-{ref.id}", type=ENABLE, aggregate=ref, body=body, issued_at=1
    )


SHARD_0 = shard_ref(CONTEXT, "sweep", 0, PARTITIONS)


@pytest.mark.parametrize(
    ("cmd", "message"),
    [
        (_enable("hourly", ref_of(CONTEXT, "hourly")), "unknown job 'hourly' in ops"),
        (_enable("", ref_of(CONTEXT, "nightly")), "names no job"),
        (
            _enable("nightly", ref_of(CONTEXT, "nightly", "acme")),
            "job 'nightly' is SYSTEM: its instances are in the default tenant",
        ),
        (
            _enable("sweep", SHARD_0.model_copy(update={"tenant": "acme"})),
            "job 'sweep' is SHARDED: its instances are in the default tenant",
        ),
        (
            _enable("nightly", ref_of(CONTEXT, "other")),
            "'other' is not an instance of job 'nightly': its id is 'nightly'",
        ),
        (
            _enable("sweep", ref_of(CONTEXT, "sweep~0~999999")),
            "'sweep~0~999999' is not an instance of job 'sweep'",
        ),
        (_enable("sweep", ref_of(CONTEXT, "sweep")), "is not an instance of job 'sweep'"),
        (
            _enable("nightly", ref_of(CONTEXT, "nightly"), {"expr": "61 * * * *"}),
            "invalid rule for job 'nightly': cron.expr",
        ),
        (
            _enable("nightly", ref_of(CONTEXT, "nightly"), {"zone": "Mars/Olympus"}),
            "unknown time zone",
        ),
        (
            _enable("sweep", SHARD_0, {"every": -5}),
            "invalid rule for job 'sweep': interval.every",
        ),
        (_enable("nightly", ref_of(CONTEXT, "nightly"), {"hour": 3}), "hour"),
        (_enable("nightly", ref_of(CONTEXT, "nightly"), "0 3 * * *"), "an object of rule fields"),
    ],
)
def test_invalid_enables_are_refused(
    agg: AggregateType[ScheduleState], cmd: CommandEnvelope, message: str
) -> None:
    d = Instance(agg).run(cmd)
    assert (d.code, d.events, d.stored) == (ResultCode.SCHEDULE_JOB_INVALID, [], None)
    assert message in d.message


def test_an_invalid_reschedule_rule_is_refused(enabled: Instance, nightly: Job) -> None:
    d = enabled.run(reschedule_command(CONTEXT, nightly, {"kind": "interval", "every": 0}))
    assert d.code is ResultCode.SCHEDULE_JOB_INVALID
    assert "invalid rule for job 'nightly'" in d.message


def test_a_tenant_job_is_enabled_in_any_tenant(
    agg: AggregateType[ScheduleState], report: Job
) -> None:
    for tenant in (DEFAULT_TENANT, "acme"):
        d = Instance(agg).run(enable_command(CONTEXT, report, tenant=tenant))
        assert d.code is ResultCode.COMMITTED


def test_reject_without_a_code_is_still_rejected() -> None:
    d = Decision(aggregate=TARGET, now=1)
    with pytest.raises(Rejected) as caught:
        d.reject("no")
    assert caught.value.code is ResultCode.REJECTED
    pay = CommandEnvelope(request_id="r", type="shop.PayOrder", aggregate=TARGET, issued_at=1)
    assert decide(orders, None, pay, now=1, seen=False).code is ResultCode.REJECTED


# --- the state is a fold of the log; builders; Service ---------------------------------------


def test_the_state_is_a_fold_of_its_events(enabled: Instance, nightly: Job) -> None:
    enabled.tick(1)
    enabled.run(reschedule_command(CONTEXT, nightly, {"expr": "0 6 * * *"}))
    enabled.tick(0)
    assert fold(enabled.agg, None, enabled.log) == enabled.stored


def test_enable_commands_cover_every_instance(nightly: Job, sweep: Job, report: Job) -> None:
    sharded = enable_commands(CONTEXT, sweep, partitions=PARTITIONS, now=7)
    assert {c.aggregate.id for c in sharded} == instance_ids(CONTEXT, sweep, PARTITIONS)
    assert all(c.issued_at == 7 and c.body == {"job": "sweep"} for c in sharded)
    (system,) = enable_commands(CONTEXT, nightly, partitions=PARTITIONS, tenants=["a", "b"])
    assert system.aggregate == ref_of(CONTEXT, "nightly")
    tenants = enable_commands(CONTEXT, report, partitions=PARTITIONS, tenants=["a", "b"])
    assert [c.aggregate.tenant for c in tenants] == ["a", "b"]
    with pytest.raises(ValueError, match="SHARDED"):
        enable_command(CONTEXT, sweep)
    assert disable_command(CONTEXT, nightly).type == DISABLE


def test_service_adds_one_schedule_per_context_with_jobs(jobs: tuple[Job, ...]) -> None:
    service = Service(aggregates=(orders,), jobs={"ops": jobs, "shop": jobs[:1], "idle": ()})
    names = [a.type_name for a in service.all_aggregates(PARTITIONS)]
    assert names == ["shop.order", "ops.schedule", "shop.schedule"]
    assert Service(aggregates=(orders,)).all_aggregates(PARTITIONS) == (orders,)


def test_service_refuses_a_declared_schedule_type(jobs: tuple[Job, ...]) -> None:
    own = AggregateType("ops", "schedule", ScheduleState)
    with pytest.raises(ValueError, match=r"ops\.schedule"):
        Service(aggregates=(own,), jobs={"ops": jobs})


# --- exactly once per slot ---------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=30), max_size=40), st.booleans())
def test_the_handler_runs_once_per_newer_slot_in_order(slots: list[int], dedup: bool) -> None:
    recorder = Recorder()
    (nightly, *_) = jobs = make_jobs(recorder)
    instance = Instance(schedule_aggregate(CONTEXT, jobs, PARTITIONS))
    instance.run(enable_command(CONTEXT, nightly, now=1))
    expected: list[int] = []
    for slot in slots:
        if not expected or slot > expected[-1]:
            expected.append(slot)
        if not dedup:
            instance.seen.clear()  # with or without the request-id dedup in front
        instance.tick(slot)  # at its due time: 03:00 UTC of day `slot`
    assert [r.slot for r in recorder.runs] == expected
    assert [r.due_at for r in recorder.runs] == [3 * 3_600_000 + s * 86_400_000 for s in expected]
