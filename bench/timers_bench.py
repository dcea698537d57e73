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

What the phases run on (the workers, the bench's producer and tails, the events written):
`bench.timers_setup`; phase c: `bench.timers_failover`.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

import orjson

from app.kafka.connection import KafkaConnection
from app.timers.runner import TimerOptions
from bench import traced_worker
from bench.common import (
    CpuMeter,
    Profiler,
    admin_client,
    machine,
    now_ms,
    percentiles,
    run_and_print,
    wait_until,
)
from bench.timers_failover import failover
from bench.timers_setup import Setup, lateness_of, steady

TARGET_PER_S = 15_000
TARGET_P99_MS = 50.0
TARGET_FAILOVER_S = 10.0


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
            "lateness": lateness_of(rows),
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
