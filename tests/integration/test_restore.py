"""The timer table restored from its changelog equals the live one; an old owner never moves
a timer back (DESIGN.md, invariant 2), whatever it writes beside the new one."""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from harness import Client, Cluster, OnceJson, TimerJson, eventually, owned, sleep_until

from app.protocol.wire import SCHEDULE_SET, EventEnvelope
from tables import ACTIVE, AggregateRef, Timer, TimerStatus

pytestmark = pytest.mark.kafka

PARTITIONS = 4
OPTIONS = '{"claim_timeout": 4000, "send_timeout": 3000}'


@pytest.fixture
async def cluster(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(
        kafka_bootstrap, tmp_path, partitions=PARTITIONS, env={"TICKWHEEL_TIMER_OPTIONS": OPTIONS}
    )
    yield c
    c.stop_all()


async def mixed_history(client: Client) -> list[tuple[AggregateRef, str]]:
    """Puts, reschedules, cancels, deletions, fired one-offs, recurring slots, stale versions."""
    now = int(time.time() * 1000)
    far: OnceJson = {"kind": "once", "at": now + 3_600_000}
    keys: list[tuple[AggregateRef, str]] = []
    commands = []
    for i in range(30):
        owner = f"o{i}"
        ref = client.ref(owner)
        timers: list[TimerJson] = [
            {"key": "far", "rule": far},
            {"key": "soon", "rule": {"kind": "once", "at": now + 1_500 + 50 * i}},
            {"key": "tick", "rule": {"kind": "interval", "start": now + 1_000, "every": 700}},
            {"key": "moved", "rule": far},
        ]
        keys += [(ref, t["key"]) for t in timers]
        commands.append(
            client.command(owner, "ScheduleMany", {"timers": timers}, request_id=f"a{i}")
        )
    await client.send(*commands)
    await client.wait_results([c.request_id for c in commands])
    later = []
    for i in range(30):
        owner = f"o{i}"
        moved: TimerJson = {"key": "moved", "rule": {"kind": "once", "at": now + 7_200_000}}
        later.append(client.command(owner, "Schedule", moved, request_id=f"m{i}"))
        if i % 3 == 0:
            later.append(client.command(owner, "Unschedule", {"keys": ["far"]}, request_id=f"c{i}"))
        if i % 10 == 1:
            later.append(client.command(owner, "Delete", {}, request_id=f"d{i}"))
    await client.send(*later)
    await client.wait_results([c.request_id for c in later])
    # Stale: version 1 of an owner whose timers are at a later version now, from a foreign writer.
    stale = [
        EventEnvelope(
            id=f"stale-{i}",
            type=SCHEDULE_SET,
            aggregate=client.ref(f"o{i}"),
            version=1,
            created_at=now,
            body={"key": "moved", "rule": far, "command": {"type": "Fire"}},
        )
        for i in range(30)
    ]
    await client.write_events(*stale)
    # Let the recurring ones run a few slots (the changelog has them at slot 3), then stop them.
    ticking = {f"o{i}" for i in range(30) if i % 10 != 1}

    async def ran_slots() -> bool:
        rows = await client.timers()
        ticks = {t.owner.id: t.slot for t in rows.values() if t.key == "tick"}
        return all(ticks.get(o, 0) >= 3 for o in ticking)

    await eventually(ran_slots, 60, "every recurring timer ran 3 slots")
    stop = [
        client.command(f"o{i}", "Unschedule", {"keys": ["tick"]}, request_id=f"s{i}")
        for i in range(30)
        if i % 10 != 1
    ]
    await client.send(*stop)
    await client.wait_results([c.request_id for c in stop])
    return keys


@pytest.mark.kafka_next
async def test_restore_from_changelog_equals_the_live_table(cluster: Cluster) -> None:
    async with Client(cluster) as client:
        w1 = cluster.start_worker("w1")
        await cluster.wait_owned(w1)
        keys = await mixed_history(client)

        async def settled() -> bool:
            # The soon timers fired and no send is in flight: nothing changes any more.
            rows = (await client.timers()).values()
            soon = [t for t in rows if t.key == "soon"]
            return all(
                t.status in (TimerStatus.FIRED, TimerStatus.CANCELLED) for t in soon
            ) and all(t.status != TimerStatus.FIRING for t in rows)

        await eventually(settled, 60, "the soon timers fired, no send in flight")
        assert w1.stop() == 0
        live = await cluster.local_rows(w1, keys)
        statuses = {t.status for t in live.values() if t is not None}
        assert {TimerStatus.PENDING, TimerStatus.FIRED, TimerStatus.CANCELLED} <= statuses
        # The stale ScheduleSet changed nothing.
        assert all(t is None or t.id != f"stale-{o[1:]}" for (o, _), t in live.items())

        # A node that never had the partitions restores them from the changelog alone.
        w2 = cluster.start_worker("w2")
        await eventually(lambda: len(owned(w2)) == PARTITIONS, 60, "w2 restored everything")
        assert w2.stop() == 0
        assert await cluster.local_rows(w2, keys) == live

        # The first node again: its local copy plus the changelog's tail.
        w1b = cluster.start_worker("w1")
        await eventually(lambda: len(owned(w1b)) == PARTITIONS, 60, "w1 restored everything")
        restores = w1b.metric("tickwheel_restore_duration_seconds_count", store="timers")
        assert restores >= PARTITIONS, w1b.text()
        # Read on from w1's last landed commit (w2 wrote no row): each partition's offsets
        # after it are commit markers at most, not the table again.
        tail = w1b.metric("tickwheel_restore_records_read", store="timers")
        assert tail <= 2 * PARTITIONS, (tail, w1b.text()[-4000:])
        assert w1b.stop() == 0
        assert await cluster.local_rows(w1b, keys) == live

        # And the changelog itself says the same.
        latest = {(t.owner.id, t.key): t for t in (await client.timers()).values()}
        assert {k: v for k, v in live.items() if v is not None} == latest


def never_moves_back(history: list[Timer]) -> str | None:
    """Why `history` (one key's committed rows, in log order) moves a timer back, or None."""
    for before, after in itertools.pairwise(history):
        if after.version < before.version:
            return f"version {before.version} -> {after.version}"
        if after.id != before.id:
            continue  # a reschedule: a new timer under the key
        if before.status in (TimerStatus.FIRED, TimerStatus.CANCELLED) and after != before:
            return f"{before.status} revived as {after.status}"
        if after.slot < before.slot:
            return f"slot {before.slot} -> {after.slot}"
    return None


async def test_an_old_owner_beside_the_new_one_never_moves_a_timer_back(cluster: Cluster) -> None:
    async with Client(cluster) as client:
        old = cluster.start_worker("old")
        await cluster.wait_owned(old)
        now = int(time.time() * 1000)
        commands = []
        for i in range(40):
            timers = [
                {"key": f"k{k}", "rule": {"kind": "once", "at": now + 3_000 + 40 * (i + k)}}
                for k in range(10)
            ] + [{"key": "tick", "rule": {"kind": "interval", "start": now + 2_000, "every": 500}}]
            commands.append(client.command(f"o{i}", "ScheduleMany", {"timers": timers}))
        await client.send(*commands)
        await client.wait_results([c.request_id for c in commands])
        # The old owner stalls just as its timers fall due; the group moves on without it.
        await sleep_until(now + 2_500)
        restored = "tickwheel_restore_duration_seconds_count"
        taken_before = old.metric(restored, store="timers")
        assert taken_before >= 1, old.text()
        old.freeze()
        new = cluster.start_worker("new")
        await eventually(lambda: len(owned(new)) == PARTITIONS, 60, "new owner has everything")
        # It moves the timers on: what the old owner's table holds is stale now.
        await eventually(
            lambda: new.metric("tickwheel_timer_actions_total", action="fired") >= 40,
            30,
            "the new owner fired timers",
        )
        # The old owner wakes up believing it still owns everything, with a stale table;
        # it finds out it does not, lets its partitions go and takes those the group gives
        # it afresh (restored from the changelog), beside the new owner.
        old.thaw()

        def shared() -> bool:
            mine, theirs = set(owned(old)), set(owned(new))
            return (
                old.metric(restored, store="timers") > taken_before
                and bool(mine)
                and not mine & theirs
                and mine | theirs == set(range(PARTITIONS))
            )

        await eventually(shared, 60, "the old owner took partitions afresh beside the new one")
        stop = [client.command(f"o{i}", "Unschedule", {"keys": ["tick"]}) for i in range(40)]
        await client.send(*stop)
        await client.wait_results([c.request_id for c in stop])

        async def final() -> bool:
            rows = (await client.timers()).values()
            return all(
                t.status == TimerStatus.FIRED if t.key != "tick" else t.status not in ACTIVE
                for t in rows
            )

        await eventually(final, 60, "every timer fired, the recurring ones stopped")

        history = await client.changelog_history()
        problems = {k: why for k, rows in history.items() if (why := never_moves_back(rows))}
        assert not problems, list(problems.items())[:5]
        fired = [e for e in await client.events() if e.type == "Fired"]
        per_request: dict[str, int] = {}
        for e in fired:
            assert e.request_id is not None
            per_request[e.request_id] = per_request.get(e.request_id, 0) + 1
        assert max(per_request.values()) == 1, "a slot was applied twice"
        latest = {(t.owner.id, t.key): t for t in (await client.timers()).values()}
        for (owner, key), t in latest.items():
            if key != "tick":
                assert t.status == TimerStatus.FIRED, (owner, key, t.status)
                assert f"{t.id}#0" in per_request
            else:
                assert t.status not in ACTIVE, (owner, key, t.status)
