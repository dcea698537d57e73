"""TimerStore (RocksDB) figures, printed as JSON.

    python -m bench.store_bench                     # 1,000,000 timers over 12 partitions
    python -m bench.store_bench --timers 10000000   # the 10M memory target

Loads N pending timers through `apply_changelog` (the restore rate), then measures
`due()` latency (limit 1000; all 12 partitions and 4 of them; `due_rows()`, which builds
no Timer, and `due()` asked in turn), put and settle
throughput, the store's CPU per timer fired in-process (`fire`: due rows, still-due check, settle),
the sweep of finished rows (`expire`, as the runner calls it), a burst's drain (`--burst`
timers due at one instant, claimed round by round), and the RSS
of a fresh process that opens the N-timer store and serves `due()` from it. Targets:
restore >= 200,000 timers/s, due() p99 <= 5 ms at 1M, RSS <= 200 MB at 10M pending.

The reads run with the collector as a worker runs it (`--collector node`, the default:
what start-up and the restore made frozen, the young generation collected every 50,000
allocations, `app.node.collector`), or with Python's own (`--collector python`): then a
full collection now and then walks every module's objects (pydantic's validators are
costly to walk: 15-20 ms on the 2-core box) inside whichever call it lands in.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import orjson

from tables import (
    AggregateRef,
    ChangelogRecord,
    ChangelogSink,
    CommandSpec,
    IntervalRule,
    Timer,
    TimerChange,
    TimerStatus,
    TimerStore,
    open_timer_store,
)
from tables.keys import row_key_of

PARTITIONS = 12
BASE = 1_767_225_600_000  # 2026-01-01T00:00:00Z
SPREAD = 86_400_000  # due times over one day
RESTORE_BATCH = 10_000
NODE_GC_THRESHOLD = 50_000
"""`TICKWHEEL_GC_THRESHOLD`'s default (`app.node.settings`)."""


def template(partition: int = 0) -> Timer:
    owner = AggregateRef(context="shop", aggregate="order", tenant="acme", id="order-0")
    return Timer(
        id="01JGZ0000000000000000000000",
        owner=owner,
        key="payment-reminder",
        version=3,
        partition=partition,
        rule=IntervalRule(start=BASE, every=3_600_000),
        target=owner,
        command=CommandSpec(type="RemindPayment", body={"channel": "email", "attempt": 1}),
        slot_due_at=BASE,
        due_at=BASE,
    )


def records(
    partition: int, count: int, seed: int, *, spread: int = SPREAD
) -> Iterator[tuple[int, bytes, bytes]]:
    """`count` changelog records of pending timers of `partition`, due over `spread` ms
    from BASE (a day; 1: all at BASE)."""
    rng = random.Random(seed)
    row = template(partition).model_dump(mode="json")
    for offset in range(count):
        n = offset * PARTITIONS + partition
        due = BASE + rng.randrange(spread)
        row["id"] = f"01JGZ{n:022d}"
        row["owner"] = row["target"] = {**row["owner"], "id": f"order-{n}"}
        row["due_at"] = row["slot_due_at"] = due
        yield offset, row_key_of(row), orjson.dumps(row)


def tune_collector(collector: str) -> None:
    """As `app.node.collector.tune_collector` does with the default threshold (`node`);
    `python` leaves Python's own collector."""
    gc.collect()
    if collector == "node":
        gc.freeze()
        gc.set_threshold(NODE_GC_THRESHOLD, 20, 20)


def full_collections() -> int:
    return int(gc.get_stats()[2]["collections"])


def rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def percentiles(samples: list[float], cpu: list[float] | None = None) -> dict[str, float]:
    """Wall-clock p50/p99/max; with `cpu`, the calling thread's CPU time too (what the
    call costs when it does not wait for a core another process holds)."""

    def p99(ordered: list[float]) -> float:
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]

    ordered = sorted(samples)
    figures = {
        "p50_ms": round(statistics.median(ordered) * 1e3, 3),
        "p99_ms": round(p99(ordered) * 1e3, 3),
        "max_ms": round(ordered[-1] * 1e3, 3),
    }
    if cpu:
        figures["cpu_p50_ms"] = round(statistics.median(cpu) * 1e3, 3)
        figures["cpu_p99_ms"] = round(p99(sorted(cpu)) * 1e3, 3)
    return figures


async def restore(store: TimerStore, timers: int) -> dict[str, Any]:
    """Only `apply_changelog` and `end_restore` are timed, not the making of the records."""
    per_partition = timers // PARTITIONS
    elapsed = cpu = 0.0
    for partition in range(PARTITIONS):
        made = records(partition, per_partition, seed=partition)
        while batch := list(islice(made, RESTORE_BATCH)):
            started, started_cpu = time.perf_counter(), time.process_time()
            await store.apply_changelog(partition, batch)
            elapsed += time.perf_counter() - started
            cpu += time.process_time() - started_cpu
        # As a node's restore ends (app.timers.restore): the restore's memtables flushed
        # and the DB reopened as usual. Part of the restore's cost, and due() below reads
        # the store as a node serves it (unended, a scan sorts the memtable each time).
        started, started_cpu = time.perf_counter(), time.process_time()
        await store.end_restore(partition)
        elapsed += time.perf_counter() - started
        cpu += time.process_time() - started_cpu
    total = per_partition * PARTITIONS
    return {
        "timers": total,
        "batch": RESTORE_BATCH,
        "seconds": round(elapsed, 2),
        "timers_per_s": round(total / elapsed),
        "cpu_seconds": round(cpu, 2),
        "timers_per_cpu_s": round(total / cpu),
    }


async def due_latency(
    store: TimerStore,
    partitions: set[int],
    rounds: int,
    until: int = BASE + SPREAD // 4,
    limit: int = 1_000,
    *,
    rows: bool = False,
) -> dict[str, Any]:
    """due() asked again and again (a quarter of all timers are due: `limit` decides);
    `rows`: due_rows() instead (no Timer built)."""
    call = store.due_rows if rows else store.due
    samples, cpu = [], []
    for _ in range(rounds):
        started, started_cpu = time.perf_counter(), time.thread_time()
        found = await call(partitions, until, limit)
        samples.append(time.perf_counter() - started)
        cpu.append(time.thread_time() - started_cpu)
        assert len(found) == limit
    return {"partitions": len(partitions), "limit": limit, "rounds": rounds,
            **percentiles(samples, cpu)}  # fmt: skip


async def due_rows_vs_due(store: TimerStore, rounds: int, limit: int = 1_000) -> dict[str, Any]:
    """`due_rows()` and `due()` of all 12 partitions asked in turn on the same store (A/B in
    one process: the load on the box falls on both alike); `due_rows` builds no Timer."""
    every, until = set(range(PARTITIONS)), BASE + SPREAD // 4
    samples: dict[str, tuple[list[float], list[float]]] = {"due_rows": ([], []), "due": ([], [])}
    for _ in range(rounds):
        for name, call in (("due_rows", store.due_rows), ("due", store.due)):
            started, started_cpu = time.perf_counter(), time.thread_time()
            found = await call(every, until, limit)
            samples[name][0].append(time.perf_counter() - started)
            samples[name][1].append(time.thread_time() - started_cpu)
            assert len(found) == limit
    return {"partitions": PARTITIONS, "limit": limit, "rounds": rounds,
            **{name: percentiles(wall, cpu) for name, (wall, cpu) in samples.items()}}  # fmt: skip


async def due_draining(store: TimerStore, rounds: int) -> dict[str, Any]:
    """due() as the firing loop calls it: each round claims what the last one found."""
    until = BASE + SPREAD // 4
    samples, cpu = [], []
    claimed = 0
    for _ in range(rounds):
        started, started_cpu = time.perf_counter(), time.thread_time()
        found = await store.due(set(range(PARTITIONS)), until, 1_000)
        samples.append(time.perf_counter() - started)
        cpu.append(time.thread_time() - started_cpu)
        claim = {"status": TimerStatus.FIRING, "due_at": until + 1}
        claims = [TimerChange(loaded=t, next=t.model_copy(update=claim)) for t in found]
        for start in range(0, len(claims), 100):
            claimed += await store.settle(claims[start : start + 100])
    return {"partitions": PARTITIONS, "limit": 1_000, "rounds": rounds, "claimed": claimed,
            **percentiles(samples, cpu)}  # fmt: skip


async def settle_rate(store: TimerStore, batches: int) -> dict[str, Any]:
    until = BASE + SPREAD
    found = await store.due(set(range(PARTITIONS)), until, batches * 100)
    changes = [
        TimerChange(
            loaded=t,
            next=t.model_copy(update={"status": TimerStatus.FIRING, "due_at": t.due_at + 30_000}),
        )
        for t in found
    ]
    started = time.perf_counter()
    written = 0
    for start in range(0, len(changes), 100):
        written += await store.settle(changes[start : start + 100])
    elapsed = time.perf_counter() - started
    return {"batch": 100, "changes": written, "changes_per_s": round(written / elapsed)}


async def fire_cost(store: TimerStore, count: int, batch: int = 250) -> dict[str, Any]:
    """The store's share of timers fired in-process (#20), `batch` a cycle, as a node does
    it: the round's `due_rows()` and build, the cycle's still-due check (`find`) of each
    and the settle of each FIRED against the row as loaded. CPU µs per timer (the node's
    decisions, commands and transaction are not in it: `bench.decide_bench`)."""
    every = set(range(PARTITIONS))
    fired = 0
    started = time.process_time()
    while fired < count:
        rows = await store.due_rows(every, BASE + SPREAD, min(batch, count - fired))
        if not rows:
            break
        loaded = [row.timer() for row in rows]
        kept = []
        for t in loaded:
            row = await store.find(t.owner, t.key)
            if row is not None and row.same_as_loaded(t):
                kept.append(t)
        changes = [
            TimerChange(loaded=t, next=t.model_copy(update={"status": TimerStatus.FIRED}))
            for t in kept
        ]
        fired += await store.settle(changes)
    cpu = time.process_time() - started
    return {"fired": fired, "batch": batch,
            "cpu_us_per_timer": round(cpu / max(1, fired) * 1e6, 1)}  # fmt: skip


async def sweep_rate(store: TimerStore, count: int, limit: int = 1_000) -> dict[str, Any]:
    """`count` due timers settled FIRED, then swept past their retention `limit` at a time,
    as the runner's rounds do: each call's latency (what a round spends sweeping)."""
    found = await store.due(set(range(PARTITIONS)), BASE + SPREAD, count)
    fired = [
        TimerChange(loaded=t, next=t.model_copy(update={"status": TimerStatus.FIRED}))
        for t in found
    ]
    for start in range(0, len(fired), 1_000):
        await store.settle(fired[start : start + 1_000])
    now, retention = BASE + 2 * SPREAD, SPREAD // 2
    samples, cpu = [], []
    swept = 0
    for partition in range(PARTITIONS):
        while True:
            started, started_cpu = time.perf_counter(), time.thread_time()
            deleted = await store.expire(partition, now, retention, limit)
            samples.append(time.perf_counter() - started)
            cpu.append(time.thread_time() - started_cpu)
            swept += deleted
            if deleted < limit:
                break
    return {"fired": len(fired), "swept": swept, "limit": limit, "calls": len(samples),
            **percentiles(samples, cpu)}  # fmt: skip


async def burst_drain(path: str, count: int, limit: int = 1_000) -> dict[str, Any]:
    """`count` timers all due at one instant, drained as the firing loop drains a burst:
    each round's `due_rows()` (limit 1000, all 12 partitions) and the claim of every row
    it found (moved 30 s on, FIRING). Each claim leaves a tombstone at the instant: a
    scan that stepped over all of them again would cost more a timer the larger the
    burst. The rounds' `due_rows()` wall time, and the CPU per timer of the whole drain."""
    store = open_timer_store(f"rocksdb://{path}", partitions=PARTITIONS)
    for partition in range(PARTITIONS):
        await store.apply_changelog(
            partition, list(records(partition, count // PARTITIONS, partition, spread=1))
        )
    every, samples, claimed = set(range(PARTITIONS)), [], 0
    claim = {"status": TimerStatus.FIRING, "due_at": BASE + 30_000}
    started = time.process_time()
    while True:
        asked = time.perf_counter()
        rows = await store.due_rows(every, BASE, limit)
        samples.append(time.perf_counter() - asked)
        if not rows:
            break
        loaded = [row.timer() for row in rows]
        changes = [TimerChange(loaded=t, next=t.model_copy(update=claim)) for t in loaded]
        for start in range(0, len(changes), 250):
            claimed += await store.settle(changes[start : start + 250])
    cpu = time.process_time() - started
    await store.close()
    return {"timers": count, "claimed": claimed, "rounds": len(samples) - 1,
            "cpu_us_per_timer": round(cpu / max(1, claimed) * 1e6, 1),
            "due_rows": percentiles(samples)}  # fmt: skip


async def put_rate(path: str, count: int) -> dict[str, Any]:
    """Puts one after another, as the timers subscription writes them: new timers into
    an empty store, then each rescheduled (a new id over a held row)."""
    sent = 0

    async def sink(records: list[ChangelogRecord]) -> None:
        nonlocal sent
        sent += len(records)

    sinks: tuple[tuple[str, ChangelogSink | None], ...] = (("no_sink", None), ("with_sink", sink))
    figures: dict[str, Any] = {}
    for label, changelog in sinks:
        shutil.rmtree(path, ignore_errors=True)
        store = open_timer_store(f"rocksdb://{path}", partitions=PARTITIONS, changelog=changelog)
        base = template()
        timers = [
            base.model_copy(
                update={
                    "id": f"put-{i}",
                    "owner": base.owner.model_copy(update={"id": f"o{i}"}),
                    "partition": i % PARTITIONS,
                    "due_at": BASE + i,
                }
            )
            for i in range(count)
        ]
        started = time.perf_counter()
        for timer in timers:
            await store.put(timer)
        elapsed = time.perf_counter() - started
        figures[label] = round(count / elapsed)
        rescheduled = [t.model_copy(update={"id": t.id + "-2", "version": 4}) for t in timers]
        started = time.perf_counter()
        for timer in rescheduled:
            await store.put(timer)
        figures[f"{label}_reschedule"] = round(count / (time.perf_counter() - started))
        await store.close()
    shutil.rmtree(path, ignore_errors=True)
    return {"puts": count, "ops_per_s": figures}


async def probe(path: str, timers: int, collector: str) -> dict[str, Any]:
    """In a fresh process: open the store, serve due() for a while, report RSS."""
    store = open_timer_store(f"rocksdb://{path}", partitions=PARTITIONS)
    tune_collector(collector)
    opened = rss_mb()
    latency = await due_latency(store, set(range(PARTITIONS)), 200, until=BASE + SPREAD)
    # The store serves what the first process left pending (some of it was fired and
    # swept there, which rows depends on their random due times).
    assert await store.due({0, 1, 2, 3}, BASE + SPREAD, 1_000) or timers < PARTITIONS
    figures = {"rss_mb_opened": round(opened, 1), "rss_mb_serving": round(rss_mb(), 1),
               "due_all_12_fresh_process": latency}  # fmt: skip
    await store.close()
    return figures


async def serve(path: str, timers: int, collector: str) -> dict[str, Any]:
    store = open_timer_store(f"rocksdb://{path}", partitions=PARTITIONS)
    figures: dict[str, Any] = {"restore": await restore(store, timers)}
    tune_collector(collector)
    figures["collector"] = collector
    full_before = full_collections()
    every = set(range(PARTITIONS))
    figures["due_all_12"] = await due_latency(store, every, 300)
    figures["due_4_of_12"] = await due_latency(store, {0, 1, 2, 3}, 300)
    figures["due_all_12_limit_250"] = await due_latency(store, every, 300, limit=250)
    figures["due_rows_all_12"] = await due_latency(store, every, 300, rows=True)
    figures["due_rows_vs_due_all_12"] = await due_rows_vs_due(store, 300)
    figures["due_draining"] = await due_draining(store, 50)
    figures["full_collections_during_due"] = full_collections() - full_before
    figures["settle"] = await settle_rate(store, 100)
    figures["fire"] = await fire_cost(store, min(20_000, timers // 4))
    figures["sweep"] = await sweep_rate(store, min(20_000, timers // 2))
    await store.close()
    return figures


def main(timers: int, workdir: str, puts: int, collector: str, burst: int) -> dict[str, Any]:
    path = os.path.join(workdir, "timers")
    figures: dict[str, Any] = {"timers": timers, "partitions": PARTITIONS, "cpus": os.cpu_count()}
    figures["loadavg_before"] = [round(load, 2) for load in os.getloadavg()]
    figures.update(asyncio.run(serve(path, timers, collector)))
    probe_args = ["--probe", path, "--timers", str(timers), "--collector", collector]
    probed = subprocess.run(
        [sys.executable, "-m", "bench.store_bench", *probe_args],
        check=True,
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    figures["rss"] = json.loads(probed.stdout)
    size = sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())
    figures["disk_mb"] = round(size / 2**20, 1)
    figures["put"] = asyncio.run(put_rate(os.path.join(workdir, "puts"), puts))
    figures["burst_drain"] = asyncio.run(burst_drain(os.path.join(workdir, "burst"), burst))
    figures["loadavg_after"] = [round(load, 2) for load in os.getloadavg()]
    return figures


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timers", type=int, default=1_000_000)
    parser.add_argument("--puts", type=int, default=50_000)
    parser.add_argument(
        "--burst", type=int, default=96_000, help="timers due at one instant, drained"
    )
    parser.add_argument("--dir", help="work directory (default: a temporary one, removed)")
    parser.add_argument(
        "--collector",
        choices=("node", "python"),
        default="node",
        help="the reads' garbage collector: a worker's (default) or Python's own",
    )
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        print(json.dumps(asyncio.run(probe(args.probe, args.timers, args.collector))))
        return
    workdir = args.dir or tempfile.mkdtemp(prefix="tickwheel-bench-")
    try:
        print(
            json.dumps(main(args.timers, workdir, args.puts, args.collector, args.burst), indent=2)
        )
    finally:
        if not args.dir:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    cli()
