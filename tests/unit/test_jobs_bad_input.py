"""A job instance refuses what no runner of its sends: another writer's malformed schedule
events, a tick of a slot its rule has not reached; and a sharded instance's id is checked
without listing every partition's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest
from fakes import CommitLog

from app.commands.processor import CommandProcessor, state_key
from app.commands.records import misrouted
from app.jobs import (
    DISABLED,
    ENABLED,
    TICK,
    TICKED,
    BackfillSlot,
    Job,
    JobRun,
    JobScope,
    backfill_command,
    declaration,
    disable_command,
    enable_command,
    instance_ids,
    is_instance_id,
    ref_of,
    reschedule_command,
    schedule_aggregate,
    shard_ref,
)
from app.kafka import Record
from app.model.decide import Decided, StoredAggregate, decide, fold
from app.ops import job_log
from app.ops.job_log import fold_instances
from app.protocol.limits import InputLimits
from app.protocol.wire import CommandEnvelope, EventEnvelope, ResultCode, encode
from tables import CronRule, IntervalRule, OnceRule
from tables.aggregate_store import MemoryAggregateStore
from tables.bounds import MAX_INSTANT, MAX_INT64
from tables.partitioner import partition_of
from tables.slots import caught_up, first_slot, reachable

T0 = 1_800_000_000_000
MIN = 60_000
PARTITIONS = 4
LIMITS = InputLimits()
runs: list[int] = []


def handler(run: JobRun) -> None:
    runs.append(run.slot)


JOB = Job("nightly", JobScope.SYSTEM, IntervalRule(start=0, every=MIN), handler)
REF = ref_of("ops", JOB)
P = partition_of(REF.id, PARTITIONS)
AGG = schedule_aggregate("ops", [JOB], PARTITIONS)


def record(cmd: CommandEnvelope, offset: int) -> Record:
    return Record("ops.schedule.commands", P, offset, REF.id.encode(), encode(cmd), T0)


async def enabled(now: int = T0) -> tuple[CommandProcessor, CommitLog, str]:
    """An instance of JOB enabled at `now`; its processor, log and tick timer's id."""
    log = CommitLog()
    proc = CommandProcessor(
        AGG, P, partitions=PARTITIONS, states=MemoryAggregateStore(), commit=log, now=lambda: now
    )
    await proc.handle([record(enable_command("ops", JOB, now=now, request_id="en-1"), 0)])
    stored = proc._states.stored(state_key(REF))
    assert stored is not None
    return proc, log, stored.state["timer_id"]


@pytest.mark.parametrize(
    ("type_", "body"),
    [(ENABLED, {"job": 5}), (ENABLED, {"job": ["nightly"]}), (TICKED, {"slot": "x"})],
)
async def test_another_writers_malformed_schedule_event_is_not_folded(
    type_: str, body: dict[str, Any]
) -> None:
    proc, log, _ = await enabled()
    before = proc._states.stored(state_key(REF))
    event = EventEnvelope(
        id="foreign/0", type=type_, aggregate=REF, version=9, created_at=T0, body=body
    )
    batch = proc.begin()
    # Raised: the node's follower dead-letters it (stage `follow`), a restore passes it over.
    with pytest.raises(ValueError, match="ScheduleState"):
        proc.follow(batch, event, 5)
    proc.staged(batch)
    proc.committed(batch, [])
    assert proc._states.stored(state_key(REF)) == before
    with pytest.raises(ValueError, match="ScheduleState"):
        fold(AGG, before, [event])

    # The instance goes on.
    await proc.handle([record(disable_command("ops", JOB, now=T0, request_id="dis-1"), 6)])
    assert [r["code"] for r in log.last("ops.results")] == [ResultCode.COMMITTED]


@pytest.mark.parametrize("partitions", [1, 3, 16])
def test_an_instance_id_is_checked_without_listing_every_partitions(partitions: int) -> None:
    sweep = Job("sweep", JobScope.SHARDED, IntervalRule(start=0, every=MIN), handler)
    ids = instance_ids("ops", sweep, partitions)
    near = {f"sweep~{p}~{n}" for p in range(partitions + 2) for n in range(3 * partitions)}
    odd = {
        "sweep",
        "nightly",
        "sweep~0",
        "sweep~~0",
        "sweep~0~0~0",
        "sweep~²~0",
        "sweep~-1~0",
        "nightly~0~0",
        f"sweep~{10**400}~0",
        shard_ref("ops", sweep, 0, partitions).id.replace("~0~", "~00~"),
    }
    for candidate in ids | near | odd:
        assert is_instance_id(sweep, candidate, partitions) == (candidate in ids), candidate
    assert all(is_instance_id(sweep, i, partitions) for i in ids)
    assert is_instance_id(JOB, "nightly", partitions)
    assert not is_instance_id(JOB, "nightly~0~0", partitions)


async def test_enabling_a_sharded_instance_finds_one_partitions_id_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each id of a partition takes about `partitions` tries to find: an Enable finding
    every partition's (1,024 partitions: ~2.5 s) blocked its partition that long."""
    partitions = 16
    sweep = Job("sweep", JobScope.SHARDED, IntervalRule(start=0, every=MIN), handler)
    agg = schedule_aggregate("ops", [sweep], partitions)
    found: list[int] = []
    shard_id = declaration._shard_id

    def counted(job: str, partition: int, partitions: int) -> str:
        found.append(partition)
        return shard_id(job, partition, partitions)

    ref = shard_ref("ops", sweep, 5, partitions)
    cmd = enable_command("ops", sweep, partition=5, partitions=partitions, now=T0)
    monkeypatch.setattr(declaration, "_shard_id", counted)
    p = partition_of(ref.id, partitions)
    log = CommitLog()
    proc = CommandProcessor(
        agg, p, partitions=partitions, states=MemoryAggregateStore(), commit=log, now=lambda: T0
    )
    record = Record("ops.schedule.commands", p, 0, ref.id.encode(), encode(cmd), T0)
    await proc.handle([record])
    assert [r["code"] for r in log.last("ops.results")] == [ResultCode.COMMITTED]
    assert found == [5]


# --- a tick of a slot its rule has not reached -----------------------------------------------


def ticked(
    agg: Any, stored: StoredAggregate, timer_id: str, slot: int, now: int, due: int | None
) -> Decided:
    tick = CommandEnvelope(
        request_id=f"{timer_id}#{slot}", type=TICK, aggregate=REF, issued_at=now, not_before=due
    )
    return decide(agg, stored, tick, now=now, seen=False)


def enabled_at(agg: Any, job: Job, now: int) -> tuple[StoredAggregate, str]:
    d = decide(agg, None, enable_command("ops", job, now=now), now=now, seen=False)
    assert d.code is ResultCode.COMMITTED and d.stored is not None
    return d.stored, d.stored.state["timer_id"]


@pytest.mark.parametrize("slot", [2**63 - 1, 2**70, 30_000_001])
@pytest.mark.parametrize("not_before", [T0, None])
def test_a_tick_of_a_slot_not_due_yet_is_rejected(slot: int, not_before: int | None) -> None:
    """Taken, a hand-made tick of a far slot made every real slot up to it a slot already
    run: the job stopped, every later tick UNCHANGED."""
    runs.clear()
    stored, timer_id = enabled_at(AGG, JOB, T0)
    d = ticked(AGG, stored, timer_id, slot, T0, not_before)
    assert d.code is ResultCode.REJECTED
    assert f"slot {slot} of {timer_id} is not due by {T0}" in d.message
    assert runs == []
    # The real slot due now runs.
    real = T0 // MIN
    d = ticked(AGG, stored, timer_id, real, T0, real * MIN)
    assert d.code is ResultCode.COMMITTED
    assert runs == [real]


def test_a_slot_is_checked_against_its_due_time_not_only_now() -> None:
    stored, timer_id = enabled_at(AGG, JOB, T0)
    slot = T0 // MIN
    # Due at slot * MIN: sent as due one minute before that, it is no send of its timer.
    assert ticked(AGG, stored, timer_id, slot, T0, T0 - MIN).code is ResultCode.REJECTED
    assert ticked(AGG, stored, timer_id, slot, T0, T0).code is ResultCode.COMMITTED


@pytest.mark.parametrize("expr", ["* * * * *", "*/5 * * * *", "0 3 * * *", "*/10 * * * * *"])
def test_a_cron_timers_caught_up_slot_ticks_and_a_later_one_is_rejected(expr: str) -> None:
    """After a long stop a coalescing timer sends the latest slot due, its index estimated
    past `MAX_CRON_STEPS` (one per minute, or second): it is taken, one far past it not."""
    job = Job("nightly", JobScope.SYSTEM, CronRule(expr=expr), handler)
    agg = schedule_aggregate("ops", [job], PARTITIONS)
    stored, timer_id = enabled_at(agg, job, T0)
    rule = CronRule(expr=expr)
    first = first_slot(rule, T0)
    assert first is not None
    now = T0 + 40 * 24 * 3_600_000
    latest = caught_up(rule, first, now).slot
    assert latest.index > 0
    assert ticked(agg, stored, timer_id, latest.index, now, latest.due_at).code is (
        ResultCode.COMMITTED
    )
    far = latest.index + 41 * 24 * 3_600
    assert ticked(agg, stored, timer_id, far, now, latest.due_at).code is ResultCode.REJECTED


HOUR = 60 * MIN
HOURLY = Job("hourly", JobScope.SYSTEM, CronRule(expr="0 * * * *"), handler)
HOURLY_AGG = schedule_aggregate("ops", [HOURLY], PARTITIONS)


def hourly_tick(
    stored: StoredAggregate, timer_id: str, slot: int, now: int, due: int | None
) -> Decided:
    tick = CommandEnvelope(
        request_id=f"{timer_id}#{slot}",
        type=TICK,
        aggregate=ref_of("ops", HOURLY),
        issued_at=now,
        not_before=due,
    )
    return decide(HOURLY_AGG, stored, tick, now=now, seen=False)


def test_a_forged_far_cron_tick_is_refused_and_the_job_keeps_its_schedule() -> None:
    """Another producer's tick of slot 10,000 due at a real match: within the old bound
    (a minute a slot since the timer was set), it made slots 1 to 9,999 runs already
    done, so the job stopped for over a year."""
    runs.clear()
    stored, timer_id = enabled_at(HOURLY_AGG, HOURLY, T0)  # T0 is on the hour: slot 0
    d = hourly_tick(stored, timer_id, 0, T0, T0)
    assert d.code is ResultCode.COMMITTED and d.stored is not None
    stored = d.stored
    now = T0 + 240 * HOUR
    forged = hourly_tick(stored, timer_id, 10_000, now, now)
    assert forged.code is ResultCode.REJECTED and forged.stored is None
    assert f"slot 10000 of {timer_id} due at {now} is not one its rule makes" in forged.message
    assert runs == [0]
    # the timer's own send of that hour's slot, and the next, still run
    d = hourly_tick(stored, timer_id, 240, now, now)
    assert d.code is ResultCode.COMMITTED and d.stored is not None
    d = hourly_tick(d.stored, timer_id, 241, now + HOUR, now + HOUR)
    assert d.code is ResultCode.COMMITTED
    assert runs == [0, 240, 241]


def test_a_tick_off_its_rule_is_refused() -> None:
    runs.clear()
    stored, timer_id = enabled_at(HOURLY_AGG, HOURLY, T0)
    # Slot 1 is due at T0 + 1 h: not sent by hand a minute after T0 (it ran early, and its
    # timer's send was then a DUPLICATE), nor as due a minute after T0, nor a second late.
    for due, now in ((None, T0 + MIN), (T0 + MIN, T0 + MIN), (T0 + HOUR + 1_000, T0 + HOUR)):
        d = hourly_tick(stored, timer_id, 1, max(now, due or now), due)
        assert d.code is ResultCode.REJECTED and d.stored is None, due
        assert "is not one its rule makes" in d.message
    assert runs == []
    assert hourly_tick(stored, timer_id, 1, T0 + HOUR, T0 + HOUR).code is ResultCode.COMMITTED
    # an interval slot sent as due 30 s after its due time
    stored, timer_id = enabled_at(AGG, JOB, T0)
    slot = T0 // MIN
    d = ticked(AGG, stored, timer_id, slot, T0 + 30_000, T0 + 30_000)
    assert d.code is ResultCode.REJECTED
    assert "is not one its rule makes" in d.message
    assert ticked(AGG, stored, timer_id, slot, T0 + 30_000, T0).code is ResultCode.COMMITTED
    assert runs == [1, slot]


def test_a_backfill_of_a_slot_its_timer_does_not_make_is_invalid() -> None:
    """Run under the live tick's request id, it made that tick a DUPLICATE: slot 1 of the
    hourly job, due at T0 + 1 h, backfilled as due at T0 + 1 min, ran before it was due,
    with a due time no slot has."""
    runs.clear()
    stored, timer_id = enabled_at(HOURLY_AGG, HOURLY, T0)
    ref = ref_of("ops", HOURLY)
    now = T0 + 90 * MIN
    forged = backfill_command(ref, BackfillSlot(timer_id, 1, T0 + MIN), now=now)
    d = decide(HOURLY_AGG, stored, forged, now=now, seen=False)
    assert d.code is ResultCode.SCHEDULE_JOB_INVALID and d.stored is None
    assert "is not one its rule makes" in d.message
    real = backfill_command(ref, BackfillSlot(timer_id, 1, T0 + HOUR), now=now)
    assert decide(HOURLY_AGG, stored, real, now=now, seen=False).code is ResultCode.COMMITTED
    assert runs == [1]


def test_a_tick_due_after_now_changes_nothing() -> None:
    stored, timer_id = enabled_at(HOURLY_AGG, HOURLY, T0)
    far = T0 + 10_000 * HOUR
    d = hourly_tick(stored, timer_id, 10_000, T0, far)
    assert d.code is ResultCode.SCHEDULE_NOT_DUE and d.stored is None


def test_reachable_slots_of_each_kind_of_rule() -> None:
    every = IntervalRule(start=1_000, every=10, count=5)
    assert reachable(every, 4, 0, 1_040) and not reachable(every, 4, 0, 1_039)
    assert not reachable(every, 5, 0, 10**12)  # past its count
    once = OnceRule(at=500)
    assert reachable(once, 0, 10**6, 500) and not reachable(once, 1, 0, 10**6)
    assert not reachable(once, 0, 0, 499)
    cron = CronRule(expr="* * * * *", count=3)
    assert reachable(cron, 2, 60_000, 180_000) and not reachable(cron, 2, 60_000, 179_999)
    assert not reachable(cron, 3, 0, 10**12)
    assert not reachable(every, -1, 0, 10**12)


# --- a job's interval: a second at least, a second slot before the year 9999 ----------------


@pytest.mark.parametrize(
    ("every", "why"),
    [
        (1, "every 1 ms is shorter than a job's shortest interval, 1000 ms"),
        (999, "every 999 ms is shorter than a job's shortest interval, 1000 ms"),
        (MAX_INSTANT + 1, f"every {MAX_INSTANT + 1} ms is longer than a job's longest interval"),
        (MAX_INT64, f"every {MAX_INT64} ms is longer than a job's longest interval"),
    ],
)
def test_a_job_ticking_more_than_once_a_second_or_never_twice_is_refused_at_declaration(
    every: int, why: str
) -> None:
    """A job of `every=1` was declared, enabled and ticked a thousand times a second per
    instance (a transaction and a handler's run each); one past the calendar ran once."""
    with pytest.raises(ValueError, match=f"^job 'sweep': {why}"):
        Job("sweep", JobScope.SHARDED, IntervalRule(start=0, every=every), handler)


def test_a_job_of_the_shortest_and_longest_interval_and_a_cron_of_seconds_are_taken() -> None:
    for every in (declaration.MIN_JOB_EVERY_MS, MAX_INSTANT):
        assert Job("sweep", JobScope.SYSTEM, IntervalRule(start=0, every=every), handler)
    assert Job("sweep", JobScope.SYSTEM, CronRule(expr="* * * * * *"), handler)
    # A timer's rule has no such floor: only a job's.
    assert IntervalRule(start=0, every=1).every == 1


@pytest.mark.parametrize(
    ("default", "override"),
    [
        (IntervalRule(start=0, every=MIN), {"every": 999}),
        (IntervalRule(start=0, every=MIN), {"every": 1}),
        (IntervalRule(start=0, every=MIN), {"every": MAX_INSTANT + 1}),
        # another kind than the default's: a rule of its own
        (CronRule(expr="0 3 * * *"), {"kind": "interval", "start": 0, "every": 500}),
    ],
)
def test_an_override_of_an_interval_no_job_may_have_is_refused_naming_job_and_value(
    default: IntervalRule | CronRule, override: dict[str, Any]
) -> None:
    """As the HTTP edge and the CLI check it first (`job_api.rule_override`), and a command
    written to the topic by anyone else: SCHEDULE_JOB_INVALID, nothing scheduled."""
    job = Job("nightly", JobScope.SYSTEM, default, handler)
    agg = schedule_aggregate("ops", [job], PARTITIONS)
    every = override["every"]
    d = decide(agg, None, enable_command("ops", job, rule=override, now=T0), now=T0, seen=False)
    assert (d.code, d.stored) == (ResultCode.SCHEDULE_JOB_INVALID, None)
    assert d.message.startswith(f"invalid rule for job 'nightly': every {every} ms is "), d.message
    stored, _ = enabled_at(agg, job, T0)
    cmd = reschedule_command("ops", job, override, now=T0)
    d = decide(agg, stored, cmd, now=T0, seen=False)
    assert (d.code, d.stored) == (ResultCode.SCHEDULE_JOB_INVALID, None)
    assert f"invalid rule for job 'nightly': every {every} ms is " in d.message
    # A second is a job's shortest interval.
    cmd = reschedule_command("ops", job, {**override, "every": 1_000}, now=T0)
    assert decide(agg, stored, cmd, now=T0, seen=False).code is ResultCode.COMMITTED


async def test_an_instance_kept_override_shorter_than_a_second_is_enabled_again() -> None:
    """An override an earlier version took is read as it took it (as a lax one is, above):
    refused, a paused instance could not be resumed at all."""
    proc, log, _ = await enabled()
    await proc.handle([record(disable_command("ops", JOB, now=T0, request_id="dis-1"), 1)])
    stored = proc._states.stored(state_key(REF))
    assert stored is not None
    kept = stored.model_copy(update={"state": {**stored.state, "override": {"every": 500}}})
    proc._states.store.write(P, {state_key(REF): encode(kept)}, set(), None, T0)
    await proc.handle([record(enable_command("ops", JOB, now=T0, request_id="en-2"), 2)])
    assert [r["code"] for r in log.last("ops.results")] == [ResultCode.COMMITTED]
    again = proc._states.stored(state_key(REF))
    assert again is not None and again.state["rule"]["every"] == 500


# --- the instances' states as an operator reads them ----------------------------------------


def test_an_instance_whose_events_cannot_be_folded_is_listed_with_why() -> None:
    """`GET /jobs?state=true` and `jobs list --state` fold every instance of a context: one
    bad event used to fail them all (a 500, a traceback)."""
    report = Job("report", JobScope.TENANT, CronRule(expr="0 8 * * 1"), handler)
    other = ref_of("ops", report, "t1")

    def enabled_event(ref: Any, version: int, body: dict[str, Any]) -> EventEnvelope:
        return EventEnvelope(
            id=f"{ref.id}/{version}",
            type=ENABLED,
            aggregate=ref,
            version=version,
            created_at=T0,
            body=body,
        )

    good = enabled_event(REF, 1, {"job": "nightly", "override": None})
    bad = enabled_event(REF, 2, {"job": ["nightly"]})
    worse = enabled_event(REF, 3, {"job": 5})
    only_bad = enabled_event(ref_of("ops", report, "t2"), 1, {"job": 5})
    fine = enabled_event(other, 1, {"job": "report"})
    listed = fold_instances("ops", [JOB, report], PARTITIONS, [fine, good, bad, worse, only_bad])
    by_id = {(s.tenant, s.id): s for s in listed}
    assert by_id[("t1", "report")].error is None
    assert by_id[("t1", "report")].state.enabled
    nightly = by_id[(REF.tenant, "nightly")]
    assert (nightly.version, nightly.state.job, nightly.state.enabled) == (1, "nightly", True)
    assert nightly.error is not None
    assert nightly.error.startswith(f"passed over event {REF.id}/2 (version 2): ValidationError")
    assert nightly.error.endswith("(and 1 more events passed over)")
    assert nightly.as_json()["error"] == nightly.error
    assert "error" not in by_id[("t1", "report")].as_json()
    never = by_id[("t2", "report")]
    assert (never.version, never.state.enabled, never.error is not None) == (0, False, True)


async def test_enabled_again_with_the_override_an_earlier_version_kept() -> None:
    """An instance's kept override stored as an earlier, lax version took it (`"every":
    "120000"`): enabled again without a rule, it is read as that version read it, not
    refused as a command's new rule would be."""
    proc, log, _ = await enabled()
    await proc.handle([record(disable_command("ops", JOB, now=T0, request_id="dis-1"), 1)])
    stored = proc._states.stored(state_key(REF))
    assert stored is not None and not stored.state["enabled"]
    lax = stored.model_copy(update={"state": {**stored.state, "override": {"every": "120000"}}})
    proc._states.store.write(P, {state_key(REF): encode(lax)}, set(), None, T0)
    await proc.handle([record(enable_command("ops", JOB, now=T0, request_id="en-2"), 2)])
    assert [r["code"] for r in log.last("ops.results")] == [ResultCode.COMMITTED]
    again = proc._states.stored(state_key(REF))
    assert again is not None and again.state["enabled"]
    assert again.state["rule"]["every"] == 120_000


async def test_a_schedule_log_is_folded_a_fetch_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """`GET /jobs?state=true` folds the whole schedule log on the node's event loop: a
    fetch at a time, the loop given back between them (a log of millions of events held
    it for a minute and more, and its partitions' transactions with it)."""
    events = [
        EventEnvelope(
            id=f"{REF.id}/{v}",
            type=ENABLED if v == 1 else TICKED,
            aggregate=REF,
            version=v,
            created_at=T0,
            body={"job": "nightly", "override": None} if v == 1 else {"slot": v},
        )
        for v in range(1, 31)
    ]
    turns: list[int] = []

    class Reader:
        async def read(
            self, topic: str, partition: int, start: int
        ) -> AsyncGenerator[list[Record], None]:
            for i in range(0, len(events), 10):
                yield [
                    Record(topic, P, i + j, REF.id.encode(), encode(e), T0)
                    for j, e in enumerate(events[i : i + 10])
                ]

    folded: list[int] = []
    original = job_log._Folding.add

    def add(self: Any, batch: list[EventEnvelope]) -> None:
        folded.append(len(batch))
        turns.append(ticks)
        original(self, batch)

    monkeypatch.setattr(job_log._Folding, "add", add)
    ticks = 0

    async def ticking() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(ticking())
    try:
        [instance] = await job_log.read_instances(Reader(), "ops", [JOB], PARTITIONS, 1, LIMITS)  # type: ignore[arg-type]
    finally:
        ticker.cancel()
    assert folded == [10, 10, 10]
    assert turns[0] < turns[1] < turns[2]  # the loop turned between them
    assert instance.version == 30


@pytest.mark.parametrize("where", ["keyless", "other key", "other partition", "too large"])
async def test_the_instances_view_folds_no_event_the_workers_dead_letter(where: str) -> None:
    """`GET /jobs?state=true` and `jobs list --state` folded every record of the schedule
    log that decoded: a `Disabled` forged without the instance's key, under another, in
    another partition or past the size bound the workers hold records to (they
    dead-letter each) showed the instance disabled while it ran on."""

    def event(version: int, type_: str, body: dict[str, Any], id_: str = "x") -> bytes:
        return encode(
            EventEnvelope(
                id=f"{id_}/{version}",
                type=type_,
                aggregate=REF,
                version=version,
                created_at=T0,
                body=body,
            )
        )

    topic = "ops.schedule.events"
    good = Record(topic, P, 0, REF.id.encode(), event(1, ENABLED, {"job": "nightly"}), T0)
    key, partition = {
        "keyless": (None, P),
        "other key": (b"nightly-2", P),
        "other partition": (REF.id.encode(), (P + 1) % PARTITIONS),
        "too large": (REF.id.encode(), P),
    }[where]
    forged = Record(topic, partition, 1, key, event(2, DISABLED, {}, "x" * 50), T0)

    class Reader:
        async def read(
            self, topic: str, partition: int, start: int
        ) -> AsyncGenerator[list[Record], None]:
            yield [r for r in (good, forged) if r.partition == partition]

    reader: Any = Reader()
    if where == "too large":
        # The workers' bound (`TICKWHEEL_MAX_RECORD_BYTES`) is the good record's size.
        bound = InputLimits(max_record_bytes=len(good.value or b""))
        read = job_log.read_instances(reader, "ops", [JOB], PARTITIONS, PARTITIONS, bound)
    else:
        assert misrouted(forged, REF, PARTITIONS) is not None
        read = job_log.read_instances(reader, "ops", [JOB], PARTITIONS, PARTITIONS, LIMITS)
    [instance] = await read
    assert (instance.version, instance.state.enabled) == (1, True)


@pytest.mark.parametrize("bound", ["raised", "lowered"])
async def test_an_instances_events_are_read_within_the_workers_bounds(bound: str) -> None:
    # What a backfill plans from and `jobs runs` lists (`read_instance_events`) is what
    # the instances view folds and the workers fold: within their `TICKWHEEL_MAX_*`.
    pad = 300_000 if bound == "raised" else 10_000
    limits = InputLimits(max_record_bytes=1024 * 1024 if bound == "raised" else 4096)
    event = EventEnvelope(
        id="x/1",
        type=ENABLED,
        aggregate=REF,
        version=1,
        created_at=T0,
        body={"job": JOB.name, "pad": "x" * pad},
    )
    p = partition_of(REF.id, PARTITIONS)
    record = Record("ops.schedule.events", p, 0, REF.id.encode(), encode(event), T0)
    assert len(record.value or b"") > InputLimits().max_record_bytes or bound == "lowered"

    class Reader:
        async def read(
            self, topic: str, partition: int, start: int
        ) -> AsyncGenerator[list[Record], None]:
            yield [record] if partition == p else []

    reader: Any = Reader()
    folded = await job_log.read_instances(reader, "ops", [JOB], PARTITIONS, PARTITIONS, limits)
    events = await job_log.read_instance_events(reader, REF, PARTITIONS, limits)
    assert len(events) == len(folded) == (1 if bound == "raised" else 0)
