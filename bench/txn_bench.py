"""The cost of one Kafka transaction as the worker commits them, printed as JSON.

    python -m bench.txn_bench [--rounds 40]

The command path commits one transaction per partition batch and the changelog one per
partition every `commit_interval_ms`, each through `app.kafka.TransactionalProducer`.
This measures `TransactionalProducer.commit` (one record + consumer offsets) on one
producer: back to back, and with a pause between transactions. Back to back, aiokafka's
first AddPartitionsToTxn of a transaction is refused with CONCURRENT_TRANSACTIONS while
the broker still writes the previous one's markers (KAFKA-5477) and retried after a fixed
20 ms: that is a floor under every partition's transaction rate, whatever its size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from typing import Any

from app.kafka import TopicSpec, TransactionalProducer, ensure_topics
from app.kafka.connection import KafkaConnection
from bench.common import admin_client, broker, machine, percentiles


async def run(kafka: KafkaConnection, rounds: int) -> dict[str, Any]:
    topic = f"benchtxn{uuid.uuid4().hex[:8]}"
    await ensure_topics(kafka, [TopicSpec(topic, 1), TopicSpec(topic + "-in", 1)])
    producer = TransactionalProducer(kafka, f"{topic}.txn")
    await producer.start()
    out: dict[str, Any] = {"bench": "txn", "machine": machine(), "broker": kafka.describe()}
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
    out["machine"]["loadavg_after"] = machine()["loadavg"]
    return out


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    with broker() as kafka:
        print(json.dumps(asyncio.run(run(kafka, args.rounds)), indent=2))


if __name__ == "__main__":
    cli()
