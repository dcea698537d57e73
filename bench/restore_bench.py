"""A timer store restored from a real changelog topic, as a node restores it, as JSON.

    python -m bench.restore_bench                           # 1,000,000 rows, 4 partitions
    python -m bench.restore_bench --topic T --keep          # write T once, keep it
    python -m bench.restore_bench --topic T --rounds 3      # restore T again (no write)

Writes `--timers` pending rows' changelog records (as `bench.store_bench` makes them: a
~520-byte row each, due over a day) to a topic of `--partitions` partitions once, in
transactions of `--txn` records through the node's own `TransactionalProducer`, so the
topic holds commit markers as a node's changelog does. Then, `--rounds` times: each
partition restored with `app.timers.restore.restore_partition` into a fresh RocksDB
store through the node's `Reader` (one after another, as a node's tasks share one
reader), and the same partitions read alone (the `Reader`, no store): the Kafka read's
share. Every phase reports wall time, timers/s, and CPU per timer of this process (all
its threads: aiokafka's decode, the store's checks, RocksDB's writes, flushes and
compactions), of its main thread, and of the broker. CPU per timer is the figure to
compare on a shared machine: wall time waits for cores others hold. Target: restore
>= 200,000 timers/s.

Each round runs with each reader `--clients` names: aiokafka's (`Reader`, the default
client) and librdkafka's (`RdkafkaReader`, `TICKWHEEL_KAFKA_CLIENT=confluent`), the figures
under their names.

Experiments with the node's aiokafka reader, as a change to `app/kafka/consumers.py` would make it
(nothing in `app/` changes): `--reader-batch N` (its `max_poll_records`, 5,000 in a node),
`--experiment light_record` (each fetched record handed on as a `NamedTuple` instead of
the frozen dataclass `Record`, whose construction costs ~1 µs a record in Python).

A given `--topic` that already holds `--timers` records over `--partitions` is read as
it is (runs of two code versions can then restore the very same records, in turn).

The restores run with the collector as a worker runs it once started, when its partitions
are restored (`--collector node`, the default: start-up frozen, the young generation
collected every 50,000 allocations, `app.node.collector`), or with Python's own
(`--collector python`, what this bench ran with before 2026-12-03).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
import uuid
from itertools import islice
from typing import Any, NamedTuple

from aiokafka.admin import NewTopic

import app.kafka.consumers
from app.kafka.connection import KafkaConnection
from app.kafka.consumers import Reader
from app.kafka.ports import ReaderClient
from app.kafka.rdkafka_reader import RdkafkaReader
from app.kafka.records import OutRecord
from app.kafka.transactional_producer import TransactionalProducer
from app.timers.restore import restore_partition
from bench.common import _proc_cpu_s, admin_client, broker, broker_pid, machine
from bench.store_bench import records, tune_collector
from tables import TimerStore, open_timer_store


class LightRecord(NamedTuple):
    """`app.kafka.records.Record`'s fields, as a tuple (`--experiment light_record`)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: tuple[tuple[str, bytes | None], ...] = ()


def _light_record(m: Any) -> Any:
    return LightRecord(
        m.topic, m.partition, m.offset, m.key, m.value, m.timestamp, tuple(m.headers or ())
    )


async def topic_records(kafka: KafkaConnection, topic: str) -> dict[int, int] | None:
    """The number of offsets each partition of `topic` holds (None: no such topic)."""
    async with admin_client(kafka) as admin:
        if topic not in await admin.list_topics():
            return None
        described = await admin.describe_topics([topic])
    count = len(described[0]["partitions"])
    async with Reader(kafka) as reader:
        held: dict[int, int] = {}
        for partition in range(count):
            begin, end = await reader.offsets(topic, partition)
            held[partition] = end - begin
    return held


async def write_topic(
    kafka: KafkaConnection, topic: str, partitions: int, timers: int, txn: int
) -> dict[str, Any]:
    """Creates `topic` (compacted, as a changelog) and writes `timers` rows over it."""
    async with admin_client(kafka) as admin:
        config = {"cleanup.policy": "compact,delete", "retention.ms": "-1"}
        await admin.create_topics([NewTopic(topic, partitions, 1, topic_configs=config)])
    producer = TransactionalProducer(kafka, f"benchrestore-{uuid.uuid4().hex[:8]}")
    await producer.start()
    began = time.monotonic()
    try:
        per_partition = timers // partitions
        for partition in range(partitions):
            made = records(partition, per_partition, seed=partition)
            while chunk := list(islice(made, txn)):
                out: list[OutRecord] = [(topic, partition, k, v) for _, k, v in chunk]
                await producer.commit(out, {}, "")
    finally:
        await producer.stop()
    return {"written": per_partition * partitions, "seconds": round(time.monotonic() - began, 1)}


class Phase:
    """Wall, process, main-thread and broker CPU over a phase."""

    def __init__(self, broker: int | None) -> None:
        self._broker = broker

    def __enter__(self) -> Phase:
        self._load = os.getloadavg()[0]
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        self._thread = time.thread_time()
        self._broker_cpu = None if self._broker is None else _proc_cpu_s(self._broker)
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self._wall
        self.cpu = time.process_time() - self._cpu
        self.thread = time.thread_time() - self._thread
        after = None if self._broker is None else _proc_cpu_s(self._broker)
        self.broker_cpu = (
            None if after is None or self._broker_cpu is None else after - self._broker_cpu
        )
        self.load = [round(self._load, 2), round(os.getloadavg()[0], 2)]

    def figures(self, count: int) -> dict[str, Any]:
        def per(seconds: float | None) -> float | None:
            return None if seconds is None else round(seconds / count * 1e6, 2)

        return {
            "timers": count,
            "seconds": round(self.wall, 3),
            "timers_per_s": round(count / self.wall),
            "timers_per_cpu_s": round(count / self.cpu),
            "cpu_us_per_timer": per(self.cpu),
            "main_thread_cpu_us_per_timer": per(self.thread),
            "broker_cpu_us_per_timer": per(self.broker_cpu),
            "loadavg_1m": self.load,
        }


def new_reader(client: str, kafka: KafkaConnection, batch: int) -> ReaderClient:
    """The node's reader of `client` (`KafkaClients.reader`), reading `batch` records a call."""
    if client == "confluent":
        return RdkafkaReader(kafka, batch=batch)
    return Reader(kafka, batch=batch)


async def restore_round(
    reader: ReaderClient, topic: str, partitions: int, path: str, pid: int | None
) -> dict[str, Any]:
    shutil.rmtree(path, ignore_errors=True)
    store: TimerStore = open_timer_store(f"rocksdb://{path}", partitions=partitions)
    try:
        async with reader:
            count = 0
            with Phase(pid) as phase:
                for partition in range(partitions):
                    await store.assign({partition})
                    count += await restore_partition(store, reader, topic, partition)
            restored = phase.figures(count)
            # The store serves what it restored: one partition's first due rows.
            restored["due_rows_found"] = len(await store.due_rows({0}, 1 << 62, 10))
    finally:
        await store.close()
        shutil.rmtree(path, ignore_errors=True)
    return restored


async def read_round(
    reader: ReaderClient, topic: str, partitions: int, pid: int | None
) -> dict[str, Any]:
    """The same records read by the same kind of reader, kept nowhere: the read's cost."""
    async with reader:
        count = 0
        with Phase(pid) as phase:
            for partition in range(partitions):
                async for got in reader.read(topic, partition, 0):
                    count += len(got)
        return phase.figures(count)


async def run(args: argparse.Namespace, kafka: KafkaConnection, work: str) -> dict[str, Any]:
    topic = args.topic or f"benchrestore{uuid.uuid4().hex[:8]}.timers.changelog"
    figures: dict[str, Any] = {"machine": machine(), "topic": topic}
    held = await topic_records(kafka, topic)
    if held is None:
        figures["write"] = await write_topic(kafka, topic, args.partitions, args.timers, args.txn)
    elif len(held) != args.partitions or sum(held.values()) < args.timers:
        raise SystemExit(f"{topic} holds {held}, not {args.timers} over {args.partitions}")
    pid = broker_pid(kafka.bootstrap_servers)
    figures["reader"] = {"batch": args.reader_batch, "experiment": args.experiment}
    figures["collector"] = args.collector
    tune_collector(args.collector)
    if args.experiment == "light_record":
        app.kafka.consumers.as_record = _light_record
    rounds = []
    try:
        for _ in range(args.rounds):
            path = os.path.join(work, "store")
            batch, parts = args.reader_batch, args.partitions
            each: dict[str, Any] = {}
            for client in args.clients:
                restored = await restore_round(
                    new_reader(client, kafka, batch), topic, parts, path, pid
                )
                read = await read_round(new_reader(client, kafka, batch), topic, parts, pid)
                each[client] = {"restore": restored, "read_only": read}
            rounds.append(each)
    finally:
        if not args.keep and args.topic is None:
            async with admin_client(kafka) as admin:
                await admin.delete_topics([topic])
    figures["rounds"] = rounds
    restores = [each[client]["restore"] for each in rounds for client in each]
    figures["targets"] = {
        "restore_200k_per_s": max(r["timers_per_s"] for r in restores) >= 200_000,
        "best_timers_per_s": max(r["timers_per_s"] for r in restores),
        "best_timers_per_cpu_s": max(r["timers_per_cpu_s"] for r in restores),
    }
    figures["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    return figures


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timers", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--txn", type=int, default=5_000, help="records a transaction")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--topic", help="a topic to write once and restore (kept)")
    parser.add_argument("--keep", action="store_true", help="keep the topic written")
    parser.add_argument("--reader-batch", type=int, default=5_000, help="records a read call")
    parser.add_argument(
        "--clients", nargs="+", choices=("aiokafka", "confluent"),
        default=["aiokafka", "confluent"], help="the readers to run, in turn",
    )  # fmt: skip
    parser.add_argument("--experiment", choices=("light_record",), help="see the docstring")
    parser.add_argument(
        "--collector", choices=("node", "python"), default="node",
        help="the cyclic GC as a started worker tunes it, or Python's own",
    )  # fmt: skip
    parser.add_argument("--dir", help="work directory (default: a temporary one, removed)")
    args = parser.parse_args()
    work = args.dir or tempfile.mkdtemp(prefix="tickwheel-restore-")
    try:
        with broker() as kafka:
            print(json.dumps(asyncio.run(run(args, kafka, work)), indent=2))
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    cli()
