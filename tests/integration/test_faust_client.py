"""A faust app as a Tickwheel client on the real broker (README "faust apps").

The README's two command lines run as written: a Tickwheel worker keeping the example's
timer book, and the example faust app as a faust worker process. Orders go into the app's
input topic; the checks read only committed state: the reminders the agent wrote, the
timer table's changelog, the book's log and the dead letters.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import orjson
import pytest
from harness import ROOT, Client, Cluster, eventually, new_context, sent_base

from app.clients.timer_book import CANCEL_TIMER, SET_TIMER
from app.kafka import Producer, Record, TopicSpec, ensure_topics, read_partitions
from app.protocol.wire import (
    SCHEDULE_CANCELLED,
    SCHEDULE_PAUSED,
    SCHEDULE_RESUMED,
    SCHEDULE_SET,
    SCHEDULE_TRIGGERED,
    EventEnvelope,
    ResultCode,
    decode,
)
from tables import Outcome, TimerStatus
from tables.partitioner import partition_of

pytestmark = pytest.mark.kafka

PARTITIONS = 3
BOOK = "order-timers"  # examples/reminders_service.py
README = (ROOT / "README.md").read_text()


def readme_commands() -> list[str]:
    """The command lines of the README's "faust apps" section that start the two sides."""
    section = README.split("## faust apps\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    return [
        line
        for block in blocks
        for line in block.splitlines()
        if line.startswith(("tickwheel worker", "python -m"))
    ]


@pytest.fixture
def context() -> str:
    return new_context()


@pytest.fixture
async def cluster(kafka_bootstrap: str, tmp_path: Path, context: str) -> AsyncIterator[Cluster]:
    worker_line, _ = readme_commands()
    service = shlex.split(worker_line)[-1]
    assert worker_line == f"tickwheel worker --service {service}"
    c = Cluster(
        kafka_bootstrap,
        tmp_path,
        context=context,
        partitions=PARTITIONS,
        service=service,
        env={"REMINDERS_CONTEXT": context},
    )
    yield c
    c.stop_all()


@pytest.fixture
def faust_app(
    kafka_bootstrap: str, tmp_path: Path, context: str
) -> Iterator[subprocess.Popen[bytes]]:
    """The README's faust command line, run in a directory of its own (faust's data dir)."""
    _, line = readme_commands()
    words = shlex.split(line)
    assert words[0] == "python"
    home = tmp_path / "faust"
    home.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "TICKWHEEL_PARTITIONS": str(PARTITIONS),
        "REMINDERS_CONTEXT": context,
    }
    log = (tmp_path / "faust.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, *words[1:]], cwd=home, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


async def read_all(bootstrap: str, topic: str, partitions: int) -> list[Record]:
    out: list[Record] = []
    async for batch in read_partitions(bootstrap, topic, range(partitions)):
        out += batch
    return out


@pytest.mark.kafka_next
async def test_a_faust_app_schedules_receives_answers_and_cancels(
    kafka_bootstrap: str,
    tmp_path: Path,
    context: str,
    cluster: Cluster,
    faust_app: subprocess.Popen[bytes],
) -> None:
    orders, sent_topic = f"{context}.orders", f"{context}.reminders-sent"
    await ensure_topics(
        kafka_bootstrap, [TopicSpec(orders, PARTITIONS), TopicSpec(sent_topic, PARTITIONS)]
    )
    producer = Producer(kafka_bootstrap)
    await producer.start()

    async def order(order_id: str, kind: str, remind_in_ms: int = 0) -> None:
        value = {"order_id": order_id, "kind": kind, "remind_in_ms": remind_in_ms}
        await producer.send(
            orders, order_id.encode(), orjson.dumps(value), partition_of(order_id, PARTITIONS)
        )

    async def reminded() -> dict[str, list[dict[str, object]]]:
        if faust_app.poll() is not None:
            raise AssertionError(
                f"the faust app exited {faust_app.returncode}:\n"
                + (tmp_path / "faust.log").read_text(errors="replace")
            )
        found: dict[str, list[dict[str, object]]] = {}
        for r in await read_all(kafka_bootstrap, sent_topic, PARTITIONS):
            body = orjson.loads(r.value or b"{}")
            found.setdefault(str(body["order_id"]), []).append(body)
        return found

    try:
        async with Client(cluster, aggregate=BOOK) as client:
            worker = cluster.start_worker()
            began = time.monotonic()
            await order("a", "placed", remind_in_ms=500)

            async def a_reminded() -> bool:
                return "a" in await reminded()

            # The first reminder waits for both sides to join their groups.
            await eventually(a_reminded, 90, "order a's reminder from the faust agent")
            first = time.monotonic() - began

            # Paid before its reminder is due: cancelled. A record on the agent's command
            # topic that is not a command is dead-lettered by the app, which goes on.
            await order("b", "placed", remind_in_ms=4_000)
            await order("b", "paid")
            commands = f"{context}.order.commands"
            await producer.send(commands, b"x", b"{not a command", partition_of("x", PARTITIONS))
            await order("c", "placed", remind_in_ms=4_500)

            async def c_reminded() -> bool:
                return "c" in await reminded()

            await eventually(c_reminded, 60, "order c's reminder, due after b's")
            print(f"first reminder {first:.1f} s after the worker started")

            # b was due before c: it fired nothing, and its row says why.
            found = await reminded()
            assert set(found) == {"a", "c"}, found
            assert [len(v) for v in found.values()] == [1, 1], found

            # The app writes the reminder before its command's result, which the worker
            # then reads and settles: the rows are waited for, not read at once.
            async def settled() -> bool:
                now = {t.owner.id: t for t in (await client.timers()).values()}
                return all(
                    now.get(k) is not None and now[k].status is TimerStatus.FIRED
                    for k in ("a", "c")
                )

            await eventually(settled, 30, "a's and c's rows settled from the app's results")
            rows = {t.owner.id: t for t in (await client.timers()).values()}
            for fired in ("a", "c"):
                row = rows[fired]
                assert (row.status, row.outcome) == (TimerStatus.FIRED, Outcome.COMMITTED), row
                assert found[fired][0]["request_id"] == row.request_id
                assert found[fired][0]["due_at"] == row.slot_due_at
            assert (rows["b"].status, rows["b"].outcome) == (
                TimerStatus.CANCELLED,
                Outcome.CANCELLED,
            ), rows["b"]
            assert rows["b"].attempts == 0

            # The book's log: keyed by the order id, in its murmur2 partition, one version
            # per command, written by the worker from the app's commands.
            log = await read_all(kafka_bootstrap, client.topics.events, PARTITIONS)
            events: dict[str, list[tuple[int, str, str | None]]] = {}
            for r in log:
                e = decode(EventEnvelope, r.value)
                assert r.key == e.aggregate.id.encode()
                assert r.partition == partition_of(e.aggregate.id, PARTITIONS)
                events.setdefault(e.aggregate.id, []).append((e.version, e.type, e.request_id))
            assert [v[:2] for v in events["a"]] == [(1, SCHEDULE_SET)]
            assert [v[:2] for v in events["b"]] == [(1, SCHEDULE_SET), (2, SCHEDULE_CANCELLED)]
            p_b = partition_of("b", PARTITIONS)
            assert [v[2] for v in events["b"]] == [
                f"{orders}[{p_b}]@0:set:reminder",
                f"{orders}[{p_b}]@1:cancel:reminder",
            ]
            results = await client.results()
            assert results[f"{orders}[{p_b}]@1:cancel:reminder"].version == 2
            assert {SET_TIMER, CANCEL_TIMER} <= {
                decode_type(r.value)
                for r in await read_all(kafka_bootstrap, f"{context}.{BOOK}.commands", PARTITIONS)
            }

            letters = await client.dead_letters()
            assert [(d.topic, d.key, d.value) for d in letters] == [
                (commands, b"x", b"{not a command")
            ], letters
            assert "not a valid CommandEnvelope" in letters[0].error
            assert worker.alive
    finally:
        await producer.stop()


async def test_a_faust_app_pauses_triggers_and_resumes_a_timer(
    kafka_bootstrap: str,
    tmp_path: Path,
    context: str,
    cluster: Cluster,
    faust_app: subprocess.Popen[bytes],
) -> None:
    """Held (twice), nudged, released: the book answers as it answers the CLI, the nudge
    sends the reminder once, and the timer is due again when it was."""
    orders, sent_topic = f"{context}.orders", f"{context}.reminders-sent"
    await ensure_topics(
        kafka_bootstrap, [TopicSpec(orders, PARTITIONS), TopicSpec(sent_topic, PARTITIONS)]
    )
    producer = Producer(kafka_bootstrap)
    await producer.start()
    p = partition_of("d", PARTITIONS)
    assert partition_of("f", PARTITIONS) != p

    async def order(order_id: str, kind: str, remind_in_ms: int = 0) -> None:
        value = {"order_id": order_id, "kind": kind, "remind_in_ms": remind_in_ms}
        await producer.send(
            orders, order_id.encode(), orjson.dumps(value), partition_of(order_id, PARTITIONS)
        )

    async def reminded() -> list[dict[str, str]]:
        if faust_app.poll() is not None:
            raise AssertionError(
                f"the faust app exited {faust_app.returncode}:\n"
                + (tmp_path / "faust.log").read_text(errors="replace")
            )
        found = await read_all(kafka_bootstrap, sent_topic, PARTITIONS)
        return [orjson.loads(r.value or b"{}") for r in found]

    try:
        async with Client(cluster, aggregate=BOOK) as client:
            worker = cluster.start_worker()
            await order("d", "placed", remind_in_ms=600_000)  # not due while the test runs
            # A trigger is decided against the worker's list of topics, and the app makes
            # its command topic when it starts: a reminder fired (its send waits for a
            # fresh list) says the worker knows the topic, so the trigger is not NO_TARGET.
            # ("f": in another partition than "d", whose request ids count d's offsets.)
            await order("f", "placed", remind_in_ms=500)

            async def f_reminded() -> bool:
                return any(s["order_id"] == "f" for s in await reminded())

            await eventually(f_reminded, 90, "order f's reminder from the faust agent")
            for kind in ("held", "held", "nudged", "released"):
                await order("d", kind)
            rid = [f"{orders}[{p}]@{offset}:" for offset in range(5)]

            async def released() -> bool:
                await reminded()  # fails at once if the app died
                return rid[4] + "resume:reminder" in await client.results()

            await eventually(released, 60, "the book's answer to order d's release")
            results = await client.results()
            ops = ["set", "pause", "pause", "trigger", "resume"]
            answers = [
                (results[f"{rid[i]}{op}:reminder"].code, results[f"{rid[i]}{op}:reminder"].version)
                for i, op in enumerate(ops)
            ]
            assert answers == [
                (ResultCode.COMMITTED, 1),
                (ResultCode.COMMITTED, 2),
                (ResultCode.UNCHANGED, 2),  # nothing written: the book's version
                (ResultCode.COMMITTED, 3),
                (ResultCode.COMMITTED, 4),
            ], answers

            log = await read_all(kafka_bootstrap, client.topics.events, PARTITIONS)
            events = [decode(EventEnvelope, r.value) for r in log]
            assert [(e.version, e.type) for e in events if e.aggregate.id == "d"] == [
                (1, SCHEDULE_SET),
                (2, SCHEDULE_PAUSED),
                (3, SCHEDULE_TRIGGERED),
                (4, SCHEDULE_RESUMED),
            ]

            async def nudged() -> bool:
                return any(s["order_id"] == "d" for s in await reminded())

            await eventually(nudged, 60, "order d's reminder, sent by its nudge")
            sent = [sent_base(s["request_id"]) for s in await reminded() if s["order_id"] == "d"]
            assert sent == [rid[3] + "trigger:reminder>0"], sent
            (row,) = [t for t in (await client.timers()).values() if t.owner.id == "d"]
            assert row.status == TimerStatus.PENDING, row
            (placed, *_) = [
                r for r in await read_all(kafka_bootstrap, orders, PARTITIONS) if r.key == b"d"
            ]
            assert row.due_at == placed.timestamp + 600_000, (row, placed)  # as it was set
            assert worker.alive
    finally:
        await producer.stop()


def decode_type(value: bytes | None) -> str:
    return str(orjson.loads(value or b"{}")["type"])
