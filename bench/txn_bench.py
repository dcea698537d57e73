"""The cost of one Kafka transaction as the worker commits them, printed as JSON.

    python -m bench.txn_bench [--rounds 40] [--busy-ms 0,10] [--samples 12]

The command path commits one transaction per partition batch and the changelog one per
partition every `commit_interval_ms`, each through `app.kafka.TransactionalProducer`.

1. `back_to_back`, `pause_*`: `TransactionalProducer.commit` (one record + consumer
   offsets) on one producer, back to back and with a pause between transactions. Back to
   back, aiokafka's first AddPartitionsToTxn of a transaction is refused with
   CONCURRENT_TRANSACTIONS while the broker still writes the previous one's markers
   (KAFKA-5477) and retried after a fixed 20 ms: a floor under every partition's rate.
2. `burst_first`: what a partition's first transaction of a timer burst is: timer rows
   to the changelog partition its producer wrote before, and the fired events and
   commands to two topics it never wrote (`cold`: topics created after the producer
   started, unknown to its metadata, as a node's producer finds them at its first fire;
   `warm`: known), no offsets; and `offsets`: the same warm with consumer offsets (the
   command path's). Each with the event loop held by another task in turns of
   `--busy-ms` (a node's loop runs cycles, rounds and store writes between a commit's
   round trips): the commit's time over the turn's is how many turns of the loop its
   round trips wait for (`turns`). `steps_p50_ms` splits the commit (`bench.txn_steps`).
   `threaded`: warm, its producer's client on a loop of its own in a thread (`_Threaded`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

from app.kafka import OutRecord, TopicSpec, TransactionalProducer, ensure_topics
from app.kafka.connection import KafkaConnection
from bench import txn_steps
from bench.common import admin_client, broker, machine, percentiles


async def back_to_back(kafka: KafkaConnection, rounds: int) -> dict[str, Any]:
    topic = f"benchtxn{uuid.uuid4().hex[:8]}"
    await ensure_topics(kafka, [TopicSpec(topic, 1), TopicSpec(topic + "-in", 1)])
    producer = TransactionalProducer(kafka, f"{topic}.txn")
    await producer.start()
    out: dict[str, Any] = {}
    try:
        offset = 0
        for label, pause in (("back_to_back", 0.0), ("pause_50ms", 0.05), ("pause_200ms", 0.2)):
            samples = []
            for _ in range(rounds):
                await asyncio.sleep(pause)
                offset += 1
                began = time.perf_counter()
                await producer.commit(
                    [(topic, 0, b"k", b"v" * 200)], {(topic + "-in", 0): offset}, f"{topic}.g"
                )
                samples.append((time.perf_counter() - began) * 1e3)
            out[label] = percentiles(samples[2:])  # the first ones find no connection warm
    finally:
        await producer.stop()
        async with admin_client(kafka) as admin:
            await admin.delete_topics([topic, topic + "-in"])
    return out


async def _hog(busy_ms: float) -> None:
    """Holds the loop in turns of `busy_ms` (CPU, no await), as a busy node's cycles do."""
    while True:
        end = time.perf_counter() + busy_ms / 1000
        while time.perf_counter() < end:
            pass
        await asyncio.sleep(0)


def _records(changelog: str, events: str, commands: str, n: int) -> list[OutRecord]:
    rows: list[OutRecord] = [(changelog, 0, f"t{i}".encode(), b"r" * 300) for i in range(n)]
    rows += [(events, 0, b"o1", b"e" * 400) for _ in range(n)]
    rows += [(commands, 0, b"o1", b"c" * 300) for _ in range(n)]
    return rows


def _steps_p50(txns: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per step, the medians of its start and its duration (ms from the commit's start)."""
    starts: dict[str, list[float]] = defaultdict(list)
    spans: dict[str, list[float]] = defaultdict(list)
    for t in txns:
        for label, began, ended, *_ in t["steps"]:
            starts[label].append(began)
            spans[label].append(ended - began)
    med = statistics.median
    rows = {label: [round(med(starts[label]), 1), round(med(spans[label]), 1)] for label in starts}
    return dict(sorted(rows.items(), key=lambda kv: kv[1][0]))


class _Threaded:
    """A `TransactionalProducer` whose client runs on an event loop of its own, in a
    thread (`threaded`: what a node would gain if its producers' round trips did not
    wait for turns of its busy loop; the GIL is what they share)."""

    def __init__(self, kafka: KafkaConnection, transactional_id: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._kafka, self._tid = kafka, transactional_id
        self._producer: TransactionalProducer | None = None

    async def _on(self, coro: Any) -> Any:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    async def start(self) -> None:
        async def make() -> TransactionalProducer:
            producer = TransactionalProducer(self._kafka, self._tid)
            await producer.start()
            return producer

        self._producer = await self._on(make())

    async def commit(
        self, records: list[OutRecord], offsets: dict[tuple[str, int], int], group_id: str
    ) -> list[int]:
        assert self._producer is not None
        written: list[int] = await self._on(self._producer.commit(records, offsets, group_id))
        return written

    async def stop(self) -> None:
        if self._producer is not None:
            await self._on(self._producer.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


async def burst_first(
    kafka: KafkaConnection, busy: list[float], samples: int, steps_file: Path, kinds: list[str]
) -> dict[str, Any]:
    run = f"benchtxf{uuid.uuid4().hex[:8]}"
    changelog, source = f"{run}.timers", f"{run}.in"
    await ensure_topics(kafka, [TopicSpec(changelog, 1), TopicSpec(source, 1)])
    made = [changelog, source]
    out: dict[str, Any] = {}
    try:
        warm = (f"{run}.events", f"{run}.commands")
        await ensure_topics(kafka, [TopicSpec(t, 1) for t in warm])
        made += warm
        for kind in kinds:
            for busy_ms in busy:
                tid = f"{run}.{kind}.{busy_ms}"
                producer: TransactionalProducer | _Threaded
                if kind == "threaded":
                    producer = _Threaded(kafka, tid)
                else:
                    producer = TransactionalProducer(kafka, tid)
                await producer.start()
                # The changelog's own transactions, as the ingest commits them.
                await producer.commit(_records(changelog, changelog, changelog, 2), {}, "")
                tag = f"{run}.{busy_ms:g}x"
                fresh = [(f"{tag}{i}e", f"{tag}{i}c") for i in range(samples)]
                if kind == "cold":  # created after its start: unknown to its metadata
                    await ensure_topics(kafka, [TopicSpec(t, 1) for pair in fresh for t in pair])
                    made += [t for pair in fresh for t in pair]
                    await asyncio.sleep(1)  # their leaders elected
                totals, offset = [], 0
                before = len(txn_steps.read(str(steps_file)))
                hog = asyncio.create_task(_hog(busy_ms)) if busy_ms else None
                try:
                    for i in range(samples):
                        topics = fresh[i] if kind == "cold" else warm
                        await asyncio.sleep(0.2)  # the previous transaction's markers written
                        offset += 1
                        offsets = {(source, 0): offset} if kind == "offsets" else {}
                        began = time.perf_counter()
                        await producer.commit(_records(changelog, *topics, 6), offsets, f"{run}.g")
                        totals.append((time.perf_counter() - began) * 1e3)
                finally:
                    if hog is not None:
                        hog.cancel()
                    await producer.stop()
                txns = txn_steps.read(str(steps_file))[before:]
                p50 = statistics.median(totals)
                out[f"{kind}_busy{busy_ms:g}ms"] = {
                    "commit_ms": percentiles(totals),
                    **({"turns": round(p50 / busy_ms, 1)} if busy_ms else {}),
                    "steps_p50_ms": _steps_p50(txns[-samples:]),
                }
    finally:
        async with admin_client(kafka) as admin:
            await admin.delete_topics(made)
    return out


async def run(kafka: KafkaConnection, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"bench": "txn", "machine": machine(), "broker": kafka.describe()}
    with tempfile.TemporaryDirectory() as tmp:
        steps_file = Path(tmp) / "txn.jsonl"
        txn_steps.install(str(steps_file))
        if "back_to_back" in args.scenarios:
            out |= await back_to_back(kafka, args.rounds)
        if "burst_first" in args.scenarios:
            busy = [float(b) for b in args.busy_ms.split(",")]
            kinds = args.kinds.split(",")
            out["burst_first"] = await burst_first(kafka, busy, args.samples, steps_file, kinds)
    out["machine"]["loadavg_after"] = machine()["loadavg"]
    return out


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40, help="back_to_back: transactions")
    parser.add_argument("--samples", type=int, default=12, help="burst_first: transactions")
    parser.add_argument("--busy-ms", default="0,10", help="burst_first: the loop's turns")
    parser.add_argument("--scenarios", default="back_to_back,burst_first")
    parser.add_argument(
        "--kinds", default="cold,warm,offsets,threaded", help="burst_first: which (see above)"
    )
    args = parser.parse_args()
    with broker() as kafka:
        print(json.dumps(asyncio.run(run(kafka, args)), indent=2))


if __name__ == "__main__":
    cli()
