"""What each phase of `bench.timers_bench` runs on: a cluster of workers, the bench's
producer and tails (`Setup`), the `wow.ScheduleSet` events it writes (`Scheduler`, at a
steady rate: `steady`), and what its tails read (`Fired`, lateness percentiles)."""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

import orjson

from app.kafka.connection import KafkaConnection
from app.protocol.wire import SCHEDULE_SET, EventEnvelope, ScheduleSet, encode
from bench import traced_worker, txn_steps
from bench.common import (
    Client,
    Cluster,
    Producer,
    Tail,
    TracedCluster,
    WarmCluster,
    Worker,
    broker_pid,
    delete_context_topics,
    group_committed,
    new_bench_context,
    now_ms,
    percentiles,
    wait_stable,
)
from tables import AggregateRef, CommandSpec, OnceRule
from tables.partitioner import partition_of

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


def lateness_of(rows: list[tuple[int, int, int, float]]) -> dict[str, Any]:
    return percentiles([created - due for _, created, due, _ in rows])


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
