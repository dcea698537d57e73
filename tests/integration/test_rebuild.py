"""`tickwheel rebuild`: the timer table thrown away and replayed from the log equals the live
one, and timers that had fired are answered DUPLICATE rather than applied again."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from harness import Client, Cluster, eventually

from app.rebuild import GroupBusy, rebuild
from tables import AggregateRef, Outcome, TimerStatus

pytestmark = pytest.mark.kafka

PARTITIONS = 4


@pytest.fixture
async def cluster(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(kafka_bootstrap, tmp_path, partitions=PARTITIONS)
    yield c
    c.stop_all()


async def test_rebuild_from_the_log_equals_the_live_table(cluster: Cluster) -> None:
    async with Client(cluster) as client:
        w = cluster.start_worker("w")
        await cluster.wait_owned(w)
        now = int(time.time() * 1000)
        far = {"kind": "once", "at": now + 3_600_000}
        keys: list[tuple[AggregateRef, str]] = []
        first = []
        for i in range(40):
            timers = [{"key": "far", "rule": far}, {"key": "moved", "rule": far}]
            if i % 10 != 3:
                # The log does not say a timer fired: one that fired and was then cancelled
                # by its owner's deletion is rebuilt CANCELLED, so deleted owners fire none.
                timers.append({"key": "soon", "rule": {"kind": "once", "at": now + 1_000}})
            keys += [(client.ref(f"o{i}"), t["key"]) for t in timers]
            first.append(client.command(f"o{i}", "ScheduleMany", {"timers": timers}))
        await client.send(*first)
        await client.wait_results([c.request_id for c in first])
        later = []
        for i in range(40):
            moved = {"key": "moved", "rule": {"kind": "once", "at": now + 7_200_000}}
            later.append(client.command(f"o{i}", "Schedule", moved))
            if i % 4 == 0:
                later.append(client.command(f"o{i}", "Unschedule", {"keys": ["far"]}))
            if i % 10 == 3:
                later.append(client.command(f"o{i}", "Delete", {}))
        await client.send(*later)
        await client.wait_results([c.request_id for c in later])

        async def soon_fired() -> bool:
            latest = await client.timers()
            soon = [t for t in latest.values() if t.key == "soon"]
            return len(soon) == 36 and all(t.status != TimerStatus.PENDING for t in soon)

        await eventually(soon_fired, 60, "the soon timers fired")
        with pytest.raises(GroupBusy, match="stop them"):
            await rebuild(cluster.bootstrap, cluster.group, [client.topics], PARTITIONS)
        assert w.stop() == 0
        live = await cluster.local_rows(w, keys)

        await asyncio.sleep(1)  # the group's membership expires after the clean leave
        await rebuild(cluster.bootstrap, cluster.group, [client.topics], PARTITIONS)
        assert await client.timers() == {}, "the changelog was not emptied"

        again = cluster.start_worker("w")  # the same data directory: its copy is stale
        await cluster.wait_owned(again)

        async def replayed() -> bool:
            latest = {(t.owner.id, t.key): t for t in (await client.timers()).values()}
            want = {k for k, t in live.items() if t is not None}
            return want <= set(latest) and all(
                latest[k].status not in (TimerStatus.PENDING, TimerStatus.FIRING)
                for k in want
                if k[1] == "soon"
            )

        await eventually(replayed, 90, "the log replayed into the table")
        await asyncio.sleep(1)
        assert again.stop() == 0
        rebuilt = await cluster.local_rows(again, keys)
        for k, before in live.items():
            after = rebuilt[k]
            if before is None or k[1] != "soon" or before.status != TimerStatus.FIRED:
                assert after == before, k
            else:
                # Fired before the rebuild: sent again, and the target had it already. A FIRED
                # row's due_at is its last claim's deadline, which is of the replay's time.
                assert after is not None
                same = {"outcome", "due_at"}
                assert after.model_dump(exclude=same) == before.model_dump(exclude=same)
                assert after.outcome == Outcome.DUPLICATE
        fired = Counter(e.request_id for e in await client.events() if e.type == "Fired")
        assert fired and max(fired.values()) == 1
