"""Timers on a three-broker cluster under load while its brokers fail (issue 18, item 4).

The session's three-node KRaft cluster (``kafka_cluster``, tests/conftest.py); two workers
create their topics with replication factor 3 and ``min.insync.replicas`` 2 (the defaults,
said explicitly). Timers fall due continuously (about `RATE` a second, each scheduled a
few seconds ahead, all along; their `Fire` commands go to other aggregates, through the
commands topic), one in `CANCEL_EVERY` cancelled well before it is due, while

1. the broker leading most of the partitions being fired (the timer changelog, the
   commands, the events) is killed with -9, and started again once the others lead;
2. every broker is stopped and started in turn (a rolling restart), the next once every
   partition, the internal topics' too, has its three replicas in sync again.

Then: no timer lost (every one due and not cancelled applied), none applied twice (one
`Fired` event per request id), none applied whose cancel reached the table while it was
pending; every command answered; /healthz, sampled throughout, 200 only when ready and
never while the oldest commit waits longer than its bound, and ready again at the end.
How late the timers were (their events' `created_at` against their due time), overall and
from each change to the next, is printed as JSON (``-s``): said, not asserted (two cores
run three brokers and two workers here).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import kafka_broker  # registered by tests/conftest.py
import orjson
import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError
from harness import Client, Cluster, Worker, eventually

from app.errors import KafkaUnavailable
from app.kafka.records import Replication
from app.model.decide import event_id
from app.node.health import MAX_COMMIT_LAG_S
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import CommandEnvelope, ResultCode
from tables import ACTIVE, TimerStatus

pytestmark = [pytest.mark.kafka, pytest.mark.kafka_cluster]

PARTITIONS = 4
REPLICATION = Replication(factor=3, min_insync=2)
OPTIONS = '{"claim_timeout": 5000, "send_timeout": 4000}'
RATE = 25  # timers due a second
TICK_S = 0.2  # one ScheduleMany of RATE * TICK_S timers each tick
AHEAD_MS = (3_000, 6_000)  # each due this far ahead of its schedule (uniformly)
CANCEL_EVERY = 2 * int(RATE * TICK_S)  # one timer in this many cancelled (one every other tick)
LOAD_S = 40.0  # timers scheduled for at least this long, and until the brokers' turns end
OWNERS = 24
TARGETS = 16  # the timers' Fire commands go to other aggregates, through the commands topic
INTERNAL_TOPICS = ("__consumer_offsets", "__transaction_state")
BASELINE_MS = 8_000  # timers due this long after the load began fired before the first change
LATE_MS = 1_000  # later than this (or than twice the p99 before any change) is not normal


@dataclass
class Plan:
    """What the scheduler sent: each timer's due time (ms) by id, the cancelled ones."""

    due: dict[str, int] = field(default_factory=dict)
    owner_key: dict[str, tuple[str, str]] = field(default_factory=dict)
    cancelled: set[str] = field(default_factory=set)
    schedules: list[str] = field(default_factory=list)  # the ScheduleMany request ids
    cancels: list[str] = field(default_factory=list)  # the Unschedule request ids
    resent: int = 0


@dataclass
class Change:
    name: str
    at_ms: int  # wall clock, when it began
    took_s: float = 0.0  # a kill: until every partition had a leader again; else the step


@dataclass
class Sample:
    at: float
    worker: str
    status: int | None
    body: dict[str, Any] | None


async def send_surely(client: Client, plan: Plan, command: CommandEnvelope) -> None:
    """Sends until the broker takes it: the same request id each time (the node applies a
    command once, however often it was sent)."""
    while True:
        try:
            await client.send(command)
            return
        except KafkaUnavailable:
            plan.resent += 1
            await asyncio.sleep(0.5)


async def schedule_load(client: Client, plan: Plan, stop: asyncio.Event) -> None:
    """Every TICK_S: one owner schedules RATE * TICK_S timers, due AHEAD_MS ahead; one in
    `CANCEL_EVERY` is cancelled well before it is due."""
    rng = random.Random(18)
    sends: set[asyncio.Task[None]] = set()
    taken: list[str] = []  # timers whose ScheduleMany the broker has: safe to cancel

    async def schedule(command: CommandEnvelope, ids: list[str]) -> None:
        await send_surely(client, plan, command)
        taken.extend(ids)

    for tick in itertools.count():
        if stop.is_set():
            break
        now = int(time.time() * 1000)
        owner = f"o{tick % OWNERS}"
        timers = []
        request_id = f"plan-{tick}"
        ids = []
        for k in range(int(RATE * TICK_S)):
            key = f"k{tick}-{k}"
            at = now + rng.randrange(*AHEAD_MS)
            target = client.ref(f"target-{(tick * 7 + k) % TARGETS}").model_dump()
            timers.append({"key": key, "rule": {"kind": "once", "at": at}, "target": target})
            timer_id = event_id(client.ref(owner), request_id, k)
            plan.due[timer_id] = at
            plan.owner_key[timer_id] = (owner, key)
            ids.append(timer_id)
        command = client.command(owner, "ScheduleMany", {"timers": timers}, request_id=request_id)
        plan.schedules.append(request_id)
        task = asyncio.create_task(schedule(command, ids))
        sends.add(task)
        task.add_done_callback(sends.discard)
        # Every other tick one timer cancelled (one in CANCEL_EVERY), among those the
        # broker has (its Unschedule comes after their ScheduleMany) due 2 s on or later.
        taken[:] = [t for t in taken if plan.due[t] >= now + 2_000 and t not in plan.cancelled]
        if tick % 2 == 0 and taken:
            timer_id = rng.choice(taken)
            who, key = plan.owner_key[timer_id]
            cancel = client.command(who, "Unschedule", {"keys": [key]})
            plan.cancelled.add(timer_id)
            plan.cancels.append(cancel.request_id)
            task = asyncio.create_task(send_surely(client, plan, cancel))
            sends.add(task)
            task.add_done_callback(sends.discard)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), TICK_S)
    if sends:
        await asyncio.gather(*sends)


async def poll_health(
    workers: Sequence[Worker], samples: list[Sample], stop: asyncio.Event
) -> None:
    """Every worker's /healthz four times a second until `stop`."""
    timeout = aiohttp.ClientTimeout(total=2)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while not stop.is_set():
            for w in workers:
                try:
                    async with session.get(f"http://127.0.0.1:{w.port}/healthz") as resp:
                        body = await resp.json()
                        samples.append(Sample(time.time(), w.name, resp.status, body))
                except (aiohttp.ClientError, TimeoutError, ValueError):
                    samples.append(Sample(time.time(), w.name, None, None))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.25)


async def describe(client: dict[str, Any], topics: Iterable[str]) -> list[dict[str, Any]]:
    admin = AIOKafkaAdminClient(request_timeout_ms=10_000, **client)
    await admin.start()
    try:
        described: list[dict[str, Any]] = await admin.describe_topics(list(topics))
        return described
    finally:
        await admin.close()


async def leaders(client: dict[str, Any], topics: Iterable[str]) -> dict[tuple[str, int], int]:
    """Each partition's leader (-1: none)."""
    return {
        (t["topic"], p["partition"]): p["leader"]
        for t in await describe(client, topics)
        for p in t["partitions"]
    }


async def all_led_without(client: dict[str, Any], topics: Sequence[str], gone: int) -> bool:
    try:
        led = await leaders(client, topics)
    except (KafkaError, OSError):
        return False
    return len(led) >= len(topics) and all(n not in (-1, gone) for n in led.values())


async def all_in_sync(client: dict[str, Any], topics: Sequence[str]) -> bool:
    """Every partition of `topics` led, with all its replicas in sync."""
    try:
        described = await describe(client, topics)
    except (KafkaError, OSError):
        return False
    return len(described) == len(topics) and all(
        not t.get("error_code")
        and t["partitions"]
        and all(
            p["leader"] >= 0 and len(p["isr"]) == len(p["replicas"]) == REPLICATION.factor
            for p in t["partitions"]
        )
        for t in described
    )


async def topic_configs(client: dict[str, Any], topic: str) -> dict[str, str]:
    admin = AIOKafkaAdminClient(request_timeout_ms=10_000, **client)
    await admin.start()
    try:
        [response] = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, {"min.insync.replicas": None})]
        )
        return {entry[0]: entry[1] for resource in response.resources for entry in resource[4]}
    finally:
        await admin.close()


class Fired:
    """The Fired events the test has seen (read again on each refresh)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.events: list[Any] = []

    async def refresh(self) -> bool:
        try:
            events = await asyncio.wait_for(self.client.events(), 20)
        except (KafkaUnavailable, KafkaError, TimeoutError, OSError):
            return False  # a broker going: read again
        self.events = [e for e in events if e.type == "Fired"]
        return True

    async def fired_due_after(self, plan: Plan, at_ms: int) -> bool:
        """Whether a timer due at or after `at_ms` was applied (timers fire again)."""
        if not await self.refresh():
            return False
        return any(
            plan.due.get((e.request_id or "#").split("#")[0], 0) >= at_ms for e in self.events
        )


def percentiles(values: list[int]) -> dict[str, int]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)

    def at(q: float) -> int:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"n": len(ordered), "p50": at(0.5), "p99": at(0.99), "max": ordered[-1]}


def lateness_report(plan: Plan, events: list[Any], changes: list[Change]) -> dict[str, Any]:
    """Per-timer lateness (ms: its event's created_at against its due time), overall, of
    the timers applied before the first change, and of those applied from each change to
    the next (a timer due while a broker was away counts where it was applied)."""
    applied = [
        (e.created_at, e.created_at - plan.due[timer])
        for e in events
        if (timer := str(e.request_id).split("#")[0]) in plan.due
    ]
    report: dict[str, Any] = {"overall_ms": percentiles([late for _, late in applied])}
    first = changes[0].at_ms if changes else 2**63
    baseline = percentiles([v for at, v in applied if at < first])
    report["before_the_first_change_ms"] = baseline
    # Normal: within twice the lateness of 99 % of the timers applied before any change.
    normal = max(LATE_MS, 2 * baseline.get("p99", 0))
    report["normal_ms"] = normal
    windows = []
    for i, change in enumerate(changes):
        end = changes[i + 1].at_ms if i + 1 < len(changes) else 2**63
        inside = [(at, v) for at, v in applied if change.at_ms <= at < end]
        late_at = [at for at, v in inside if v > normal]
        windows.append(
            {
                "change": change.name,
                "took_s": round(change.took_s, 1),
                "lateness_ms": percentiles([v for _, v in inside]),
                # When the last timer later than normal was applied, in seconds after the
                # change: lateness back to normal from then.
                "later_than_normal_until_s": round((max(late_at) - change.at_ms) / 1000, 1)
                if late_at
                else 0.0,
            }
        )
    report["after_each_change"] = windows
    return report


async def test_timers_fire_exactly_once_through_a_leader_kill_and_a_rolling_restart(
    kafka_cluster: kafka_broker.KafkaCluster, tmp_path: Path
) -> None:
    brokers = kafka_cluster
    admin = brokers.client_kwargs()
    assert brokers.running_nodes() == [1, 2, 3]
    cluster = Cluster(
        brokers.bootstrap,
        tmp_path,
        partitions=PARTITIONS,
        env={
            "TICKWHEEL_TIMER_OPTIONS": OPTIONS,
            "TICKWHEEL_REPLICATION_FACTOR": str(REPLICATION.factor),
            "TICKWHEEL_MIN_INSYNC_REPLICAS": str(REPLICATION.min_insync),
        },
        replication=REPLICATION,
    )
    agg = AggregateTopics(cluster.context, "counter")
    ctx = ContextTopics(cluster.context)
    fired_topics = [agg.timers_changelog, agg.commands, agg.events]
    node_topics = [*fired_topics, agg.timer_ops, ctx.results, ctx.dead_letters, ctx.ledger]
    every_topic = [*node_topics, *INTERNAL_TOPICS]
    plan = Plan()
    changes: list[Change] = []
    samples: list[Sample] = []
    stop_load, stop_health = asyncio.Event(), asyncio.Event()
    health_task: asyncio.Task[None] | None = None
    load_task: asyncio.Task[None] | None = None
    down: set[int] = set()
    began = time.monotonic()

    def phase(name: str) -> None:
        print(f"{time.monotonic() - began:7.1f}s {name}")

    try:
        workers = [cluster.start_worker("w1"), cluster.start_worker("w2")]
        health_task = asyncio.create_task(poll_health(workers, samples, stop_health))
        for w in workers:
            await cluster.wait_owned(w, within=90)
        phase("both workers own partitions")
        for topic in node_topics:  # as the workers created them
            [described] = await describe(admin, [topic])
            assert {len(p["replicas"]) for p in described["partitions"]} == {3}, described
            assert (await topic_configs(admin, topic))["min.insync.replicas"] == "2", topic
        async with Client(cluster) as client:
            fired = Fired(client)
            load_task = asyncio.create_task(schedule_load(client, plan, stop_load))
            load_began = time.time()

            async def fires_from(at_ms: int, what: str) -> None:
                """Until a timer due at `at_ms` or later was applied: timers fire."""
                await eventually(lambda: fired.fired_due_after(plan, at_ms), 60, what, 0.5)

            def begin(name: str) -> Change:
                changes.append(Change(name, int(time.time() * 1000)))
                return changes[-1]

            async def in_sync() -> None:
                await eventually(lambda: all_in_sync(admin, every_topic), 90, "in sync", 0.5)

            await fires_from(int(load_began * 1000) + BASELINE_MS, "a baseline of timers fired")
            phase("timers fire")

            # 1. The leader of most of the fired partitions killed with -9, then back.
            led = await leaders(admin, fired_topics)
            victim, count = Counter(led.values()).most_common(1)[0]
            kill = begin(f"kill -9 node {victim} (leader of {count}/{len(led)} partitions)")
            t0 = time.monotonic()
            down.add(victim)
            assert await asyncio.to_thread(brokers.kill_node, victim)
            await eventually(
                lambda: all_led_without(admin, every_topic, victim), 60, "new leaders", 0.2
            )
            kill.took_s = time.monotonic() - t0  # until every partition had a leader again
            phase(f"{kill.name}: new leaders after {kill.took_s:.1f} s")
            await fires_from(kill.at_ms + 3_000, "timers fire without the killed node")
            back = begin(f"start node {victim}")
            await asyncio.to_thread(brokers.start_node, victim)
            down.discard(victim)
            back.took_s = (time.time() * 1000 - back.at_ms) / 1000  # until it served
            await in_sync()
            phase(f"node {victim} back and in sync")

            # 2. A rolling restart: each node stopped and started in turn, the next once
            # every partition has its three replicas in sync again.
            for node in brokers.nodes:
                stop = begin(f"stop node {node}")
                down.add(node)
                await asyncio.to_thread(brokers.stop_node, node)
                stop.took_s = (time.time() * 1000 - stop.at_ms) / 1000
                await fires_from(stop.at_ms + 2_000, f"timers fire without node {node}")
                start = begin(f"start node {node}")
                await asyncio.to_thread(brokers.start_node, node)
                down.discard(node)
                start.took_s = (time.time() * 1000 - start.at_ms) / 1000
                await in_sync()
                await fires_from(start.at_ms + 2_000, f"timers fire after node {node} is back")
                phase(f"node {node} restarted, all in sync")

            await eventually(
                lambda: time.time() - load_began >= LOAD_S, LOAD_S, "the load's time", 1.0
            )
            stop_load.set()
            await load_task
            phase(f"{len(plan.due)} timers scheduled, {len(plan.cancelled)} cancelled")
            results = await client.wait_results(plan.schedules + plan.cancels, within=90)
            codes = Counter(results[r].code for r in plan.schedules)
            assert set(codes) == {ResultCode.COMMITTED}, codes
            cancel_codes = Counter(str(results[r].code) for r in plan.cancels)

            async def settled() -> bool:
                try:
                    rows = (await client.timers()).values()
                except KafkaUnavailable:
                    return False
                return len(rows) >= len(plan.due) and all(t.status not in ACTIVE for t in rows)

            await eventually(settled, 90, "every timer fired or cancelled", interval=1.0)
            phase("every timer settled")
            assert await fired.refresh()
            history = await client.changelog_history()
            for w in workers:
                await eventually(lambda w=w: ready(w), 60, f"{w.name} ready again")
            stop_health.set()
            await health_task
    finally:
        stop_load.set()
        stop_health.set()
        for task in (load_task, health_task):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await asyncio.to_thread(cluster.stop_all)
        for node in sorted(down):  # the cluster is the session's: every node back
            await asyncio.to_thread(brokers.start_node, node)

    applied = Counter(e.request_id for e in fired.events)
    by_timer = {str(r).split("#")[0] for r in applied}
    # A cancel that reached the table while the timer was PENDING (its row went PENDING ->
    # CANCELLED) stops it. One that came later (the row FIRING: a send in flight; or
    # FIRED) cannot: the brokers it went through may have been away meanwhile.
    rows_of: dict[str, list[TimerStatus]] = {}
    for rows in history.values():
        for row in rows:
            rows_of.setdefault(row.id, []).append(row.status)
    in_time = {
        t
        for t in plan.cancelled
        if any(
            (a, b) == (TimerStatus.PENDING, TimerStatus.CANCELLED)
            for a, b in itertools.pairwise(rows_of.get(t, []))
        )
    }
    print(
        orjson.dumps(
            {
                "timers": len(plan.due),
                "cancelled": len(plan.cancelled),
                "cancels_in_time": len(in_time),
                "cancels_answered": dict(cancel_codes),
                "sends_retried": plan.resent,
                **lateness_report(plan, fired.events, changes),
                "healthz": health_report(samples),
            },
            option=orjson.OPT_INDENT_2,
        ).decode()
    )

    # 0 applied twice.
    twice = {r: n for r, n in applied.items() if n > 1}
    assert not twice, f"applied more than once: {twice}"
    assert by_timer <= set(plan.due), "a Fired event of no scheduled timer"
    assert all(str(r).endswith("#0") for r in applied)
    # 0 lost.
    lost = sorted(t for t in set(plan.due) - plan.cancelled if t not in by_timer)
    assert not lost, f"{len(lost)} timers never applied: {lost[:5]}"
    # 0 cancelled applied.
    assert not in_time & by_timer, f"cancelled, applied: {sorted(in_time & by_timer)[:5]}"
    for t in plan.cancelled - by_timer:
        assert rows_of[t][-1] == TimerStatus.CANCELLED, (t, rows_of[t])
    assert len(plan.cancelled) >= 20
    assert len(in_time) >= len(plan.cancelled) // 2, "the test's cancels came too late"
    # /healthz honest: 200 only when ready, never with its oldest commit waiting longer
    # than the bound (it was never that long here: max_commit_lag_s above).
    for s in samples:
        if s.body is None:
            continue
        assert (s.status == 200) == bool(s.body["ready"]), s
        if s.body["commit_lag_s"] > MAX_COMMIT_LAG_S:
            assert s.status == 503, s
    assert len(changes) == 2 + 2 * len(brokers.nodes)


def ready(worker: Worker) -> bool:
    health = worker.health()
    return bool(health and health["ready"] and health["owned"])


def health_report(samples: list[Sample]) -> dict[str, Any]:
    by_worker: dict[str, Counter[str]] = {}
    for s in samples:
        state = "no answer" if s.status is None else str(s.status)
        by_worker.setdefault(s.worker, Counter())[state] += 1
    lags = [s.body["commit_lag_s"] for s in samples if s.body is not None]
    return {
        "samples": {w: dict(c) for w, c in by_worker.items()},
        "max_commit_lag_s": max(lags, default=0.0),
    }
