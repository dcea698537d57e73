"""The ingest path alone, in one process (no broker): CPU per ingested timer, printed as JSON.

    python -m bench.ingest_bench                  # 20,000 timers, batches of 500
    python -m bench.ingest_bench --timers 100000 --batch 2000 --repeat 5

What a worker does with each `wow.ScheduleSet` record of `<ctx>.<agg>.events`
(`PartitionCycles._subscribe`), stage by stage: the record as the group consumer hands it
on (`record`: aiokafka's `ConsumerRecord` made a `Record`, its sizes checked), the
envelope decoded (`decode`: `app.protocol.wire.decode`), the record's key and partition
checked against its aggregate (`route`: `misrouted`), its timer operation (`timer_op`:
the body validated, the first slot, the Timer), and a batch's puts (`apply`: `apply_all`
→ `put_many` on a RocksDB store, the rows encoded for a changelog sink that keeps
nothing). `total` is their sum; `decode` + `timer_op` + `apply` is what this bench
measured before the other two stages were added (2026-12-02). The records are the timers
benchmark's (`bench.timers_setup.Scheduler`), one partition's batch at a time, with the
collector as a worker runs it. Not measured here: the Kafka clients (the fetch, the
changelog producer, the transaction), which `bench.timers_bench`'s `ingest_cpu` includes.
Each figure is the least of `--repeat` runs (process CPU time, µs a timer): the machine
is shared, and the least is the run least disturbed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections import defaultdict
from typing import Any

from aiokafka.structs import ConsumerRecord

from app.commands.records import misrouted
from app.kafka.consumers import as_record as consumer_record  # what every consumer hands on
from app.node.collector import tune_collector
from app.protocol.limits import InputLimits
from app.protocol.wire import EventEnvelope, decode
from app.timers.subscription import TimerOp, apply_all, timer_op
from bench.common import machine, now_ms
from bench.timers_setup import Scheduler
from tables import ChangelogRecord
from tables.rocksdb_store import RocksDBTimerStore

PARTITIONS = 12


async def _discard(records: list[ChangelogRecord]) -> None:
    """A changelog sink that keeps nothing (the Kafka producer is not measured here)."""


async def once(timers: int, batch: int) -> dict[str, float]:
    """One run on a fresh store: CPU µs a timer of each stage and in all."""
    scheduler = Scheduler("benchingest", PARTITIONS, owners=1_000)
    due = now_ms() + 3_600_000
    topic = "benchingest.counter.events"
    by_partition: defaultdict[int, list[ConsumerRecord[bytes, bytes]]] = defaultdict(list)
    for n in range(timers):
        partition, key, value, _ = scheduler.event(n, "ingest", due)
        offset = len(by_partition[partition])
        by_partition[partition].append(
            ConsumerRecord(topic, partition, offset, 0, 0, key, value, None, 0, 0, ())
        )
    limits = InputLimits()
    spent = {"record": 0.0, "decode": 0.0, "route": 0.0, "timer_op": 0.0, "apply": 0.0}
    with tempfile.TemporaryDirectory(prefix="tickwheel-ingestbench-") as path:
        store = RocksDBTimerStore(path, PARTITIONS, _discard)
        try:
            clock = time.process_time
            for partition, fetched in sorted(by_partition.items()):
                for at in range(0, len(fetched), batch):
                    began = clock()
                    chunk = [consumer_record(m) for m in fetched[at : at + batch]]
                    for r in chunk:
                        limits.check(r.key, r.value)
                    read = clock()
                    events = [decode(EventEnvelope, r.value) for r in chunk]
                    decoded = clock()
                    wrong = [
                        misrouted(r, e.aggregate, PARTITIONS)
                        for r, e in zip(chunk, events, strict=True)
                    ]
                    routed = clock()
                    ops = [op for e in events if (op := timer_op(e, partition)) is not None]
                    decided = clock()
                    _, written = await apply_all(store, list[TimerOp](ops))
                    spent["record"] += read - began
                    spent["decode"] += decoded - read
                    spent["route"] += routed - decoded
                    spent["timer_op"] += decided - routed
                    spent["apply"] += clock() - decided
                    assert wrong == [None] * len(chunk)
                    assert len(written) == len(chunk)
        finally:
            await store.close()
    spent["total"] = sum(spent.values())
    return {stage: round(s / timers * 1e6, 2) for stage, s in spent.items()}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    tune_collector(50_000)  # as a worker's (`TICKWHEEL_GC_THRESHOLD`'s default)
    began = machine()
    runs = [await once(args.timers, args.batch) for _ in range(args.repeat)]
    best = min(runs, key=lambda r: r["total"])
    return {
        "bench": "ingest",
        "machine": began | {"loadavg_after": machine()["loadavg"]},
        "timers": args.timers,
        "batch": args.batch,
        "cpu_us_per_timer": best,
        "runs_total_us_per_timer": [r["total"] for r in runs],
    }


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timers", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=500, help="records a cycle")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the least is printed")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args)), indent=2))


if __name__ == "__main__":
    cli()
