"""A take-over after a crash sends the dead owner's claimed timers again at once (issue 10,
item 6): the new owner fences the old one before it reads anything, so its FIRING rows can
never be settled by it, and waiting out their claim would only make them late. The target
dedups by request id, so a command sent twice is applied once."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
from harness import Client, Cluster, eventually, owned

from app.kafka import TopicSpec, ensure_topics
from app.protocol.wire import CommandEnvelope, decode
from tables import AggregateRef
from tables.timer import TimerStatus

pytestmark = pytest.mark.kafka

PARTITIONS = 4
CLAIM_MS = 180_000  # far longer than the whole test may take: nothing lapses
OWNERS = 8


@pytest.fixture
async def cluster(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    options = {"claim_timeout": CLAIM_MS, "send_timeout": CLAIM_MS}
    c = Cluster(
        kafka_bootstrap,
        tmp_path,
        partitions=PARTITIONS,
        env={"TICKWHEEL_TIMER_OPTIONS": orjson.dumps(options).decode()},
    )
    yield c
    c.stop_all()


async def test_the_new_owner_sends_a_crashed_owners_claims_again_at_once(
    cluster: Cluster,
) -> None:
    # The timers' target: a type no worker decides, so no result ever settles a claim.
    sink = f"{cluster.context}.sink.commands"
    await ensure_topics(cluster.bootstrap, [TopicSpec(sink, PARTITIONS)])
    async with Client(cluster) as client:
        old = cluster.start_worker("old")
        await cluster.wait_owned(old)
        due = int(time.time() * 1000) + 2_000
        schedule = [
            client.command(
                f"o{i}",
                "Schedule",
                {
                    "key": "deadline",
                    "rule": {"kind": "once", "at": due},
                    "target": AggregateRef(
                        context=cluster.context, aggregate="sink", id=f"s{i}"
                    ).model_dump(),
                },
            )
            for i in range(OWNERS)
        ]
        await client.send(*schedule)
        await client.wait_results([c.request_id for c in schedule])

        async def sent() -> Counter[str]:
            raw = await client._read_all(sink, range(PARTITIONS))
            return Counter(decode(CommandEnvelope, v).request_id for v in raw)

        async def all_sent_once() -> bool:
            return len(await sent()) == OWNERS

        await eventually(all_sent_once, 60, "the old owner sent every timer")
        rows = await client.timers()
        assert {t.status for t in rows.values()} == {TimerStatus.FIRING}, "claimed, unsettled"
        old.kill9()
        killed = time.monotonic()

        new = cluster.start_worker("new")
        await eventually(lambda: len(owned(new)) == PARTITIONS, 60, "the new owner has all")

        async def all_sent_twice() -> bool:
            return all(n >= 2 for n in (await sent()).values())

        # Well inside the claim: the new owner did not wait for claims it knows are dead.
        await eventually(all_sent_twice, 60, "the new owner sent the dead owner's claims")
        took = time.monotonic() - killed
        assert took * 1000 < CLAIM_MS
        assert set(await sent()) == {f"{t.id}#0" for t in rows.values()}
