"""A rolling restart of a static member (`TICKWHEEL_GROUP_INSTANCE_ID`, KIP-345): the
stopped worker sends no LeaveGroup, the coordinator keeps its partitions for it through
the session timeout, and gives them back when it starts again with the same id. No
rebalance: the other worker's partitions never move, and the timers fire once each."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from harness import Client, Cluster, TimerJson, Worker, eventually, owned

from app.model.decide import event_id

pytestmark = pytest.mark.kafka

OPTIONS = '{"claim_timeout": 5000, "send_timeout": 4000, "expires_after": 600000}'
PARTITIONS = 4


@pytest.fixture
async def cluster(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    env = {"TICKWHEEL_TIMER_OPTIONS": OPTIONS, "TICKWHEEL_SESSION_TIMEOUT_MS": "25000"}
    c = Cluster(kafka_bootstrap, tmp_path, partitions=PARTITIONS, env=env)
    yield c
    c.stop_all()


def static(cluster: Cluster, name: str) -> Worker:
    return cluster.start_worker(name, TICKWHEEL_GROUP_INSTANCE_ID=f"{cluster.context}-{name}")


def settled(a: Worker, b: Worker) -> bool:
    for w in (a, b):
        if not w.alive:
            raise AssertionError(f"{w.name} exited {w.proc.returncode}:\n{w.text()}")
    mine, theirs = owned(a), owned(b)
    return bool(mine and theirs) and sorted(mine + theirs) == list(range(PARTITIONS))


async def test_a_static_worker_restarted_gets_its_partitions_back_without_a_rebalance(
    cluster: Cluster,
) -> None:
    async with Client(cluster) as client:
        a, b = static(cluster, "a"), static(cluster, "b")
        await eventually(lambda: settled(a, b), 60, "the two workers share the partitions")
        a_owned, b_owned = owned(a), owned(b)

        # Due while `a` is away and after it is back: its partitions' fire on its return.
        now = int(time.time() * 1000)
        commands, expected = [], set()
        for o in range(16):
            timers: list[TimerJson] = [
                {
                    "key": f"k{k}",
                    "rule": {"kind": "once", "at": now + 4_000 + 1_000 * k},
                    "target": client.ref(f"target-{o}").model_dump(),
                }
                for k in range(8)
            ]
            cmd = client.command(f"owner-{o}", "ScheduleMany", {"timers": timers})
            commands.append(cmd)
            expected |= {event_id(cmd.aggregate, cmd.request_id, k) for k in range(8)}
        await client.send(*commands)
        await client.wait_results([c.request_id for c in commands], within=60)

        # `b`'s ownership, read all along from the stop until `a` runs its partitions again.
        seen: set[tuple[int, ...]] = set()
        watching = True

        async def watch_b() -> None:
            while watching:
                # [] while it does not answer or restores one: a move shows too.
                seen.add(tuple(await asyncio.to_thread(owned, b)))
                await asyncio.sleep(0.2)

        watcher = asyncio.create_task(watch_b())
        began = time.monotonic()
        assert await asyncio.to_thread(a.stop) == 0, a.text()
        again = static(cluster, "a")
        await eventually(lambda: owned(again) == a_owned, 22, "a got its partitions back")
        back_in = time.monotonic() - began
        watching = False
        await watcher
        assert seen == {tuple(b_owned)}, f"b's partitions moved: {seen}"
        assert owned(b) == b_owned

        async def all_fired() -> bool:
            fired = {
                e.request_id.split("#")[0]
                for e in await client.events()
                if e.type == "Fired" and e.request_id
            }
            return expected <= fired

        await eventually(all_fired, 40, f"{len(expected)} timers fired", interval=1.0)
        fired = Counter(e.request_id for e in await client.events() if e.type == "Fired")
        twice = [r for r, n in fired.items() if n > 1]
        assert not twice, f"applied twice: {twice[:5]}"
        assert {r.split("#")[0] for r in fired if r} == expected
        print(f"a back with its partitions {a_owned} in {back_in:.1f} s; b kept {b_owned}")
