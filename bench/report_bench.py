"""What a node's status report costs (#22), printed as JSON: no broker.

    python -m bench.report_bench                   # 1,200,000 timers over 12 partitions
    python -m bench.report_bench --timers 120000

Loads N pending timers (due over a day, the clock in the middle of it) into a RocksDB
timer store as `bench.store_bench` does, with every 100th of them PARKED, then times
`collect_report` as a node publishes it every `TICKWHEEL_STATUS_INTERVAL_MS` (1,000
due-index entries per partition at most) and as the operator page makes this node's
own rows at each load (10,000), and gives the size of the record a node writes and the
longest CPU time a report holds the event loop from another coroutine (a runner's). Each
partition's counts are taken once first, as a node's restore does (the first count
scans the partition whole).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from app.node.settings import Settings
from app.ops.cluster_status import PUBLISH_SCAN
from app.ops.node_report import collect_report, encode_report
from app.ops.page import PARKED_LIMIT, SCAN_LIMIT
from bench.store_bench import BASE, PARTITIONS, SPREAD, percentiles, restore
from tables import TimerChange, TimerStatus, TimerStore, open_timer_store

ROUNDS = 30


@dataclass
class _Kept:
    store: TimerStore


class _Clock:
    def now(self) -> int:
        return BASE + SPREAD // 2

    async def sleep_until(self, t: int) -> None:
        raise AssertionError("a report never sleeps")


class _Node:
    """What `collect_report` reads of a node owning every partition."""

    def __init__(self, store: TimerStore) -> None:
        self.settings = Settings(partitions=PARTITIONS)
        self.clock = _Clock()
        self.types = {"shop.order": _Kept(store)}

    def health(self) -> dict[str, Any]:
        return {"owned": list(range(PARTITIONS)), "restoring": [], "stalled": {}}


async def park_some(store: TimerStore, every: int) -> int:
    """Parks every `every`-th of the earliest due timers of each partition."""
    parked = 0
    for p in range(PARTITIONS):
        due = await store.due({p}, BASE + SPREAD, 2_000)
        changes = [
            TimerChange(loaded=t, next=t.model_copy(update={"status": TimerStatus.PARKED}))
            for t in due[::every]
        ]
        parked += await store.settle(changes)
    return parked


class _Held:
    """A coroutine beside the report, as a runner is: the longest CPU time the loop was
    held away from it (the stall a partition's firing sees), per report."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._running = True

    async def run(self) -> None:
        last = time.process_time()
        while self._running:
            await asyncio.sleep(0)
            now = time.process_time()
            self.longest = max(self.longest, now - last)
            last = now

    def stop(self) -> None:
        self._running = False


async def timed(node: _Node, scan: int, parked_total: int | None) -> dict[str, Any]:
    walls, cpus, held, size = [], [], [], 0
    for _ in range(ROUNDS):
        beside = _Held()
        task = asyncio.create_task(beside.run())
        await asyncio.sleep(0)
        started, started_cpu = time.perf_counter(), time.process_time()
        report = await collect_report(
            node,
            "bench-node:8080 (pid 1)",
            web=None,
            interval_ms=3_000,
            scan_limit=scan,
            parked_limit=PARKED_LIMIT if parked_total is None else 100,
            parked_total=parked_total,
        )
        walls.append(time.perf_counter() - started)
        cpus.append(time.process_time() - started_cpu)
        beside.stop()
        await task
        held.append(beside.longest)
        size = len(encode_report(report))
    return {
        "scan_limit": scan,
        **percentiles(walls, cpus),
        # The report's own CPU time between two turns of another coroutine, at most.
        "loop_held_cpu_max_ms": round(max(held) * 1e3, 3),
        "record_bytes": size,
    }


async def run(path: str, timers: int) -> dict[str, Any]:
    store = open_timer_store(f"rocksdb://{path}", partitions=PARTITIONS)
    try:
        figures: dict[str, Any] = {"restore": await restore(store, timers)}
        figures["parked"] = await park_some(store, 100)
        for p in range(PARTITIONS):
            # As a node's restore does: each partition counted whole once, then kept.
            store.status_counts(p)
        node = _Node(store)
        figures["published_report"] = await timed(node, PUBLISH_SCAN, 100)
        figures["page_own_rows"] = await timed(node, SCAN_LIMIT, None)
    finally:
        await store.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--timers", type=int, default=1_200_000)
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="tickwheel-report-bench-")
    try:
        figures: dict[str, Any] = {"timers": args.timers, "partitions": PARTITIONS}
        figures["loadavg_before"] = [round(x, 2) for x in os.getloadavg()]
        figures.update(asyncio.run(run(os.path.join(workdir, "timers"), args.timers)))
        figures["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
        print(json.dumps(figures, indent=2))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
