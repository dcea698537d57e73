"""Finished timers leave the changelog too: on the real broker, each one past its
retention gets a committed tombstone, and a node restoring the changelog loads none of
them (compaction itself runs on the broker's schedule: not waited for)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from harness import Client, Cluster, TimerJson, eventually, owned

from app.kafka import read_partitions
from tables import TimerStatus

pytestmark = [pytest.mark.kafka, pytest.mark.kafka_next]

PARTITIONS = 2
OPTIONS = (
    '{"claim_timeout": 4000, "send_timeout": 3000, "expires_after": 2000, '
    '"finished_retention": 4000}'
)


@pytest.fixture
async def cluster(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(
        kafka_bootstrap, tmp_path, partitions=PARTITIONS, env={"TICKWHEEL_TIMER_OPTIONS": OPTIONS}
    )
    yield c
    c.stop_all()


async def changelog(client: Client) -> list[tuple[bytes, bytes | None]]:
    """Every committed record of the timer table's changelog (read_committed), in order a
    partition."""
    out: list[tuple[bytes, bytes | None]] = []
    topic = client.topics.timers_changelog
    async for batch in read_partitions(client.cluster.kafka, topic, range(PARTITIONS)):
        out += [(r.key, r.value) for r in batch if r.key is not None]
    return out


async def test_finished_timers_are_tombstoned_and_not_restored(cluster: Cluster) -> None:
    async with Client(cluster) as client:
        w1 = cluster.start_worker("w1")
        await cluster.wait_owned(w1)
        now = int(time.time() * 1000)
        soon: TimerJson = {"key": "soon", "rule": {"kind": "once", "at": now + 500}}
        far: TimerJson = {"key": "far", "rule": {"kind": "once", "at": now + 3_600_000}}
        owners = [f"r{i}" for i in range(8)]
        commands = [
            client.command(o, "ScheduleMany", {"timers": [soon, far]}, request_id=f"s-{o}")
            for o in owners
        ]
        await client.send(*commands)
        await client.wait_results([c.request_id for c in commands])

        async def finished_then_deleted() -> bool:
            last: dict[bytes, bytes | None] = {}
            seen_finished: set[bytes] = set()
            for key, value in await changelog(client):
                last[key] = value
                if value is not None and b'"status":"PENDING"' not in value:
                    seen_finished.add(key)
            soon_keys = {k for k in last if k.endswith(b"soon")}
            return (
                len(soon_keys) == len(owners)
                and soon_keys <= seen_finished
                and all(last[k] is None for k in soon_keys)
            )

        await eventually(finished_then_deleted, 90, "every soon timer finished, then a tombstone")
        records = await changelog(client)
        tombstones = [k for k, v in records if v is None]
        assert sorted(tombstones) == sorted(
            k for k in {k for k, _ in records} if k.endswith(b"soon")
        )
        assert len(tombstones) == len(owners), "one tombstone a finished row"
        far_rows = {k: v for k, v in records if k.endswith(b"far")}
        assert len(far_rows) == len(owners) and all(v is not None for v in far_rows.values())
        swept = w1.metric("tickwheel_timer_actions_total", action="swept")
        assert swept == len(owners), w1.text()
        assert w1.stop() == 0

        # A node that never had the partitions restores the changelog: no finished row.
        keys = [(client.ref(o), k) for o in owners for k in ("soon", "far")]
        w2 = cluster.start_worker("w2")
        await eventually(lambda: len(owned(w2)) == PARTITIONS, 60, "w2 restored everything")
        assert w2.stop() == 0
        rows = await cluster.local_rows(w2, keys)
        assert all(rows[(o, "soon")] is None for o in owners)
        assert all(rows[(o, "far")].status is TimerStatus.PENDING for o in owners)  # type: ignore[union-attr]
