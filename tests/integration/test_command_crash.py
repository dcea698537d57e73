"""kill -9 of a worker mid-stream, many times: no command applied twice, none lost."""

from __future__ import annotations

import asyncio
import random
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from harness import Client, Cluster

from app.protocol.wire import ResultCode

pytestmark = pytest.mark.kafka


@pytest.fixture
async def cluster(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(kafka_bootstrap, tmp_path, partitions=4)
    yield c
    c.stop_all()


async def test_kill_9_mid_stream_never_applies_twice(cluster: Cluster) -> None:
    rng = random.Random(7)
    aggregates = [f"acc-{i}" for i in range(40)]
    async with Client(cluster) as client:
        worker = cluster.start_worker()
        await cluster.wait_owned(worker)
        commands = [
            client.command(rng.choice(aggregates), "Apply", request_id=f"r{i}")
            for i in range(4_000)
        ]
        # Each command is also sent a second time later: a client's retry.
        retries = [c.model_copy() for c in rng.sample(commands, 400)]
        chunks = [commands[i : i + 500] for i in range(0, len(commands), 500)]
        kills = 0
        for n, chunk in enumerate(chunks):
            await client.send(*chunk)
            if n % 2 == 1:
                await asyncio.sleep(rng.uniform(0.05, 0.6))
                worker.kill9()
                kills += 1
                worker = cluster.start_worker()
        await client.send(*retries)
        await cluster.wait_owned(worker)
        wanted = [c.request_id for c in commands]
        await client.wait_results(wanted, within=180)

        events = [e for e in await client.events() if e.type == "Applied"]
        per_request = Counter(e.request_id for e in events)
        assert kills >= 4
        assert set(per_request) == set(wanted), "a command was lost"
        assert max(per_request.values()) == 1, "a command was applied twice"
        # The state survived every restore: each aggregate counted 1, 2, 3, … in log order.
        seen: dict[str, list[int]] = defaultdict(list)
        for e in events:
            seen[e.aggregate.id].append(e.body["n"])
        for aggregate_id, ns in seen.items():
            assert ns == list(range(1, len(ns) + 1)), aggregate_id
        codes = Counter(
            r.code
            for r in await client.all_results()
            if r.request_id in {c.request_id for c in retries}
        )
        assert ResultCode.DUPLICATE in codes
