"""Phase c of `bench.timers_bench`, failover: `kill -9` of one of two workers, until its
partitions' timers fire again on the survivor, and what the survivor's log says it did."""

from __future__ import annotations

import argparse
import time
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

from app.kafka.connection import KafkaConnection
from bench.common import CpuMeter, Worker, owned, wait_until
from bench.timers_setup import Setup, lateness_of, steady


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
        base_p99 = lateness_of(baseline).get("p99_ms", 0)
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
            "baseline_lateness_before_kill": lateness_of(baseline),
            "survivor_longest_gap_ms": gap,
            "survivor_log": _survivor_steps(survivor, killed_at[0], lost),
            "due_before_kill_fired_after": len(overdue),
            "due_before_kill_max_lateness_ms": max((r[1] - r[2] for r in overdue), default=None),
            "lost_partitions_lateness_after_kill": lateness_of(
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
