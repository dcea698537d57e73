"""Timer firing figures (issue 5), end to end on a real broker, printed as JSON.

    python -m bench.timers_bench                         # phases a, b, c with defaults
    python -m bench.timers_bench --phases a --timers 100000
    python -m bench.timers_bench --phases b --rate 5000 --seconds 20
    python -m bench.timers_bench --timer-options '{"max_in_flight": 1000}'
    python -m bench.timers_bench --phases a --profile /tmp/prof   # py-spy the worker

Timers are set the way a service in another language would: the bench writes
`wow.ScheduleSet` events (a once rule, command `Fire`, target = the owner, a `counter`
aggregate) straight to `<ctx>.counter.events`; the workers' timers subscription puts them
in the timer table, the runner claims and sends each `Fire` command, the target's command
path applies it (a `Fired` event whose body carries the slot's `not_before`), the result
comes back and the runner settles the timer FIRED in the changelog. Tail consumers in the
bench read the `Fired` events and the changelog (committed records only).

a. burst: `--timers` timers all due at T0; they are written, the bench waits until the
   subscription's committed log offsets cover them all (`ingest_per_s`), then from T0
   until every timer has its `Fired` event and a FIRED changelog row:
   `timers_per_s` = N / (that moment - T0).
b. lateness at a steady `--rate` for `--seconds`: each timer is written `--lead-ms` before
   it is due (so puts arrive while timers fire, as in production); lateness of each
   `Fired` event = its `created_at` (the target's clock when it applied it) - its
   `not_before` (the slot's due time).
c. failover: two workers, timers due continuously at `--failover-rate`; `kill -9` of the
   second worker; failover = first `Fired` event of one of its partitions created by the
   survivor - the kill. Bounded below by the session timeout (the group notices the
   death), then a rebalance and the restore of the partitions.

Targets: >= 15,000 timers/s; lateness p99 <= 50 ms at 5,000 timers/s; failover <= 10 s.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import orjson

from app.kafka.connection import KafkaConnection
from app.protocol.wire import SCHEDULE_SET, EventEnvelope, ScheduleSet, encode
from app.timers.runner import TimerOptions
from bench import traced_worker, txn_steps
from bench.common import (
    Client,
    Cluster,
    CpuMeter,
    Producer,
    Profiler,
    Tail,
    TracedCluster,
    WarmCluster,
    Worker,
    admin_client,
    broker_pid,
    delete_context_topics,
    group_committed,
    machine,
    new_bench_context,
    now_ms,
    owned,
    percentiles,
    run_and_print,
    wait_stable,
    wait_until,
)
from tables import AggregateRef, CommandSpec, OnceRule
from tables.partitioner import partition_of

TARGET_PER_S = 15_000
TARGET_P99_MS = 50.0
TARGET_FAILOVER_S = 10.0

Encoded = tuple[int, bytes, bytes, str]  # partition, key, value, the slot's request id


class Fired:
    """The `Fired` events and the PENDING and FIRED changelog rows the tails read."""

    def __init__(self) -> None:
        # request id -> (partition, created_at, not_before, read at)
        self.applied: dict[str, tuple[int, int, int, float]] = {}
        self.duplicates = 0
        self.settled: dict[bytes, float] = {}
        # request id of the first slot -> when the worker wrote its PENDING row (the put:
        # the record's timestamp, not when the bench read it, which the bench's own lag
        # would inflate)
        self.stored: dict[str, float] = {}
        # how long after it was written each PENDING row was read (the tails' own lag)
        self.read_lag_ms: list[float] = []

    def on_events(self, partition: int, records: list[Any], received: float) -> None:
        for r in records:
            if b'"type":"Fired"' not in r.value:
                continue
            e = orjson.loads(r.value)
            rid = e["request_id"]
            if rid in self.applied:
                self.duplicates += 1  # applied twice: what must never happen
                continue
            self.applied[rid] = (partition, e["created_at"], e["body"]["not_before"], received)

    def on_changelog(self, partition: int, records: list[Any], received: float) -> None:
        for r in records:
            if r.value is None:
                continue
            if b'"status":"FIRED"' in r.value:
                self.settled.setdefault(r.key, received)
            elif b'"status":"PENDING"' in r.value:
                self.stored.setdefault(orjson.loads(r.value)["id"] + "#0", r.timestamp / 1e3)
                self.read_lag_ms.append(received * 1e3 - r.timestamp)


class Scheduler:
    """Encodes `wow.ScheduleSet` events of a bench context's `counter` owners."""

    def __init__(self, context: str, partitions: int, owners: int) -> None:
        self.partitions = partitions
        self.owners = owners
        owner = AggregateRef(context=context, aggregate="counter", id="o0")
        event = EventEnvelope(
            id="x",
            type=SCHEDULE_SET,
            aggregate=owner,
            version=1,
            created_at=0,
            body=ScheduleSet(
                key="k", rule=OnceRule(at=0), command=CommandSpec(type="Fire")
            ).model_dump(mode="json"),
        )
        self._base = orjson.loads(encode(event))
        self._parts = [partition_of(f"o{i}", partitions) for i in range(owners)]

    def event(self, n: int, tag: str, due: int) -> Encoded:
        o = n % self.owners
        b = self._base
        timer_id = f"{tag}-{n}"
        b["id"] = timer_id
        b["aggregate"]["id"] = f"o{o}"
        b["created_at"] = now_ms()
        b["body"]["key"] = timer_id
        b["body"]["rule"]["at"] = due
        return self._parts[o], f"o{o}".encode(), orjson.dumps(b), f"{timer_id}#0"


class Setup:
    """A cluster of workers, the bench's producer and the tails of one phase."""

    def __init__(
        self, kafka: KafkaConnection, base: Path, args: argparse.Namespace, kind: str
    ) -> None:
        self.kafka = kafka
        self.bootstrap = kafka.bootstrap_servers
        self.args = args
        self.context = new_bench_context(kind)
        experiments = ("TW_WARM_TOPICS=",)
        experiment = any(kv.startswith(experiments) for kv in args.worker_env)
        cluster_type = TracedCluster if args.trace else WarmCluster if experiment else Cluster
        self.cluster = cluster_type(
            self.bootstrap,
            base / self.context,
            context=self.context,
            partitions=args.partitions,
            env={
                "TICKWHEEL_TIMER_OPTIONS": args.timer_options,
                "TICKWHEEL_SESSION_TIMEOUT_MS": str(args.session_timeout_ms),
                **dict(kv.split("=", 1) for kv in args.worker_env),
            },
            kafka=kafka,
        )
        self.client = Client(self.cluster)
        self.fired = Fired()
        self.scheduler = Scheduler(self.context, args.partitions, args.owners)
        self.producer = Producer(kafka)
        self.workers: list[Worker] = []
        self.tails: list[Tail] = []

    async def start(self, workers: int) -> float:
        await self.client.__aenter__()
        began = time.monotonic()
        self.workers = [self.cluster.start_worker() for _ in range(workers)]
        await wait_stable(self.workers, self.args.partitions)
        settled = time.monotonic() - began
        parts = range(self.args.partitions)
        t = self.client.topics
        self.tails = [
            Tail(self.kafka, t.events, parts, self.fired.on_events),
            Tail(self.kafka, t.timers_changelog, parts, self.fired.on_changelog),
        ]
        for tail in self.tails:
            await tail.start()
        await self.producer.start()
        return settled

    def trace(self) -> dict[str, Any] | None:
        """The first worker's cumulative step timings (with --trace)."""
        if not isinstance(self.cluster, TracedCluster) or not self.workers:
            return None
        return traced_worker.read(str(self.cluster.trace_path(self.workers[0].name)))

    def txn_steps(self, t0_ms: int) -> dict[str, Any] | None:
        """Each worker's transactions at a burst's due time, step by step (with --trace)."""
        if not isinstance(self.cluster, TracedCluster):
            return None
        return {
            w.name: txn_steps.around(str(self.cluster.txn_steps_path(w.name)), t0_ms)
            for w in self.workers
        }

    def pids(self) -> dict[str, int | None]:
        pids: dict[str, int | None] = {
            f"worker{i + 1}": w.proc.pid for i, w in enumerate(self.workers) if w.alive
        }
        pids["broker"] = broker_pid(self.bootstrap)
        return pids

    async def stop(self) -> None:
        try:
            await self.producer.stop()
            for tail in self.tails:
                await tail.stop()
            await self.client.__aexit__()
        finally:
            self.cluster.stop_all()
            await delete_context_topics(self.kafka, self.context)

    async def write(self, events: list[Encoded]) -> dict[int, int]:
        topic = self.client.topics.events
        for p, key, value, _ in events:
            await self.producer.send(topic, p, key, value)
        return await self.producer.flush()

    async def ingested(self, ends: dict[int, int], admin: Any) -> bool:
        """Whether the timers subscription committed its log offsets past `ends`."""
        committed = await group_committed(admin, self.cluster.group, self.client.topics.events)
        return all(committed.get(p, -1) >= end for p, end in ends.items())


def _lateness(rows: list[tuple[int, int, int, float]]) -> dict[str, Any]:
    return percentiles([created - due for _, created, due, _ in rows])


async def burst(kafka: KafkaConnection, base: Path, args: argparse.Namespace) -> dict[str, Any]:
    """a. N timers all due at T0: timers fired (applied and settled) per second."""
    s = Setup(kafka, base, args, "ta")
    try:
        settled_s = await s.start(args.workers)
        n: int = args.timers
        t0 = now_ms() + args.burst_lead_ms
        events = [s.scheduler.event(i, "burst", t0) for i in range(n)]
        ids = {e[3] for e in events}
        write_began = time.time()
        worker = s.workers[0].proc.pid
        async with admin_client(kafka) as admin:
            # The ingest's own CPU: from the first write until the subscription committed the
            # last (the worker's runner is idle meanwhile: nothing is due before T0).
            with (
                CpuMeter(s.pids()) as ingest_cpu,
                Profiler(args.profile, worker, "ingest"),
            ):
                ends = await s.write(events)
                written = time.time()
                while not await s.ingested(ends, admin):
                    if now_ms() > t0 + 120_000:
                        raise RuntimeError("the timers subscription never took the burst in")
                    await asyncio.sleep(0.05)
                ingested = time.time()
        slack_ms = t0 - int(ingested * 1000)
        if slack_ms > 0:
            await asyncio.sleep(slack_ms / 1000)
        fired = s.fired

        def done_check() -> bool:
            return len(fired.settled) >= n and sum(1 for i in ids if i in fired.applied) >= n

        traced = s.trace()
        with CpuMeter(s.pids()) as cpu, Profiler(args.profile, worker, "burst"):
            done = await wait_until(done_check, args.timeout, interval=0.1)
        await asyncio.sleep(0.6 if args.trace else 0)  # the next trace snapshot
        trace = s.trace()
        txns = s.txn_steps(t0)
        rows = [fired.applied[i] for i in ids if i in fired.applied]
        applied_at = max((r[3] for r in rows), default=time.time())
        settled_at = max(fired.settled.values(), default=time.time())
        end = max(applied_at, settled_at)
        first = min((r[3] for r in rows), default=end)
        last_created = max((r[1] for r in rows), default=t0)
        return {
            "workers": args.workers,
            "timers": n,
            "written_per_s": round(n / max(1e-3, written - write_began)),
            "ingest_per_s": round(n / max(1e-3, ingested - write_began)),
            "ingest_worker1_cpu_ms_per_timer": round(
                ingest_cpu.figures["cpu_s"]["worker1"] * 1000 / n, 4
            ),
            "ingest_cpu": ingest_cpu.figures,
            "ingested_before_t0": slack_ms >= 0,
            "slack_ms": slack_ms,
            "complete": done,
            "applied": len(rows),
            "settled_fired": len(fired.settled),
            "duplicates": fired.duplicates,
            "timers_per_s": round(len(rows) / max(1e-3, end - t0 / 1000), 1),
            "applied_per_s": round(len(rows) / max(1e-3, applied_at - t0 / 1000), 1),
            "applied_per_s_worker_clock": round(len(rows) / max(1e-3, (last_created - t0) / 1000)),
            "first_fired_after_t0_ms": round((first - t0 / 1000) * 1000),
            # When a worker decided it (the `Fired` event's created_at): the rest of the
            # first fire is its transaction's commit and the bench's tail reading it.
            "first_decided_after_t0_ms": min((r[1] for r in rows), default=t0) - t0,
            "all_applied_after_t0_s": round(applied_at - t0 / 1000, 2),
            "all_settled_after_t0_s": round(settled_at - t0 / 1000, 2),
            "workers_settled_s": round(settled_s, 1),
            # From a PENDING row's write to the bench reading it: the bench's own lag (not
            # in any figure above), with its commit's.
            "bench_read_lag": percentiles(s.fired.read_lag_ms),
            "cpu": cpu.figures,
            **({"trace_worker1": traced_worker.diff(traced, trace)} if trace else {}),
            **({"transactions_at_t0": txns} if txns else {}),
        }
    finally:
        await s.stop()


async def steady(
    s: Setup,
    rate: float,
    seconds: float,
    lead_ms: int,
    tag: str,
    during: Any = None,
) -> tuple[list[str], float, float]:
    """Writes timers at `rate` for `seconds`, each due `lead_ms` after it is written;
    `during(elapsed)` is awaited on the way (the failover's kill). (ids, start, end)."""
    topic = s.client.topics.events
    ids: list[str] = []
    start = time.time()
    n = 0
    total = int(rate * seconds)
    while n < total:
        elapsed = time.time() - start
        upto = min(total, int(elapsed * rate) + 1)
        due = now_ms() + lead_ms
        while n < upto:
            p, key, value, rid = s.scheduler.event(n, tag, due)
            await s.producer.send(topic, p, key, value)
            ids.append(rid)
            n += 1
        if during is not None:
            await during(elapsed)
        await asyncio.sleep(0.002)
    await s.producer.flush()
    return ids, start, time.time()


async def lateness(kafka: KafkaConnection, base: Path, args: argparse.Namespace) -> dict[str, Any]:
    """b. Lateness at a steady rate."""
    s = Setup(kafka, base, args, "tb")
    try:
        await s.start(args.workers)
        # A short warm-up, not counted: connections, first rounds, first transactions.
        await steady(s, min(args.rate, 500), 2, args.lead_ms, "warm")
        await asyncio.sleep(args.lead_ms / 1000 + 1)
        traced = s.trace()
        with CpuMeter(s.pids()) as cpu, Profiler(args.profile, s.workers[0].proc.pid, "steady"):
            ids, start, end = await steady(s, args.rate, args.seconds, args.lead_ms, "steady")
            last_due = end + args.lead_ms / 1000
            done = await wait_until(
                lambda: all(i in s.fired.applied for i in ids),
                max(0.0, last_due - time.time()) + args.drain_s,
                interval=0.1,
            )
        await asyncio.sleep(0.6 if args.trace else 0)
        trace = s.trace()
        rows = [s.fired.applied[i] for i in ids if i in s.fired.applied]
        unfired = len(ids) - len(rows)
        # The rate the runner kept up: timers applied per second while they came due.
        created = sorted(r[1] for r in rows)
        span = (created[-1] - created[0]) / 1000 if len(created) > 1 else 0
        figures = {
            "workers": args.workers,
            "offered_per_s": args.rate,
            "written_per_s": round(len(ids) / max(1e-3, end - start), 1),
            "seconds": args.seconds,
            "lead_ms": args.lead_ms,
            "timers": len(ids),
            "applied": len(rows),
            "unfired_at_end": unfired,
            "complete": done,
            "duplicates": s.fired.duplicates,
            "applied_per_s": round(len(rows) / span, 1) if span else None,
            "lateness": _lateness(rows),
            # From the bench writing the ScheduleSet to the worker writing its PENDING
            # changelog row: how far behind the timers subscription was (lateness includes
            # it when > lead).
            "put_lag": percentiles(
                [
                    s.fired.stored[i] * 1e3 - (r[2] - args.lead_ms)
                    for i in ids
                    if i in s.fired.stored and (r := s.fired.applied.get(i))
                ]
            ),
            "put_after_due": sum(
                1
                for i in ids
                if i in s.fired.stored
                and (r := s.fired.applied.get(i))
                and s.fired.stored[i] * 1e3 > r[2]
            ),
            # From the PENDING row's write (or the due time, if later) to the target applying it.
            "fire_lag": percentiles(
                [
                    r[1] - max(r[2], s.fired.stored[i] * 1e3)
                    for i in ids
                    if i in s.fired.stored and (r := s.fired.applied.get(i))
                ]
            ),
            # From a PENDING row's write to the bench reading it: the bench's own lag (not
            # in any figure above), with its commit's.
            "bench_read_lag": percentiles(s.fired.read_lag_ms),
            "cpu": cpu.figures,
            **({"trace_worker1": traced_worker.diff(traced, trace)} if trace else {}),
        }
        p99 = figures["lateness"].get("p99_ms")
        figures["meets_p99_target"] = (
            None
            if p99 is None or args.rate < 5_000
            else bool(p99 <= TARGET_P99_MS and unfired == 0)
        )
        return figures
    finally:
        await s.stop()


async def failover(kafka: KafkaConnection, base: Path, args: argparse.Namespace) -> dict[str, Any]:
    """c. kill -9 of one of two workers: until its partitions' timers fire again."""
    s = Setup(kafka, base, args, "tc")
    try:
        await s.start(2)
        victim, survivor = s.workers[1], s.workers[0]
        lost = sorted(owned(victim))
        kept = sorted(owned(survivor))
        killed_at: list[float] = []

        async def kill_when(elapsed: float) -> None:
            if not killed_at and elapsed >= args.failover_warm_s:
                killed_at.append(time.time())
                victim.kill9()

        seconds = args.failover_warm_s + args.failover_observe_s
        with CpuMeter(s.pids()) as cpu:
            ids, _, _ = await steady(
                s, args.failover_rate, seconds, args.lead_ms, "fo", during=kill_when
            )
            # Wait for the timers still due (and the claims the dead worker held to lapse).
            await wait_until(
                lambda: all(i in s.fired.applied for i in ids),
                args.lead_ms / 1000 + args.failover_drain_s,
                interval=0.2,
            )
        kill_ms = int(killed_at[0] * 1000)
        rows = [s.fired.applied[i] for i in ids if i in s.fired.applied]
        lost_set, kept_set = set(lost), set(kept)
        after = sorted((r for r in rows if r[0] in lost_set and r[1] > kill_ms), key=lambda r: r[1])
        first = after[0] if after else None
        # The survivor's own partitions: the longest gap between two applied timers around
        # the kill (an eager rebalance makes it let go of and take back its partitions too).
        around = sorted(
            r[1] for r in rows if r[0] in kept_set and kill_ms - 2_000 <= r[1] <= kill_ms + 30_000
        )
        gap = max((b - a for a, b in pairwise(around)), default=None)
        # Slots due before the kill on the lost partitions that the dead worker had not applied.
        overdue = [r for r in rows if r[0] in lost_set and r[2] <= kill_ms < r[1]]
        unfired = [i for i in ids if i not in s.fired.applied]
        # Lateness before the kill (all partitions): what "normal" is on this machine.
        baseline = [r for r in rows if r[2] < kill_ms - 500 and r[1] < kill_ms]
        base_p99 = _lateness(baseline).get("p99_ms", 0)
        normal_ms = max(1_000.0, 2 * float(base_p99))
        # When the lost partitions were back to normal: the first applied timer after which
        # every later one of theirs was applied within `normal_ms` of its due time.
        lost_rows = sorted(
            (r for r in rows if r[0] in lost_set and r[1] > kill_ms), key=lambda r: r[1]
        )
        normal_at = None
        for i in range(len(lost_rows) - 1, -1, -1):
            if lost_rows[i][1] - lost_rows[i][2] > normal_ms:
                normal_at = lost_rows[i + 1][1] if i + 1 < len(lost_rows) else None
                break
        else:
            normal_at = lost_rows[0][1] if lost_rows else None

        def series(parts: set[int]) -> list[list[float]]:
            """Per second after the kill (by due time): [s, applied, lateness p50, max]."""
            by: dict[int, list[int]] = {}
            for r in rows:
                if r[0] in parts and r[2] >= kill_ms - 2_000:
                    by.setdefault((r[2] - kill_ms) // 1_000, []).append(r[1] - r[2])
            return [[k, len(v), sorted(v)[len(v) // 2], max(v)] for k, v in sorted(by.items())]

        return {
            "workers": 2,
            "rate_per_s": args.failover_rate,
            "lost_partitions": lost,
            "kept_partitions": kept,
            "failover_s": None if first is None else round((first[1] - kill_ms) / 1000, 2),
            "failover_read_s": None if first is None else round(first[3] - killed_at[0], 2),
            "back_to_normal_s": None
            if normal_at is None
            else round((normal_at - kill_ms) / 1000, 2),
            "normal_lateness_ms": normal_ms,
            "baseline_lateness_before_kill": _lateness(baseline),
            "survivor_longest_gap_ms": gap,
            "survivor_log": _survivor_steps(survivor, killed_at[0], lost),
            "due_before_kill_fired_after": len(overdue),
            "due_before_kill_max_lateness_ms": max((r[1] - r[2] for r in overdue), default=None),
            "lost_partitions_lateness_after_kill": _lateness(
                [r for r in rows if r[0] in lost_set and r[2] > kill_ms]
            ),
            "timers": len(ids),
            "unfired_at_end": len(unfired),
            "duplicates": s.fired.duplicates,
            "lateness_by_due_second_lost": series(lost_set),
            "lateness_by_due_second_kept": series(kept_set),
            "cpu": cpu.figures,
        }
    finally:
        await s.stop()


def _log_times(worker: Worker, since: float) -> list[tuple[float, str]]:
    """The worker's log lines after `since` (epoch s), with their times."""
    out = []
    for line in worker.text().splitlines():
        try:
            at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            continue
        if at >= since:
            out.append((at, line[24:]))
    return out


def _survivor_steps(survivor: Worker, killed: float, lost: list[int]) -> dict[str, Any]:
    """What the survivor's log says it did after the kill, in seconds after it."""
    lines = _log_times(survivor, killed)
    steps: dict[str, Any] = {}

    def first(pred: Any) -> float | None:
        return next((round(at - killed, 2) for at, text in lines if pred(text)), None)

    steps["revoked_own_partitions_s"] = first(lambda t: ": stopped" in t)
    started = [
        round(at - killed, 2)
        for at, text in lines
        if "timers of partition" in text
        and "started" in text
        and int(text.split("timers of partition ", 1)[1].split(":", 1)[0]) in lost
    ]
    steps["lost_partitions_started_s"] = [min(started), max(started)] if started else None
    steps["owning_all_s"] = first(
        lambda t: "owning partitions [" in t and len(t.split("[", 1)[1].split(",")) >= len(lost) * 2
    )
    return steps


async def run(kafka: KafkaConnection, base: Path, args: argparse.Namespace) -> dict[str, Any]:
    options = TimerOptions.model_validate(orjson.loads(args.timer_options))
    out: dict[str, Any] = {
        "bench": "timers",
        "machine": machine(),
        "broker": kafka.describe(),
        "partitions": args.partitions,
        "owners": args.owners,
        "session_timeout_ms": args.session_timeout_ms,
        "worker_env": args.worker_env,
        "timer_options": args.timer_options,
        "timer_options_effective": options.model_dump(mode="json"),
    }
    if "a" in args.phases:
        out["a_burst"] = await burst(kafka, base, args)
    if "b" in args.phases:
        out["b_lateness"] = await lateness(kafka, base, args)
    if "c" in args.phases:
        out["c_failover"] = await failover(kafka, base, args)
    a, b, c = out.get("a_burst"), out.get("b_lateness"), out.get("c_failover")
    out["targets"] = {
        "timers_per_s": TARGET_PER_S,
        "meets_throughput": None if a is None else a["timers_per_s"] >= TARGET_PER_S,
        "lateness_p99_ms_at_5000_per_s": TARGET_P99_MS,
        "meets_lateness": None if b is None else b["meets_p99_target"],
        "failover_s": TARGET_FAILOVER_S,
        "meets_failover": None
        if c is None or c["failover_s"] is None
        else c["failover_s"] <= TARGET_FAILOVER_S,
    }
    out["machine"]["loadavg_after"] = machine()["loadavg"]
    return out


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phases", default="abc", help="any of a (burst), b (lateness), c")
    parser.add_argument("--workers", type=int, default=1, help="workers in phases a and b")
    parser.add_argument("--timers", type=int, default=10_000, help="a: timers due at once")
    parser.add_argument("--burst-lead-ms", type=int,
                        help="a: T0 after the writing starts; must cover the ingest "
                        "(default 5 s + 1 s per 800 timers)")  # fmt: skip
    parser.add_argument("--rate", type=float, default=5_000, help="b: timers due per second")
    parser.add_argument("--seconds", type=float, default=20, help="b: how long")
    parser.add_argument("--lead-ms", type=int, default=3_000,
                        help="b, c: how long before its due time a timer is written")  # fmt: skip
    parser.add_argument("--drain-s", type=float, default=20,
                        help="b: longest wait after the last due time")  # fmt: skip
    parser.add_argument("--failover-rate", type=float, default=200)
    parser.add_argument("--failover-warm-s", type=float, default=6)
    parser.add_argument("--failover-observe-s", type=float, default=24)
    parser.add_argument("--failover-drain-s", type=float, default=40,
                        help="c: longest wait after the last timer is written")  # fmt: skip
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--owners", type=int, default=1_000)
    parser.add_argument("--timer-options", default="{}",
                        help="TICKWHEEL_TIMER_OPTIONS (JSON); {} = the defaults")  # fmt: skip
    parser.add_argument("--session-timeout-ms", type=int, default=6_000)
    parser.add_argument("--timeout", type=float, default=120, help="a: longest wait")
    parser.add_argument("--profile", help="py-spy the first worker into this directory")
    parser.add_argument("--trace", action="store_true",
                        help="time the first worker's steps (bench.traced_worker)")  # fmt: skip
    parser.add_argument("--dir", help="keep worker logs and data here")
    parser.add_argument("--worker-env", action="append", default=[], metavar="KEY=VALUE",
                        help="more environment for the workers, e.g. "
                        "TICKWHEEL_COMMIT_INTERVAL_MS=1000 (repeatable)")  # fmt: skip
    args = parser.parse_args()
    if args.burst_lead_ms is None:
        args.burst_lead_ms = 5_000 + args.timers * 1_000 // 800
    run_and_print(run, args, "tickwheel-timerbench-")


if __name__ == "__main__":
    cli()
