"""Command path figures (issue 4), end to end on a real broker, printed as JSON.

    python -m bench.commands_bench                  # 1 and 2 workers, then latency
    python -m bench.commands_bench --rate 10000     # latency at the target's rate
    python -m bench.commands_bench --commands 50000 --workers 1

A command is `Apply` on one of `--aggregates` `counter` aggregates (one `Applied` event
each). End to end: the bench sends it to `<ctx>.counter.commands`, a worker decides it,
appends the event and publishes the result in one Kafka transaction, and a tail consumer
in the bench reads the committed result.

1. throughput, for each worker count: a backlog of `--commands` commands is produced as
   fast as the bench can, while the workers run; commands/s = N / (last result read -
   first command sent). `drain_per_s` counts from the first result to the last (the
   workers' rate without the bench's sending).
2. latency at a fixed offered rate (`--rate`, default half the measured maximum of the
   `--latency-workers` run) for `--seconds`: per command, the time from the bench's send
   to the bench reading its result; split at the result's `decided_at` (the worker's
   clock, same machine) into "sent → decided" and "decided → result read".

Targets: >= 20,000 commands/s; p99 <= 20 ms at 10,000 commands/s.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from app.kafka.connection import KafkaConnection
from app.protocol.wire import encode
from bench import traced_worker
from bench.common import (
    Client,
    Cluster,
    CpuMeter,
    Producer,
    Profiler,
    Tail,
    TracedCluster,
    broker_pid,
    delete_context_topics,
    machine,
    new_bench_context,
    percentiles,
    run_and_print,
    wait_stable,
    wait_until,
)
from tables.partitioner import partition_of

TARGET_PER_S = 20_000
TARGET_P99_MS = 20.0
TARGET_RATE = 10_000


class Results:
    """The results read by the tail: when each request id's result came, and its content."""

    def __init__(self) -> None:
        self.read_at: dict[str, float] = {}
        self.decided_at: dict[str, int] = {}
        self.produced_at: dict[str, int] = {}
        self.batch: dict[str, tuple[str, int]] = {}
        self.codes: Counter[str] = Counter()

    def on_records(self, partition: int, records: list[Any], received: float) -> None:
        for r in records:
            rid = r.key.decode()
            if rid in self.read_at:
                continue
            self.read_at[rid] = received
            value = orjson.loads(r.value)
            self.decided_at[rid] = value["decided_at"]
            self.produced_at[rid] = r.timestamp  # the worker's producer's CreateTime
            # One batch (one transaction) of one command partition shares its decided_at.
            self.batch[rid] = (value["aggregate"]["id"], value["decided_at"])
            self.codes[value["code"]] += 1

    def have(self, ids: list[str]) -> int:
        return sum(1 for i in ids if i in self.read_at)


def transactions(results: Results, ids: list[str], partitions: int) -> int:
    """How many transactions (command partition, decided_at) decided `ids`."""
    parts: dict[str, int] = {}
    seen: set[tuple[int, int]] = set()
    for rid in ids:
        if rid not in results.batch:
            continue
        aid, at = results.batch[rid]
        p = parts.get(aid)
        if p is None:
            p = parts[aid] = partition_of(aid, partitions)
        seen.add((p, at))
    return len(seen)


def make_commands(
    client: Client, tag: str, count: int, aggregates: int, partitions: int
) -> list[tuple[int, bytes, bytes, str]]:
    """`count` Apply commands over `aggregates` ids, encoded: (partition, key, value, id)."""
    template = client.command("a0", "Apply", {})
    base = orjson.loads(encode(template))
    parts = [partition_of(f"a{i}", partitions) for i in range(aggregates)]
    out = []
    for n in range(count):
        a = n % aggregates
        rid = f"{tag}-{n}"
        base["request_id"] = rid
        base["aggregate"]["id"] = f"a{a}"
        base["issued_at"] = int(time.time() * 1000)
        out.append((parts[a], f"a{a}".encode(), orjson.dumps(base), rid))
    return out


async def blast(
    producer: Producer, topic: str, cmds: list[tuple[int, bytes, bytes, str]]
) -> tuple[float, float]:
    """Sends all as fast as the producer takes them; (first send, all acknowledged)."""
    first = time.time()
    for p, key, value, _ in cmds:
        await producer.send(topic, p, key, value)
    await producer.flush()
    return first, time.time()


async def throughput(
    cluster: Cluster,
    client: Client,
    producer: Producer,
    results: Results,
    pids: dict[str, int | None],
    args: argparse.Namespace,
) -> dict[str, Any]:
    topic = client.topics.commands
    # Warm up: connections, the aggregates' first states, the processors' transactions.
    warm = make_commands(client, "warm", args.warmup, args.aggregates, cluster.partitions)
    await blast(producer, topic, warm)
    if not await wait_until(lambda: results.have([c[3] for c in warm]) == len(warm), 120):
        raise RuntimeError(f"warm-up: {results.have([c[3] for c in warm])}/{len(warm)} results")
    cmds = make_commands(client, "tp", args.commands, args.aggregates, cluster.partitions)
    ids = [c[3] for c in cmds]
    trace_path = (
        str(cluster.trace_path(cluster.workers[0].name))
        if isinstance(cluster, TracedCluster)
        else None
    )
    traced = traced_worker.read(trace_path) if trace_path else None
    profile = Profiler(
        args.profile, cluster.workers[0].proc.pid, f"commands-{len(cluster.workers)}w"
    )
    with CpuMeter(pids) as cpu, profile:
        first, acked = await blast(producer, topic, cmds)
        done = await wait_until(lambda: results.have(ids) == len(ids), args.timeout)
    if trace_path:
        await asyncio.sleep(0.6)
    trace = traced_worker.read(trace_path) if trace_path else None
    got = [results.read_at[i] for i in ids if i in results.read_at]
    last = max(got) if got else time.time()
    first_result = min(got) if got else last
    txns = transactions(results, ids, cluster.partitions)
    return {
        "commands": len(ids),
        "results": len(got),
        "complete": done,
        "commands_per_s": round(len(got) / (last - first), 1),
        "drain_per_s": round(len(got) / max(1e-3, last - first_result), 1),
        "bench_send_per_s": round(len(ids) / max(1e-3, acked - first), 1),
        "seconds": round(last - first, 2),
        "transactions": txns,
        "commands_per_transaction": round(len(got) / max(1, txns), 1),
        "codes": dict(Counter(results.codes)),
        "cpu": cpu.figures,
        **({"trace_worker1": traced_worker.diff(traced, trace)} if trace else {}),
    }


async def latency(
    client: Client,
    producer: Producer,
    results: Results,
    pids: dict[str, int | None],
    rate: float,
    seconds: float,
    args: argparse.Namespace,
    partitions: int,
) -> dict[str, Any]:
    count = int(rate * seconds)
    cmds = make_commands(client, f"lat{int(rate)}", count, args.aggregates, partitions)
    topic = client.topics.commands
    sent_at: dict[str, float] = {}
    with CpuMeter(pids) as cpu:
        start = time.time()
        i = 0
        while i < count:
            upto = min(count, int((time.time() - start) * rate) + 1)
            while i < upto:
                p, key, value, rid = cmds[i]
                sent_at[rid] = time.time()
                await producer.send(topic, p, key, value)
                i += 1
            await asyncio.sleep(0.001)
        sent_for = time.time() - start
        await producer.flush()
        done = await wait_until(lambda: results.have(list(sent_at)) == count, args.timeout)
    total, decided, produced, after = [], [], [], []
    batches: set[tuple[int, int]] = set()
    parts: dict[str, int] = {}
    for rid, sent in sent_at.items():
        read = results.read_at.get(rid)
        if read is None:
            continue
        total.append((read - sent) * 1e3)
        decided.append(results.decided_at[rid] - sent * 1e3)
        produced.append(results.produced_at[rid] - results.decided_at[rid])
        after.append(read * 1e3 - results.produced_at[rid])
        aid, at = results.batch[rid]
        part = parts.get(aid)
        if part is None:
            part = parts[aid] = partition_of(aid, partitions)
        batches.add((part, at))
    send_to_result = percentiles(total)
    figures = {
        "offered_per_s": rate,
        "sent_per_s": round(count / sent_for, 1),
        "seconds": round(sent_for, 1),
        "complete": done,
        "send_to_result": send_to_result,
        "send_to_decided": percentiles(decided),
        "decided_to_result_produced": percentiles(produced),
        "result_produced_to_read": percentiles(after),
        "transactions": len(batches),
        "commands_per_transaction": round(len(total) / max(1, len(batches)), 1),
        "transactions_per_partition_per_s": round(len(batches) / partitions / sent_for, 1),
        "cpu": cpu.figures,
    }
    p99 = send_to_result.get("p99_ms")
    figures["meets_p99_target"] = (
        None if rate < TARGET_RATE or p99 is None else bool(p99 <= TARGET_P99_MS)
    )
    return figures


async def run(kafka: KafkaConnection, base: Path, args: argparse.Namespace) -> dict[str, Any]:
    bootstrap = kafka.bootstrap_servers
    out: dict[str, Any] = {
        "bench": "commands",
        "machine": machine(),
        "broker": kafka.describe(),
        "partitions": args.partitions,
        "aggregates": args.aggregates,
        "session_timeout_ms": args.session_timeout_ms,
        "worker_env": args.worker_env,
        "throughput": {},
    }
    counts = sorted({w for w in args.workers if w > 0} | {args.latency_workers})
    for workers in counts:
        context = new_bench_context("cmd")
        cluster = (TracedCluster if args.trace else Cluster)(
            bootstrap,
            base / context,
            context=context,
            partitions=args.partitions,
            env={
                "TICKWHEEL_SESSION_TIMEOUT_MS": str(args.session_timeout_ms),
                **dict(kv.split("=", 1) for kv in args.worker_env),
            },
            kafka=kafka,
        )
        try:
            async with Client(cluster) as client:
                began = time.monotonic()
                ws = [cluster.start_worker() for _ in range(workers)]
                await wait_stable(ws, args.partitions)
                settled = time.monotonic() - began
                pids: dict[str, int | None] = {
                    f"worker{i + 1}": w.proc.pid for i, w in enumerate(ws)
                }
                pids["broker"] = broker_pid(bootstrap)
                results = Results()
                tail = Tail(kafka, client.ctx.results, range(args.partitions), results.on_records)
                producer = Producer(kafka)
                await tail.start()
                await producer.start()
                try:
                    if workers in args.workers:
                        figures = await throughput(cluster, client, producer, results, pids, args)
                        figures["workers_settled_s"] = round(settled, 1)
                        out["throughput"][f"{workers}_workers"] = figures
                    if workers == args.latency_workers and args.seconds > 0:
                        rate = args.rate
                        if rate is None:
                            tp = out["throughput"].get(f"{workers}_workers")
                            if tp is None:
                                raise SystemExit("--rate is needed without a throughput run")
                            rate = max(100.0, round(tp["commands_per_s"] / 2, -2))
                        out["latency"] = {
                            "workers": workers,
                            **await latency(
                                client,
                                producer,
                                results,
                                pids,
                                rate,
                                args.seconds,
                                args,
                                args.partitions,
                            ),
                        }
                finally:
                    await producer.stop()
                    await tail.stop()
        finally:
            cluster.stop_all()
            await delete_context_topics(kafka, context)
    best = max((f["commands_per_s"] for f in out["throughput"].values()), default=None)
    out["targets"] = {
        "commands_per_s": TARGET_PER_S,
        "best_commands_per_s": best,
        "meets_throughput": None if best is None else best >= TARGET_PER_S,
        "p99_ms_at_10000_per_s": TARGET_P99_MS,
    }
    out["machine"]["loadavg_after"] = machine()["loadavg"]
    return out


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commands", type=int, default=60_000, help="per throughput run")
    parser.add_argument("--warmup", type=int, default=2_000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2],
                        help="throughput runs (0: none, latency only)")  # fmt: skip
    parser.add_argument("--rate", type=float, help="latency: offered commands/s")
    parser.add_argument("--seconds", type=float, default=15, help="latency: how long (0: none)")
    parser.add_argument("--latency-workers", type=int, default=1)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--aggregates", type=int, default=1_000)
    parser.add_argument("--session-timeout-ms", type=int, default=6_000)
    parser.add_argument("--timeout", type=float, default=120, help="longest wait for results")
    parser.add_argument("--dir", help="keep worker logs and data here")
    parser.add_argument("--worker-env", action="append", default=[], metavar="KEY=VALUE",
                        help="more environment for the workers, e.g. "
                        "TICKWHEEL_COMMIT_INTERVAL_MS=1000 (repeatable)")  # fmt: skip
    parser.add_argument("--profile", help="py-spy worker 1 (throughput runs) into this directory")
    parser.add_argument("--trace", action="store_true",
                        help="time worker 1's steps (bench.traced_worker)")  # fmt: skip
    args = parser.parse_args()
    run_and_print(run, args, "tickwheel-cmdbench-")


if __name__ == "__main__":
    cli()
