"""Jobs end to end on the real broker: worker processes of `tw_jobs`, killed and restarted.

Every run of a slot sends `Ran` to a `runs` aggregate in the transaction of the slot's
`wow.Ticked` (`tw_jobs.record`), so the `runs` log holds one `Ran` per slot that ran. The
checks: each `wow.Ticked` has exactly one `Ran` and the other way round, no slot of an
instance runs twice (request ids unique, due times strictly increasing in log order), a
SHARDED instance's slots run in its own log partition, on a worker that owned it, and
missed slots of a coalescing rule are counted as skipped, not run.

Where a SHARDED slot runs: its `wow.Ticked` and its `Ran` command are appended by the
transactional producer of the schedule's partition p (`<group>.<ctx>.schedule.commands.p`),
which only the owner of p opens, fencing any earlier one. The test sees the `wow.Ticked`
in partition p of the log, the instance id in partition p (`partition_of`), the handler's
own `run.partition` equal to p, and the worker that ran it (its `TW_WORKER`, recorded by
the handler) saying on its /healthz that it owned p then (sampled all along).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import sys
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
import tw_jobs
from harness import ROOT, Client, Cluster, Worker, eventually, owned, sent_base, sleep_until

from app.jobs import (
    BACKFILLED,
    DISABLED,
    ENABLED,
    RESCHEDULED,
    TICKED,
    TRIGGERED,
    TRIGGERED_SLOT,
    Job,
    disable_command,
    enable_command,
    enable_commands,
)
from app.kafka import read_partitions
from app.protocol.topics import AggregateTopics
from app.protocol.wire import CommandEnvelope, EventEnvelope, ResultCode, decode
from tables import DEFAULT_TENANT, Timer
from tables.partitioner import partition_of

pytestmark = pytest.mark.kafka

PARTITIONS = 8
OPTIONS = '{"claim_timeout": 4000, "send_timeout": 3000}'
TENANTS = ("acme", "globex", "initech")
Instance = tuple[str, str]
"""(tenant, id) of a job instance."""


@pytest.fixture
async def cluster(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(
        kafka_bootstrap,
        tmp_path,
        partitions=PARTITIONS,
        env={"TICKWHEEL_TIMER_OPTIONS": OPTIONS},
        service="tw_jobs:service",
    )
    yield c
    c.stop_all()


# --- reading what happened -----------------------------------------------------------------


@dataclass(frozen=True)
class Logged:
    partition: int
    event: EventEnvelope

    @property
    def instance(self) -> Instance:
        return (self.event.aggregate.tenant, self.event.aggregate.id)


async def read_log(cluster: Cluster, aggregate: str) -> list[Logged]:
    """An aggregate type's log, partition by partition, in log order."""
    topic = AggregateTopics(cluster.context, aggregate).events
    out: list[Logged] = []
    async for batch in read_partitions(cluster.bootstrap, topic, range(cluster.partitions)):
        out += [Logged(r.partition, decode(EventEnvelope, r.value)) for r in batch if r.value]
    return out


async def read_timer_rows(cluster: Cluster) -> list[tuple[int, Timer]]:
    """Every row of the schedule's timer changelog with its record's time, in log order."""
    topic = AggregateTopics(cluster.context, "schedule").timers_changelog
    out: list[tuple[int, Timer]] = []
    async for batch in read_partitions(cluster.bootstrap, topic, range(cluster.partitions)):
        out += [(r.timestamp, Timer.model_validate_json(r.value)) for r in batch if r.value]
    return out


@dataclass
class Runs:
    """The schedule's and the runs' logs, read at one moment."""

    schedule: list[Logged]
    ran: list[Logged]
    ticked: dict[Instance, list[Logged]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ticked = defaultdict(list)
        for e in self.schedule:
            if e.event.type == TICKED:
                self.ticked[e.instance].append(e)

    def of(self, instance: Instance, type_: str) -> list[Logged]:
        return [e for e in self.schedule if e.instance == instance and e.event.type == type_]


async def read_runs(cluster: Cluster) -> Runs:
    # The runs first: a run's tick committed before it, so the schedule read after has it.
    ran = await read_log(cluster, tw_jobs.RUNS)
    return Runs(await read_log(cluster, "schedule"), ran)


async def settle(cluster: Cluster, schedule: Client, commands: list[CommandEnvelope]) -> Runs:
    """Disables every instance, then waits until each committed tick's run is in the log."""
    await send_all(schedule, commands)

    async def settled() -> bool:
        runs = await read_runs(cluster)
        ticks = {e.event.request_id for logged in runs.ticked.values() for e in logged}
        return ticks == {e.event.body["tick"] for e in runs.ran}

    await eventually(settled, 30, "every tick's run in the log")
    return await read_runs(cluster)


def ran_counts(runs: Runs) -> Counter[Instance]:
    return Counter((e.event.body["tenant"], e.event.body["instance"]) for e in runs.ran)


@dataclass(frozen=True)
class Owned:
    """What a worker's /healthz said it owned, asked at `asked`, answered at `answered`."""

    asked: int
    answered: int
    partitions: frozenset[int]


async def sample_ownership(
    workers: Workers, samples: dict[str, list[Owned]], stop: asyncio.Event
) -> None:
    """Asks every live worker's /healthz what it owns, about ten times a second, until `stop`."""
    while not stop.is_set():
        for tag, worker in list(workers.by_tag.items()):
            if not worker.alive:
                continue
            asked = now_ms()
            health = await asyncio.to_thread(worker.health, 1)
            if health is not None:
                owned_now = frozenset(int(p) for p in health["owned"])
                samples[tag].append(Owned(asked, now_ms(), owned_now))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.1)


def owned_around(samples: list[Owned], at: int) -> frozenset[int]:
    """What the worker said it owned last before `at`, while `at`, or first after it (a
    partition is in `owned` exactly while the worker processes it)."""
    before = [s.partitions for s in samples if s.answered <= at][-1:]
    during = [s.partitions for s in samples if s.asked <= at < s.answered]
    after = [s.partitions for s in samples if s.asked > at][:1]
    return frozenset().union(*before, *during, *after)


# --- the checks ----------------------------------------------------------------------------


def check_each_slot_ran_once(runs: Runs) -> None:
    ticks = [e.event for e in runs.schedule if e.event.type == TICKED]
    tick_ids = Counter(e.request_id for e in ticks)
    assert not [r for r, n in tick_ids.items() if n > 1], "a tick committed twice"
    ran_by_tick = Counter(e.event.body["tick"] for e in runs.ran)
    twice = [t for t, n in ran_by_tick.items() if n > 1]
    assert not twice, f"slots run twice: {twice[:5]}"
    # The Ran command commits in the tick's transaction: one for one.
    assert set(ran_by_tick) == set(tick_ids), (
        f"ticks without a run: {sorted(set(tick_ids) - set(ran_by_tick), key=str)[:5]}; "
        f"runs without a tick: {sorted(set(ran_by_tick) - set(tick_ids))[:5]}"
    )
    by_tick = {e.request_id: e for e in ticks}
    for e in runs.ran:
        body = e.event.body
        tick = by_tick[body["tick"]]
        assert sent_base(e.event.request_id or "") == f"{body['tick']}>0"
        assert (body["tenant"], body["instance"]) == (tick.aggregate.tenant, tick.aggregate.id)
        assert (body["slot"], body["due_at"]) == (tick.body["slot"], tick.body["due_at"])
    for instance, logged in runs.ticked.items():
        due = [e.event.body["due_at"] for e in logged]
        assert due == sorted(set(due)), f"{instance}: a slot ran twice or out of order: {due}"
        for e in logged:
            # Never before its slot's due time.
            assert e.event.created_at >= e.event.body["due_at"], (instance, e.event.request_id)


def check_sharded_runs_on_owners(runs: Runs, lines: dict[str, list[Owned]]) -> int:
    """Each SHARDED slot ran in its partition, on a worker that owned it; how many."""
    ticks = {e.event.request_id: e for e in runs.schedule if e.event.type == TICKED}
    checked = 0
    for e in runs.ran:
        body = e.event.body
        if body["job"] != tw_jobs.sweep.name:
            assert body["partition"] is None, body
            continue
        p = body["partition"]
        assert body["instance"].split("~")[1] == str(p)
        assert partition_of(body["instance"], PARTITIONS) == p
        tick = ticks[body["tick"]]
        assert tick.partition == p, f"{body['tick']} committed in partition {tick.partition}"
        assert body["worker"] in lines, body
        at = tick.event.created_at
        assert p in owned_around(lines[body["worker"]], at), (
            f"{body['tick']} ran on {body['worker']} at {at}, which owned "
            f"{sorted(owned_around(lines[body['worker']], at))}"
        )
        checked += 1
    return checked


def check_disabled_then_enabled(runs: Runs, instance: Instance) -> None:
    """Nothing ran between the instance's Disabled and the Enabled after it, a new timer then."""
    disabled = runs.of(instance, DISABLED)[0]
    enabled_again = next(
        e for e in runs.of(instance, ENABLED) if e.event.version > disabled.event.version
    )
    between = [
        e.event.body["slot"]
        for e in runs.ticked[instance]
        if disabled.event.version < e.event.version < enabled_again.event.version
    ]
    assert not between, f"{instance} ran while disabled: {between}"
    after = [e for e in runs.ticked[instance] if e.event.version > enabled_again.event.version]
    assert after, f"{instance} never ran after it was enabled again"
    before = [e for e in runs.ticked[instance] if e.event.version < disabled.event.version]
    assert after[0].event.body["timer_id"] != before[-1].event.body["timer_id"]


def check_outage(
    runs: Runs, rows: list[tuple[int, Timer]], instance: Instance, killed_at: int, restarted: int
) -> None:
    """No slot due while no worker ran was run (but the latest one due when the restarted
    worker claimed it); the claim counted those it passed over as skipped."""
    ticks = runs.ticked[instance]
    due = [e.event.body["due_at"] for e in ticks]
    # The restarted worker claims after it started, and sends the latest slot due then.
    in_gap = [d for d in due if killed_at < d <= restarted - 1000]
    assert not in_gap, f"{instance}: slots due in the outage ran: {in_gap}"
    before = [e for e in ticks if e.event.body["due_at"] <= killed_at][-1].event.body
    after = next(e for e in ticks if e.event.body["due_at"] > killed_at).event.body
    assert after["timer_id"] == before["timer_id"], "the first tick after is the same timer's"
    missed = after["slot"] - before["slot"] - 1
    assert missed >= 3, (instance, before, after)
    mine = [(at, t) for at, t in rows if t.id == before["timer_id"]]
    skipped_before = max((t.skipped for at, t in mine if at < killed_at), default=0)
    skipped_after = max(t.skipped for _, t in mine)
    assert skipped_after - skipped_before >= missed, (instance, skipped_before, skipped_after)


def check_rule_after(
    runs: Runs, instance: Instance, restarted: int, reason: str | None, every: int
) -> None:
    """After the restart with a new default: the instance's slots are `every` apart, from
    its rescheduling for the new default (`reason` "default"), or without one (None)."""
    moved = [e for e in runs.of(instance, RESCHEDULED) if e.event.body.get("reason") == "default"]
    if reason is None:
        assert not moved, f"{instance} left its override: {moved}"
        later = [e for e in runs.ticked[instance] if e.event.created_at > restarted]
    else:
        assert len(moved) == 1, (instance, moved)
        assert moved[0].event.created_at > restarted
        assert moved[0].event.body["rule"]["every"] == every
        later = [e for e in runs.ticked[instance] if e.event.version > moved[0].event.version]
    due = [e.event.body["due_at"] for e in later]
    assert len(due) >= 3, (instance, due)
    # Slots of the rule (its start is 0): exactly `every` apart unless one was coalesced.
    assert all(d % every == 0 for d in due), (instance, every, due)
    assert sum(b - a == every for a, b in itertools.pairwise(due)) >= 2, (instance, due)


# --- driving the cluster -------------------------------------------------------------------


class Workers:
    """The cluster's workers by the tag each one's handler records (`TW_WORKER`)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.by_tag: dict[str, Worker] = {}

    def start(self, name: str, **env: str) -> Worker:
        tag = f"{name}.{len(self.cluster.workers) + 1}"
        worker = self.cluster.start_worker(name, TW_WORKER=tag, **env)
        self.by_tag[tag] = worker
        return worker


async def send_all(client: Client, commands: Iterable[CommandEnvelope], *codes: ResultCode) -> None:
    commands = list(commands)
    await client.send(*commands)
    results = await client.wait_results([c.request_id for c in commands])
    got = {r.request_id: r.code for r in results.values()}
    assert set(got.values()) <= set(codes or (ResultCode.COMMITTED,)), [
        (r.aggregate.tenant, r.aggregate.id, r.code, r.message) for r in results.values()
    ]


async def tickwheel_jobs(cluster: Cluster, *args: str) -> str:
    """Runs `tickwheel jobs …` against the cluster's context; its output (exit code 0)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "tests" / "integration"),
        "KAFKA_BOOTSTRAP_SERVERS": cluster.bootstrap,
        "TICKWHEEL_PARTITIONS": str(cluster.partitions),
        "TW_TEST_CONTEXT": cluster.context,
    }
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "app.cli", "jobs", *args, "--service", "tw_jobs:service"),
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    text = out.decode()
    assert proc.returncode == 0, text
    return text


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def instances(job: Job, tenants: Iterable[str] = (DEFAULT_TENANT,)) -> list[Instance]:
    """The (tenant, id) of each of the job's instances, as `enable_commands` enables them."""
    commands = enable_commands("any", job, partitions=PARTITIONS, tenants=tenants)
    return [(c.aggregate.tenant, c.aggregate.id) for c in commands]


# --- the tests -----------------------------------------------------------------------------


async def test_jobs_run_each_slot_once_through_kill_9_disable_and_a_new_default(
    cluster: Cluster,
) -> None:
    began = time.monotonic()

    def phase(name: str) -> None:
        print(f"{time.monotonic() - began:6.1f}s {name}")

    ctx = cluster.context
    heartbeat, per_tenant, sweep = tw_jobs.heartbeat, tw_jobs.per_tenant, tw_jobs.sweep
    system = instances(heartbeat)[0]
    tenant = instances(per_tenant, ["acme"])[0]
    shards = instances(sweep)
    overriding, paused = shards[3], shards[5]
    everyone = [system, tenant, *shards]
    workers = Workers(cluster)
    ownership: dict[str, list[Owned]] = defaultdict(list)
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_ownership(workers, ownership, stop))
    try:
        async with Client(cluster, "schedule") as schedule:
            w1, w2 = workers.start("w1"), workers.start("w2")
            await cluster.wait_owned(w1)
            await cluster.wait_owned(w2)
            phase("two workers own partitions")
            await send_all(
                schedule,
                [
                    *enable_commands(ctx, heartbeat, partitions=PARTITIONS),
                    *enable_commands(ctx, per_tenant, partitions=PARTITIONS, tenants=["acme"]),
                    *enable_commands(ctx, sweep, partitions=PARTITIONS),
                ],
            )
            # One shard ticks by its own interval (set by the CLI): it keeps it when the
            # default changes.
            shard = ("--job", sweep.name, "--partition", "3")
            out = await tickwheel_jobs(
                cluster, "reschedule", "--context", ctx, *shard, "--rule", '{"every": 1200}'
            )
            assert f"reschedule {ctx}.schedule/(0)/{overriding[1]}: COMMITTED" in out, out
            phase("enabled 10 instances, shard 3 every 1.2 s")

            async def each_ran(slots: int) -> bool:
                counts = ran_counts(await read_runs(cluster))
                return all(counts[i] >= slots for i in everyone)

            # kill -9 one of two workers mid-run (every instance ran a few slots); a new one
            # takes its place
            await eventually(lambda: each_ran(3), 60, "3 slots run by every instance", 1)
            first_kill = now_ms()
            w2.kill9()
            w3 = workers.start("w3")
            await cluster.wait_owned(w3, within=90)
            phase("w2 killed, w3 owns partitions")

            async def all_ran_since(at: int, which: Iterable[Instance] = everyone) -> bool:
                runs = await read_runs(cluster)
                after = {i for i, ticks in runs.ticked.items() if ticks[-1].event.created_at > at}
                return set(which) <= after

            await eventually(lambda: all_ran_since(first_kill), 60, "every instance ran again", 1)
            phase("every instance ran after the kill")

            # disable and enable again: the SYSTEM job by the CLI, a shard by the builders
            out = await tickwheel_jobs(
                cluster, "disable", "--context", ctx, "--job", heartbeat.name
            )
            assert f"disable {ctx}.schedule/(0)/heartbeat: COMMITTED" in out, out
            await send_all(
                schedule, [disable_command(ctx, sweep, partition=5, partitions=PARTITIONS)]
            )
            # Disabled while the others ran on past a slot of theirs (1 to 1.2 s apart): the
            # nodes' timer loops had the chance to run the disabled ones.
            disabled_at = now_ms()
            others = [i for i in everyone if i not in (system, paused)]
            await eventually(
                lambda: all_ran_since(disabled_at + 1000, others), 30, "the others ran on", 1
            )
            out = await tickwheel_jobs(cluster, "enable", "--context", ctx, "--job", heartbeat.name)
            assert f"enable {ctx}.schedule/(0)/heartbeat: COMMITTED" in out, out
            await send_all(
                schedule, [enable_command(ctx, sweep, partition=5, partitions=PARTITIONS)]
            )
            phase("disabled and enabled heartbeat (CLI) and shard 5 again")

            await eventually(lambda: each_ran(20), 60, "20 slots run by every instance", 1)
            phase("20 slots run by every instance")

            # the only worker: killed for ~5 s, started again with a new default rule
            w1.stop()
            await eventually(lambda: len(owned(w3)) == PARTITIONS, 60, "w3 owns everything")
            alone = now_ms()
            await eventually(lambda: all_ran_since(alone + 1000), 30, "w3 runs everything", 1)
            phase("w3 alone")
            killed_at = now_ms()
            w3.kill9()
            # No worker runs for 5 s of wall clock: slots of the 1 s rules fall due meanwhile.
            await sleep_until(killed_at + 5_000)
            restarted_at = now_ms()
            w3 = workers.start("w3", TW_JOB_EVERY_MS="1500")
            await cluster.wait_owned(w3, within=90)
            phase("w3 killed and started again, with a default of 1.5 s")

            async def new_rule_ticks() -> bool:
                runs = await read_runs(cluster)
                return all(
                    sum(e.event.created_at > restarted_at for e in runs.ticked[i]) >= 4
                    for i in everyone
                )

            await eventually(new_rule_ticks, 60, "4 slots of each instance after the restart", 1)
            phase("4 slots of each instance after the restart")
            listed = await tickwheel_jobs(cluster, "list", "--context", ctx, "--state")
            runs = await settle(
                cluster,
                schedule,
                [
                    disable_command(ctx, heartbeat),
                    disable_command(ctx, per_tenant, tenant="acme"),
                    *(
                        disable_command(ctx, sweep, partition=p, partitions=PARTITIONS)
                        for p in range(8)
                    ),
                ],
            )
    finally:
        stop.set()
        await sampler

    check_each_slot_ran_once(runs)
    counts = ran_counts(runs)
    assert all(counts[i] >= 20 for i in everyone), counts
    sharded = check_sharded_runs_on_owners(runs, ownership)
    assert sharded >= 8 * 20

    for instance in (system, paused):
        check_disabled_then_enabled(runs, instance)
    rows = await read_timer_rows(cluster)
    for instance in everyone:
        check_outage(runs, rows, instance, killed_at, restarted_at)
        if instance == overriding:
            check_rule_after(runs, instance, restarted_at, None, every=1200)
        else:
            check_rule_after(runs, instance, restarted_at, "default", every=1500)
    assert '"every":1200' in listed and 'override {"every":1200}' in listed, listed
    phase(f"checked {len(runs.ran)} runs, {sharded} of them sharded")


async def test_a_tenant_job_runs_each_slot_once_in_each_tenant(cluster: Cluster) -> None:
    ctx = cluster.context
    job = tw_jobs.per_tenant
    tenants = instances(job, TENANTS)
    workers = Workers(cluster)
    async with Client(cluster, "schedule") as schedule:
        w1, w2 = workers.start("w1"), workers.start("w2")
        await cluster.wait_owned(w1)
        await cluster.wait_owned(w2)
        commands = [
            enable_command(ctx, job, tenant="acme"),
            enable_command(ctx, job, tenant="globex"),
            enable_command(ctx, job, tenant="initech", rule={"every": 1200}),
        ]
        await send_all(schedule, commands)

        async def twenty_each() -> bool:
            counts = ran_counts(await read_runs(cluster))
            return all(counts[i] >= 20 for i in tenants)

        await eventually(twenty_each, 60, "20 slots run in each tenant", 1)
        disables = [disable_command(ctx, job, tenant=t) for t in TENANTS]
        runs = await settle(cluster, schedule, disables)
    check_each_slot_ran_once(runs)
    for instance in tenants:
        ran = [e.event.body for e in runs.ran if e.event.body["tenant"] == instance[0]]
        assert all(r["instance"] == job.name and r["partition"] is None for r in ran)
        due = [e.event.body["due_at"] for e in runs.ticked[instance]]
        every = 1200 if instance[0] == "initech" else 1000
        assert all(d % every == 0 for d in due), (instance, due)


def _json_lines(out: str) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in out.splitlines() if line.startswith("{")]


async def test_a_paused_job_is_backfilled_once_and_triggered_once_by_the_cli(
    cluster: Cluster,
) -> None:
    """Issue 22: pause and resume a job, then backfill a range over live and paused slots
    (twice), and trigger it twice under one request id; each slot runs once."""
    ctx = cluster.context
    job = ("--context", ctx, "--job", tw_jobs.heartbeat.name)
    system = instances(tw_jobs.heartbeat)[0]
    workers = Workers(cluster)
    async with Client(cluster, "schedule") as schedule:
        await cluster.wait_owned(workers.start("w1"))
        await tickwheel_jobs(cluster, "enable", *job)

        async def ran(slots: int, since: int = 0) -> bool:
            runs = await read_runs(cluster)
            return sum(t.event.created_at > since for t in runs.ticked[system]) >= slots

        await eventually(lambda: ran(3), 60, "3 slots run live", 1)
        await tickwheel_jobs(cluster, "disable", *job)  # pause
        paused = now_ms()
        await sleep_until(paused + 3_000)  # slots due while paused: none runs
        await tickwheel_jobs(cluster, "enable", *job)  # resume
        resumed = now_ms()
        await eventually(lambda: ran(2, resumed), 60, "2 slots run after the resume", 1)

        live = {
            t.event.request_id: t.event.body["due_at"]
            for t in (await read_runs(cluster)).ticked[system]
        }
        start, end = min(live.values()), max(live.values())
        window = ("--from", str(start), "--until", str(end), "--json")
        planned = _json_lines(await tickwheel_jobs(cluster, "backfill", *job, *window, "--dry-run"))
        assert [p["due_at"] for p in planned] == list(range(start, end + 1, tw_jobs.EVERY_MS))
        assert live.items() <= {p["request_id"]: p["due_at"] for p in planned}.items()
        missed = [p for p in planned if p["request_id"] not in live]
        assert len(missed) >= 2, "the paused window's slots"

        done = _json_lines(await tickwheel_jobs(cluster, "backfill", *job, *window))
        codes = {d["request_id"]: d["code"] for d in done}
        assert codes == {
            p["request_id"]: "DUPLICATE" if p["request_id"] in live else "COMMITTED"
            for p in planned
        }
        again = _json_lines(await tickwheel_jobs(cluster, "backfill", *job, *window))
        assert {d["code"] for d in again} == {"DUPLICATE"}

        by_hand = ("--request-id", f"by-hand-{ctx}", "--json")
        (first,) = _json_lines(await tickwheel_jobs(cluster, "trigger", *job, *by_hand))
        (second,) = _json_lines(await tickwheel_jobs(cluster, "trigger", *job, *by_hand))
        assert (first["code"], second["code"]) == ("COMMITTED", "DUPLICATE")

        await send_all(schedule, [disable_command(ctx, tw_jobs.heartbeat)])

        async def settled() -> bool:
            runs = await read_runs(cluster)
            kinds = (TICKED, BACKFILLED, TRIGGERED)
            applied = {e.event.request_id for e in runs.schedule if e.event.type in kinds}
            return applied == {e.event.body["tick"] for e in runs.ran}

        await eventually(settled, 30, "every run's Ran in the log")
        runs = await read_runs(cluster)
    mine = [e.event.body for e in runs.ran if e.event.body["instance"] == system[1]]
    in_range = sorted(r["due_at"] for r in mine if r["slot"] >= 0 and start <= r["due_at"] <= end)
    assert in_range == [p["due_at"] for p in planned], "each slot of the range ran once"
    by_hand_id = f"trigger:by-hand-{ctx}"  # the action's own id (`action_request_id`)
    assert [r["tick"] for r in mine if r["slot"] == TRIGGERED_SLOT] == [by_hand_id]
    assert len({r["tick"] for r in mine}) == len(mine), "no request id ran twice"
    assert len(runs.of(system, BACKFILLED)) == len(missed)
