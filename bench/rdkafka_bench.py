"""aiokafka's transactional writer against librdkafka's, on the same broker in the same
run, printed as JSON.

    python -m bench.rdkafka_bench [--transactions 1000] [--records 20] [--writers 1]
                                  [--rounds 2]

Each round runs both writers (`KafkaClients(client=...)`), alternated, each committing
`--transactions` transactions of `--records` 200-byte records to its partition plus one
consumed offset, as a partition's transaction does; `--writers` writers at once (one per
partition, as a node has) share them. Per writer and round: transactions/s, records/s,
and CPU per record of this process (librdkafka's own threads included), of its event-loop
thread alone (what the node's other work competes with) and of the broker; commit latency
percentiles. Wall-clock figures are noisy on a shared machine: the CPU figures are the
ones to compare, with the load printed beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from typing import Any

from app.kafka import KafkaClients, TopicSpec, ensure_topics
from app.kafka.clients import KafkaClient
from app.kafka.connection import KafkaConnection
from bench.common import _proc_cpu_s, admin_client, broker, broker_pid, machine, percentiles

CLIENTS: tuple[KafkaClient, ...] = ("aiokafka", "confluent")
VALUE = b"v" * 200


async def one_writer(
    clients: KafkaClients, topic: str, partition: int, transactions: int, records: int
) -> list[float]:
    """Commits `transactions` transactions on partition `partition`; their latencies (ms)."""
    writer = clients.transactional_writer(f"{topic}.{clients.client}.{partition}")
    await writer.start()
    batch = [(topic, partition, b"k%d" % i, VALUE) for i in range(records)]
    group, consumed = f"{topic}.g", f"{topic}-in"
    samples: list[float] = []
    try:
        for n in range(transactions):
            began = time.perf_counter()
            await writer.commit(batch, {(consumed, partition): n + 1}, group)
            samples.append((time.perf_counter() - began) * 1e3)
    finally:
        await writer.stop()
    return samples


async def measure(
    kafka: KafkaConnection,
    client: KafkaClient,
    topic: str,
    transactions: int,
    records: int,
    writers: int,
) -> dict[str, Any]:
    clients = KafkaClients(kafka, client=client)
    pid = broker_pid(kafka.bootstrap_servers)
    per_writer = transactions // writers
    # Warm-up (connections, the transactional ids' coordinators), not measured.
    await asyncio.gather(*(one_writer(clients, topic, p, 3, records) for p in range(writers)))
    broker_before = _proc_cpu_s(pid) if pid else None
    cpu_before, loop_before, began = time.process_time(), time.thread_time(), time.perf_counter()
    latencies = await asyncio.gather(
        *(one_writer(clients, topic, p, per_writer, records) for p in range(writers))
    )
    wall = time.perf_counter() - began
    cpu, loop_cpu = time.process_time() - cpu_before, time.thread_time() - loop_before
    broker_after = _proc_cpu_s(pid) if pid else None
    done = per_writer * writers
    total = done * records
    out: dict[str, Any] = {
        "client": client,
        "transactions": done,
        "records": total,
        "seconds": round(wall, 2),
        "transactions_per_s": round(done / wall, 1),
        "records_per_s": round(total / wall, 1),
        "process_cpu_ms_per_record": round(cpu * 1e3 / total, 4),
        "loop_thread_cpu_ms_per_record": round(loop_cpu * 1e3 / total, 4),
        "process_cpu_ms_per_transaction": round(cpu * 1e3 / done, 3),
        "commit": percentiles([s for w in latencies for s in w]),
    }
    if broker_before is not None and broker_after is not None:
        out["broker_cpu_ms_per_record"] = round((broker_after - broker_before) * 1e3 / total, 4)
    return out


async def run(
    kafka: KafkaConnection, transactions: int, records: int, writers: int, rounds: int
) -> dict[str, Any]:
    topic = f"benchrdk{uuid.uuid4().hex[:8]}"
    await ensure_topics(kafka, [TopicSpec(topic, writers), TopicSpec(topic + "-in", writers)])
    out: dict[str, Any] = {
        "bench": "rdkafka",
        "machine": machine(),
        "broker": kafka.describe(),
        "transactions": transactions,
        "records_per_transaction": records,
        "writers": writers,
        "rounds": [],
    }
    try:
        for r in range(rounds):
            order = CLIENTS if r % 2 == 0 else CLIENTS[::-1]  # alternated: drift hits both
            for client in order:
                figures = await measure(kafka, client, topic, transactions, records, writers)
                out["rounds"].append({"round": r, "loadavg": machine()["loadavg"], **figures})
    finally:
        async with admin_client(kafka) as admin:
            await admin.delete_topics([topic, topic + "-in"])
    out["median"] = {
        client: {
            key: statistics.median(f[key] for f in out["rounds"] if f["client"] == client)
            for key in (
                "transactions_per_s",
                "records_per_s",
                "process_cpu_ms_per_record",
                "loop_thread_cpu_ms_per_record",
            )
        }
        for client in CLIENTS
    }
    a, c = out["median"]["aiokafka"], out["median"]["confluent"]
    out["confluent_over_aiokafka"] = {
        key: round(c[key] / a[key], 3) if a[key] else None for key in a
    }
    out["machine"]["loadavg_after"] = machine()["loadavg"]
    return out


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transactions", type=int, default=1000)
    parser.add_argument("--records", type=int, default=20)
    parser.add_argument("--writers", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with broker() as kafka:
        figures = asyncio.run(
            run(kafka, args.transactions, args.records, args.writers, args.rounds)
        )
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    cli()
