"""The broker goes away while timers fall due, as an operator would see it (issue 13).

A broker of this test's own (``scripts/kafka_local.py`` in a tmp dir, not the session's)
and two workers with /healthz; timers due every 150 ms for a minute. The broker is
(a) frozen (SIGSTOP) for longer than the workers' session timeout and thawed, then
(b) killed with -9 and restarted on the same dir and port. Then: no timer lost, none
applied twice, every timer due during an outage applied soon after the broker answers
again, a handful of worker log lines per outage (not thousands of client library
retries), and /healthz 503 while the broker is away, 200 once the node runs again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import kafka_broker  # registered by tests/conftest.py
import pytest
from harness import Client, Cluster, Worker, eventually

from app.protocol.wire import ResultCode
from tables import TimerStatus

pytestmark = pytest.mark.kafka

script = kafka_broker.load_kafka_local()

PARTITIONS = 4
OPTIONS = '{"claim_timeout": 4000, "send_timeout": 3000}'
FREEZE_S = 15.0  # longer than the session: the group forgets the workers meanwhile
OWNERS = 15
PER_OWNER = 30
SPACING_MS = 150  # one timer due every 150 ms, 450 in all: about 70 s of them
FIRST_DUE_MS = 3_000
RECOVERY_BOUND_S = 10.0  # due during an outage -> applied within this of recovery
STABLE_S = 8.0  # /healthz 200 this long without a 503 (longer than the session, so that
# a rebalance the outage causes comes first): the workers run again
LOG_BOUND = 15  # worker log lines from an outage's start to its recovery
SETTLE_LOG_BOUND = 60  # worker log lines from recovery until it runs its partitions again


@dataclass
class Sample:
    at: float
    worker: str
    status: int | None
    body: dict[str, Any] | None


@dataclass
class Outage:
    name: str
    start: float  # wall clock, s
    back: float = 0.0  # when the broker answered again
    # Until when it certainly did not answer: its thaw, or its restart's start (a restart
    # returns once the broker is ready, which is after it answers a probe).
    away_until: float = 0.0
    running_again: float = 0.0  # when the workers ran their partitions again


def lines_between(worker: Worker, start: float, end: float) -> list[str]:
    """The worker's log lines stamped from `start` to `end` (lines without a stamp, such
    as a traceback's, count with the line before them)."""
    out: list[str] = []
    at = 0.0
    for line in worker.text().splitlines():
        with contextlib.suppress(ValueError):
            at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if start <= at <= end:
            out.append(line)
    return out


def signal_broker(pid: int, sig: signal.Signals) -> None:
    """To the broker's process group (kafka_local starts it in a session of its own)."""
    if os.getpgid(pid) == pid:
        os.killpg(pid, sig)
    else:
        os.kill(pid, sig)


async def poll_health(ports: dict[str, int], samples: list[Sample], stop: asyncio.Event) -> None:
    """Asks every worker's /healthz four times a second until `stop`."""
    timeout = aiohttp.ClientTimeout(total=2)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while not stop.is_set():
            for name, port in ports.items():
                try:
                    async with session.get(f"http://127.0.0.1:{port}/healthz") as resp:
                        body = await resp.json()
                        samples.append(Sample(time.time(), name, resp.status, body))
                except (aiohttp.ClientError, TimeoutError, ValueError):
                    samples.append(Sample(time.time(), name, None, None))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.25)


def healthy(samples: list[Sample], name: str, after: float) -> bool:
    return any(s.worker == name and s.at > after and s.status == 200 for s in samples)


def stable(samples: list[Sample], name: str, after: float) -> bool:
    """200 since `after`, and nothing else for the last STABLE_S seconds (right after the
    broker is back a node still believes it owns its partitions: the rebalance that the
    outage caused comes a moment later)."""
    mine = [s for s in samples if s.worker == name and s.at > after]
    if not mine or mine[-1].at - mine[0].at < STABLE_S:
        return False
    return all(s.status == 200 for s in mine if s.at >= mine[-1].at - STABLE_S)


class Applied:
    """When the test first saw each timer's Fired event (its request id is `<timer>#0`)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.seen: dict[str, float] = {}
        self.counts: Counter[str] = Counter()

    async def refresh(self) -> None:
        try:
            events = await asyncio.wait_for(self.client.events(), 20)
        except Exception:  # the broker may still be settling: try again
            return
        now = time.time()
        counts: Counter[str] = Counter()
        for e in events:
            if e.type == "Fired":
                assert e.request_id is not None
                counts[e.request_id] += 1
        self.counts = counts
        for request_id in counts:
            self.seen.setdefault(request_id, now)


async def schedule(client: Client) -> dict[str, float]:
    """Schedules the timers; each one's request id (`<timer id>#0`) and due time (s)."""
    now = int(time.time() * 1000)
    due: dict[tuple[str, str], int] = {}
    commands = []
    for i in range(OWNERS):
        timers = []
        for j in range(PER_OWNER):
            at = now + FIRST_DUE_MS + (j * OWNERS + i) * SPACING_MS
            due[(f"o{i}", f"k{j}")] = at
            timers.append({"key": f"k{j}", "rule": {"kind": "once", "at": at}})
        commands.append(client.command(f"o{i}", "ScheduleMany", {"timers": timers}))
    await client.send(*commands)
    results = await client.wait_results([c.request_id for c in commands])
    assert {r.code for r in results.values()} == {ResultCode.COMMITTED}, results
    ids: dict[tuple[str, str], str] = {}

    async def all_rows() -> bool:
        nonlocal ids
        ids = {(t.owner.id, t.key): t.id for t in (await client.timers()).values()}
        return set(due) <= set(ids)

    await eventually(all_rows, 30, "every scheduled timer in the changelog")
    return {f"{ids[k]}#0": at / 1000 for k, at in due.items()}


async def test_the_broker_frozen_then_killed_while_timers_fall_due(tmp_path: Path) -> None:
    state = tmp_path / "kafka"
    broker = await asyncio.to_thread(script.start, state, fresh=True)
    cluster = Cluster(
        broker.bootstrap,
        tmp_path,
        partitions=PARTITIONS,
        env={"TICKWHEEL_TIMER_OPTIONS": OPTIONS},
    )
    ports = {"w1": script.free_port(), "w2": script.free_port()}
    samples: list[Sample] = []
    stop = asyncio.Event()
    poller: asyncio.Task[None] | None = None
    report: list[str] = []
    try:
        workers = {n: cluster.start_worker(n, TICKWHEEL_WEB_PORT=str(p)) for n, p in ports.items()}
        poller = asyncio.create_task(poll_health(ports, samples, stop))
        async with Client(cluster) as client:
            for w in workers.values():
                await cluster.wait_owned(w)
            await eventually(
                lambda: all(healthy(samples, n, 0) for n in workers), 60, "both workers ready"
            )
            first = next(s.body for s in samples if s.body is not None)
            assert "broker" in first, first
            due = await schedule(client)
            applied = Applied(client)
            outages: list[Outage] = []

            async def recovered(outage: Outage) -> None:
                """Until every timer due by the broker's return was applied and
                both workers answer 200 again."""

                async def check() -> bool:
                    await applied.refresh()
                    fired = all(r in applied.seen for r, at in due.items() if at <= outage.back)
                    ready = all(stable(samples, n, outage.back) for n in workers)
                    return fired and ready

                await eventually(check, 90, f"recovery from the {outage.name}", interval=0.5)
                outage.running_again = time.time() - STABLE_S

            # Timers are being applied before the broker goes.
            first_due = min(due.values())
            await eventually(lambda: time.time() > first_due + 2, 30, "the first timers fall due")

            # (a) Frozen for longer than the session, then thawed.
            frozen = Outage("freeze", time.time())
            outages.append(frozen)
            signal_broker(broker.pid, signal.SIGSTOP)
            try:
                await asyncio.sleep(FREEZE_S)  # the deliberate outage
            finally:
                frozen.away_until = time.time()
                signal_broker(broker.pid, signal.SIGCONT)
                frozen.back = time.time()
            await recovered(frozen)

            # (b) Killed with -9, restarted on the same dir and port.
            killed = Outage("kill -9 and restart", time.time())
            outages.append(killed)
            signal_broker(broker.pid, signal.SIGKILL)
            # Until the dead broker's sockets are gone from its port (restart refuses a
            # port in use; the clients' half-closed connections hold it a moment).
            port = int(broker.bootstrap.rsplit(":", 1)[1])
            await eventually(lambda: script.port_free(port), 60, f"port {port} free again")
            killed.away_until = time.time()
            broker = await asyncio.to_thread(script.restart, state)
            killed.back = time.time()
            await recovered(killed)

            # Every timer applied once, the last ones after both outages.
            async def all_fired() -> bool:
                await applied.refresh()
                return set(due) <= set(applied.seen)

            await eventually(all_fired, max(due.values()) - time.time() + 60, "all fired")
            rows = await client.timers()
    finally:
        stop.set()
        if poller is not None:
            await poller
        with contextlib.suppress(ProcessLookupError):
            signal_broker(broker.pid, signal.SIGCONT)
        await asyncio.to_thread(cluster.stop_all)
        await asyncio.to_thread(broker.stop)

    try:
        # 0 lost, 0 applied twice.
        assert len(rows) == len(due) == OWNERS * PER_OWNER
        assert {t.status for t in rows.values()} == {TimerStatus.FIRED}
        assert set(applied.counts) == set(due), (
            "a Fired event of no scheduled timer, or one missing"
        )
        twice = {r: n for r, n in applied.counts.items() if n != 1}
        assert not twice, f"applied more than once: {twice}"
        for outage in outages:
            during = [r for r, at in due.items() if outage.start <= at <= outage.back]
            late = [applied.seen[r] - outage.back for r in during]
            lines = {
                n: len(lines_between(w, outage.start, outage.back)) for n, w in workers.items()
            }
            settle = {
                n: len(lines_between(w, outage.back, outage.running_again))
                for n, w in workers.items()
            }
            report.append(
                f"{outage.name}: {outage.back - outage.start:.1f} s; {len(during)} timers due "
                f"during it, the last applied {max(late):.1f} s after the broker answered "
                f"(running again after {outage.running_again - outage.back:.1f} s); worker log "
                f"lines during it {lines}, from its return until running again {settle}"
            )
            assert len(during) >= 20, f"{outage.name}: too few timers due during it to tell"
            assert max(late) <= RECOVERY_BOUND_S, report[-1]

            # The log flood muted: one line when the broker goes.
            assert all(n <= LOG_BOUND for n in lines.values()), report[-1]
            assert all(n <= SETTLE_LOG_BOUND for n in settle.values()), report[-1]
            # /healthz 503 while the broker is away, 200 after.
            for name in workers:
                mine = [s for s in samples if s.worker == name]
                down = [
                    s
                    for s in mine
                    if outage.start <= s.at <= outage.back
                    and s.status == 503
                    and s.body is not None
                    and s.body["broker"]["reachable"] is False
                ]
                assert down, f"{outage.name}: {name} never said 503 (broker unreachable)"
                assert down[0].body is not None and down[0].body["ready"] is False
                assert down[0].body["broker"]["reason"], down[0].body
                into = down[0].at - outage.start
                report.append(f"  {name}: 503 {into:.1f} s into it: {down[0].body['broker']}")
                while_down = [s for s in mine if down[0].at <= s.at <= outage.away_until]
                assert all(s.status == 503 for s in while_down), [
                    (s.at - outage.start, s.status) for s in while_down if s.status != 503
                ]
                assert healthy(samples, name, outage.back)

        # One WARNING per outage when it goes, one INFO when it is back.
        for name, w in workers.items():
            text = w.text()
            gone = [line for line in text.splitlines() if "unreachable:" in line]
            back = [line for line in text.splitlines() if "answers again, after" in line]
            assert len(gone) == len(outages) == len(back), (name, gone, back)
            assert all(broker.bootstrap in line and " WARNING " in line for line in gone)
            assert all(" INFO " in line for line in back)
            report += [f"  {name}: {line}" for line in sorted(gone + back)]
    finally:
        print("\n".join(["", *report]))
