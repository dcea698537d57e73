"""A job whose scope changes between versions of a service (SHARDED to SYSTEM, SYSTEM to
SHARDED, TENANT to SYSTEM): the instances enabled under the old scope are no longer its
instances, and their next tick disables them, as a tick of a job no longer declared does
(found by a jobs hunt: the old shards ran every slot beside the new instance, a SYSTEM
instance's ticks failed for ever under SHARDED, and no command reached them)."""

from __future__ import annotations

from test_jobs import CONTEXT, SWEEP_RULE, Instance, Recorder, types

from app.jobs import (
    DISABLED,
    Job,
    JobScope,
    enable_command,
    reschedule_command,
    schedule_aggregate,
)
from app.protocol.wire import SCHEDULE_CANCELLED, ResultCode

P = 4


def test_a_shards_instances_are_disabled_once_the_job_runs_once() -> None:
    recorder = Recorder()
    sharded = Job("sweep", JobScope.SHARDED, SWEEP_RULE, recorder)
    v1 = schedule_aggregate(CONTEXT, [sharded], P)
    shards = []
    for p in range(P):
        shard = Instance(v1)
        enable = enable_command(CONTEXT, sharded, partition=p, partitions=P)
        assert shard.run(enable).code is ResultCode.COMMITTED
        shards.append(shard)
    system = Job("sweep", JobScope.SYSTEM, SWEEP_RULE, recorder)
    v2 = schedule_aggregate(CONTEXT, [system], P)
    one = Instance(v2)
    assert one.run(enable_command(CONTEXT, system)).code is ResultCode.COMMITTED
    for shard in shards:
        shard.agg = v2
        d = shard.tick(1)
        assert types(d) == [DISABLED, SCHEDULE_CANCELLED]
        assert "not an instance of job 'sweep'" in d.events[0].body["reason"]
    assert one.tick(1).code is ResultCode.COMMITTED
    assert [r.instance for r in recorder.runs] == ["sweep"]  # slot 1 ran once


def test_a_system_instance_is_disabled_once_the_job_is_sharded() -> None:
    recorder = Recorder()
    system = Job("sweep", JobScope.SYSTEM, SWEEP_RULE, recorder)
    instance = Instance(schedule_aggregate(CONTEXT, [system], P))
    assert instance.run(enable_command(CONTEXT, system)).code is ResultCode.COMMITTED
    sharded = Job("sweep", JobScope.SHARDED, SWEEP_RULE, recorder)
    instance.agg = schedule_aggregate(CONTEXT, [sharded], P)
    d = instance.tick(1)  # it failed (ERROR) on every tick, then parked, never disabled
    assert types(d) == [DISABLED, SCHEDULE_CANCELLED]
    assert not instance.state.enabled and recorder.runs == []


def test_a_reschedule_of_an_instance_whose_scope_changed_is_refused_as_its_enable_is() -> None:
    recorder = Recorder()
    tenant = Job("report", JobScope.TENANT, SWEEP_RULE, recorder)
    acme = Instance(schedule_aggregate(CONTEXT, [tenant], P))
    assert acme.run(enable_command(CONTEXT, tenant, tenant="acme")).code is ResultCode.COMMITTED
    timer = acme.state.timer_id
    acme.agg = schedule_aggregate(
        CONTEXT, [Job("report", JobScope.SYSTEM, SWEEP_RULE, recorder)], P
    )
    enable = acme.run(enable_command(CONTEXT, tenant, tenant="acme"))
    assert enable.code is ResultCode.SCHEDULE_JOB_INVALID
    d = acme.run(reschedule_command(CONTEXT, tenant, {"every": 120_000}, tenant="acme"))
    assert d.code is ResultCode.SCHEDULE_JOB_INVALID, types(d)
    assert "is SYSTEM" in d.message and "its scope changed" in d.message
    assert acme.state.timer_id == timer
