"""Timers fired end to end on the real broker, through crashes and rebalances.

Owners schedule one-off and recurring timers on `counter` aggregates; the target's `Fire`
handler records each slot it applied (its request id `<timer id>#<slot>`). The checks:
every slot applied exactly once, cancelled and replaced timers never sent after their
cancel, nothing applied before its slot's due time, recurring slots without gaps.
"""

from __future__ import annotations

import asyncio
import functools
import random
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from harness import Client, Cluster, IntervalJson, OnceJson, TimerJson, Worker, eventually

from app.model.decide import event_id
from tables import ACTIVE, TimerStatus

pytestmark = pytest.mark.kafka

OPTIONS = '{"claim_timeout": 5000, "send_timeout": 4000, "expires_after": 600000}'


@pytest.fixture
async def cluster(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(kafka_bootstrap, tmp_path, partitions=8, env={"TICKWHEEL_TIMER_OPTIONS": OPTIONS})
    yield c
    c.stop_all()


@dataclass
class Plan:
    """What was scheduled: timer ids by kind, and when each one-off is due."""

    once: dict[str, int] = field(default_factory=dict)
    recurring: set[str] = field(default_factory=set)
    cancelled: set[str] = field(default_factory=set)
    replaced: set[str] = field(default_factory=set)


async def schedule(
    client: Client, rng: random.Random, owners: int, per_owner: int, spread_ms: int
) -> tuple[Plan, list[tuple[str, list[str]]]]:
    """Schedules owners x per_owner timers: 10 % recurring (every 1.5 s), the rest once."""
    plan = Plan()
    now = int(time.time() * 1000)
    commands = []
    recurring_keys: list[tuple[str, list[str]]] = []
    for o in range(owners):
        owner = f"owner-{o}"
        timers: list[TimerJson] = []
        rec: list[str] = []
        for k in range(per_owner):
            rule: OnceJson | IntervalJson
            if k % 10 == 0:
                rule = {"kind": "interval", "start": now + 3_000, "every": 1_500, "coalesce": False}
                rec.append(f"k{k}")
            else:
                rule = {"kind": "once", "at": now + 4_000 + rng.randrange(spread_ms)}
            timers.append(
                {
                    "key": f"k{k}",
                    "rule": rule,
                    "target": client.ref(f"target-{o % 50}").model_dump(),
                }
            )
        cmd = client.command(owner, "ScheduleMany", {"timers": timers}, request_id=f"plan-{owner}")
        commands.append(cmd)
        recurring_keys.append((owner, rec))
        for k, t in enumerate(timers):
            timer_id = event_id(cmd.aggregate, cmd.request_id, k)
            rule = t["rule"]
            if rule["kind"] == "once":
                plan.once[timer_id] = rule["at"]
            else:
                plan.recurring.add(timer_id)
    for i in range(0, len(commands), 20):
        await client.send(*commands[i : i + 20])
    await client.wait_results([c.request_id for c in commands], within=120)
    return plan, recurring_keys


async def cancel_some(
    client: Client, plan: Plan, rng: random.Random, owners: int, per_owner: int
) -> None:
    """Cancels 5 % of the one-offs well before they are due, and replaces 5 % with later ones."""
    commands = []
    now = int(time.time() * 1000)
    for o in range(owners):
        owner = f"owner-{o}"
        keys = [k for k in range(per_owner) if k % 10 != 0]
        picked = rng.sample(keys, max(2, len(keys) // 10))
        half = len(picked) // 2
        cancel, replace = picked[:half], picked[half:]
        plan_id = functools.partial(event_id, client.ref(owner), f"plan-{owner}")
        due_later = [k for k in cancel if plan.once[plan_id(k)] > now + 2_500]
        if due_later:
            commands.append(
                client.command(
                    owner,
                    "Unschedule",
                    {"keys": [f"k{k}" for k in due_later]},
                    request_id=f"cancel-{owner}",
                )
            )
            plan.cancelled |= {plan_id(k) for k in due_later}
        for k in replace:
            if plan.once[plan_id(k)] <= now + 2_500:
                continue
            at = now + 6_000 + rng.randrange(4_000)
            cmd = client.command(
                owner,
                "Schedule",
                {
                    "key": f"k{k}",
                    "rule": {"kind": "once", "at": at},
                    "target": client.ref(f"target-{o % 50}").model_dump(),
                },
                request_id=f"re-{owner}-{k}",
            )
            commands.append(cmd)
            plan.replaced.add(plan_id(k))
            plan.once[event_id(cmd.aggregate, cmd.request_id, 0)] = at
    await client.send(*commands)
    await client.wait_results([c.request_id for c in commands], within=120)


async def stop_recurring(client: Client, recurring_keys: list[tuple[str, list[str]]]) -> None:
    commands = [
        client.command(owner, "Unschedule", {"keys": keys}, request_id=f"stop-{owner}")
        for owner, keys in recurring_keys
        if keys
    ]
    await client.send(*commands)
    await client.wait_results([c.request_id for c in commands], within=120)


async def fired_timer_ids(client: Client) -> set[str]:
    return {
        e.request_id.split("#")[0]
        for e in await client.events()
        if e.type == "Fired" and e.request_id
    }


async def wait_recurring_started(client: Client, plan: Plan, within: float) -> None:
    async def started() -> bool:
        return plan.recurring <= await fired_timer_ids(client)

    await eventually(started, within, "every recurring timer fired once", interval=1.0)


async def wait_all_fired(client: Client, plan: Plan, within: float) -> None:
    expected = {tid for tid in plan.once if tid not in plan.cancelled and tid not in plan.replaced}

    async def done() -> bool:
        fired = {
            e.request_id.split("#")[0]
            for e in await client.events()
            if e.type == "Fired" and e.request_id
        }
        return expected <= fired

    await eventually(done, within, f"{len(expected)} one-off timers fired", interval=1.0)


async def has_fired(client: Client) -> bool:
    return any(e.type == "Fired" for e in await client.events())


async def all_settled(client: Client) -> bool:
    """No timer PENDING, FIRING or PARKED: none can be sent any more, no send is in flight."""
    return all(t.status not in ACTIVE for t in (await client.timers()).values())


async def check(client: Client, plan: Plan) -> dict[str, int]:
    fired = [e for e in await client.events() if e.type == "Fired"]
    per_request = Counter(e.request_id for e in fired)
    twice = [r for r, n in per_request.items() if n > 1]
    assert not twice, f"applied twice: {twice[:5]}"
    by_timer: dict[str, list[int]] = defaultdict(list)
    for e in fired:
        assert e.request_id is not None
        timer_id, slot = e.request_id.rsplit("#", 1)
        by_timer[timer_id].append(int(slot))
        # Never applied before its slot's due time (the target refuses an early one).
        assert e.created_at >= e.body["not_before"], e.request_id
    # A cancel that reached the table while the timer was PENDING stops it: it is never
    # sent. (A cancel that reached it only after the claim cannot stop a send in flight.)
    claimed = {
        t.id
        for history in (await client.changelog_history()).values()
        for t in history
        if t.status == TimerStatus.FIRING
    }
    stopped = plan.cancelled - claimed
    for timer_id in stopped:
        assert timer_id not in by_timer, f"cancelled timer {timer_id} was applied"
    assert len(stopped) >= len(plan.cancelled) // 2, "the test's cancels came too late"
    for timer_id, at in plan.once.items():
        if timer_id in plan.cancelled:
            continue
        if timer_id in plan.replaced:
            continue  # it may have fired before its replacement; never twice (checked above)
        assert by_timer.get(timer_id) == [0], f"{timer_id} due {at}: {by_timer.get(timer_id)}"
        e = next(e for e in fired if e.request_id == f"{timer_id}#0")
        assert e.body["not_before"] == at
    for timer_id in plan.recurring:
        slots = sorted(by_timer.get(timer_id, []))
        assert slots, f"recurring {timer_id} never fired"
        # The first slot is the first at or after the ScheduleSet; none missing after it.
        assert slots == list(range(slots[0], slots[0] + len(slots))), f"{timer_id}: {slots}"
    return {"fired": len(fired), "timers": len(by_timer)}


async def run_scenario(
    cluster: Cluster,
    *,
    owners: int,
    per_owner: int,
    spread_ms: int,
    chaos: str = "",
) -> dict[str, int]:
    rng = random.Random(11)
    began = time.monotonic()

    def phase(name: str) -> None:
        print(f"{time.monotonic() - began:7.1f}s {name}")

    async with Client(cluster) as client:
        workers = [cluster.start_worker(), cluster.start_worker()]
        for w in workers:
            await cluster.wait_owned(w)
        phase("workers own partitions")
        plan, recurring_keys = await schedule(client, rng, owners, per_owner, spread_ms)
        phase("scheduled")
        await cancel_some(client, plan, rng, owners, per_owner)
        phase("cancelled and replaced some")
        kills = 0
        if chaos == "kill":
            for _ in range(5):
                await asyncio.sleep(rng.uniform(1.0, 2.5))
                victim = rng.choice([w for w in workers if w.alive])
                victim.kill9()
                kills += 1
                workers.remove(victim)
                workers.append(cluster.start_worker())
        elif chaos == "join":
            # Mid-run: once timers are being applied.
            await eventually(
                lambda: has_fired(client), 60, "the first timers applied", interval=0.5
            )
            third: Worker = cluster.start_worker()
            await cluster.wait_owned(third, within=90)
        await wait_recurring_started(client, plan, within=120)
        phase("recurring started")
        await stop_recurring(client, recurring_keys)
        await wait_all_fired(client, plan, within=240)
        phase("all fired")
        # Nothing in flight before counting: every timer fired or cancelled, none claimed.
        await eventually(lambda: all_settled(client), 60, "every timer settled", interval=1.0)
        stats = await check(client, plan)
        stats["kills"] = kills
        return stats


async def test_ten_thousand_timers_over_two_workers(cluster: Cluster) -> None:
    stats = await run_scenario(cluster, owners=100, per_owner=100, spread_ms=12_000)
    assert stats["timers"] >= 9_000


@pytest.mark.kafka_next
async def test_kill_9_at_random_moments(cluster: Cluster) -> None:
    stats = await run_scenario(cluster, owners=40, per_owner=50, spread_ms=14_000, chaos="kill")
    assert stats["kills"] >= 5


async def test_a_third_worker_joins_mid_run(cluster: Cluster) -> None:
    await run_scenario(cluster, owners=40, per_owner=50, spread_ms=12_000, chaos="join")


async def kill_9_with(variables: dict[str, str], kafka_bootstrap: str, tmp_path: Path) -> None:
    """The kill -9 scenario on a cluster of workers given `variables` as well."""
    env = {"TICKWHEEL_TIMER_OPTIONS": OPTIONS, **variables}
    c = Cluster(kafka_bootstrap, tmp_path, partitions=8, env=env)
    try:
        stats = await run_scenario(c, owners=20, per_owner=50, spread_ms=10_000, chaos="kill")
    finally:
        c.stop_all()
    assert stats["kills"] >= 5 and stats["timers"] >= 900


async def test_kill_9_with_librdkafka_producers(kafka_bootstrap: str, tmp_path: Path) -> None:
    """The same guarantees with the partitions' transactional producers over librdkafka
    (`TICKWHEEL_KAFKA_CLIENT=confluent`): each kill leaves a producer's transaction open,
    which the next owner's fences and aborts."""
    await kill_9_with({"TICKWHEEL_KAFKA_CLIENT": "confluent"}, kafka_bootstrap, tmp_path)


async def test_kill_9_with_the_producer_thread(kafka_bootstrap: str, tmp_path: Path) -> None:
    """The same guarantees with aiokafka's producers on a loop of their own
    (`TICKWHEEL_PRODUCER_THREAD=true`; off by default): a kill leaves a transaction open
    on that loop, which the next owner's fences and aborts."""
    await kill_9_with({"TICKWHEEL_PRODUCER_THREAD": "true"}, kafka_bootstrap, tmp_path)
