"""A partition being taken loses none of its records when the node loses its membership
meanwhile (found by a lifecycle hunt). The take had rewound p to its committed offsets and
was reading its log's tail, not running yet; the member rejoined (a revoke naming nothing,
then the same partitions back, every pause forgotten), and the assignment paused only the
tasks it made: the poll loop fetched p's new records, dropped them (no task ran p) with the
position past them, and the take ran p from there: never decided, committed past."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
from fakes import RunningNode, wait_until
from fakes_poll import TYPE, Workers
from test_node_memory import TOPICS, results, schedule, start, task_of

import app.node.partition_take as partition_take
from app.kafka import LogReader
from app.kafka.memory import MemoryLog
from app.node.partition_open import last_records
from app.node.polling import poll_loop
from app.node.task_id import TaskId
from tables.partitioner import partition_of

__all__ = ["log", "nodes"]  # the fixtures, imported for pytest

from test_node_memory import log, nodes

P = 1
OWNER = next(f"o{i}" for i in range(1, 99) if partition_of(f"o{i}", 2) == P)
OTHER = next(f"o{i}" for i in range(1, 99) if partition_of(f"o{i}", 2) != P)


async def test_a_lost_membership_while_p_is_taken_keeps_p_paused_and_loses_none_of_it(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate, reading = asyncio.Event(), asyncio.Event()

    async def held(reader: LogReader, p: int, starts: Mapping[str, int]) -> dict[str, int]:
        if p == P and not gate.is_set():
            reading.set()  # p rewound to its committed offsets, its log's tail being read
            await gate.wait()
        return await last_records(reader, p, starts)

    monkeypatch.setattr(partition_take, "last_records", held)
    node = await start(nodes, log, tmp_path, "a")
    other = task_of(1 - P)
    await wait_until(lambda: reading.is_set() and other in node.node.tasks.running)
    member = log.groups["g"].members[0]
    await log.groups["g"].expel(member)  # told at its next poll: it rejoins then
    await wait_until(lambda: not member.expelled)
    far = int(time.time() * 1000) + 3_600_000
    # Fetched after the rejoin (the poll goes on once the assignment was answered).
    first = await schedule(log, OTHER, far)
    await wait_until(lambda: first.request_id in results(log))
    mine = {(t, P) for t in (TOPICS.events, TOPICS.commands, TOPICS.timer_ops)}
    assert mine <= member.paused(), "the new assignment paused p, still being taken"
    command = await schedule(log, OWNER, far)
    later = await schedule(log, OTHER, far)  # its poll fetched p's too, were p not paused
    await wait_until(lambda: later.request_id in results(log))
    assert await member.backlog(TOPICS.commands, P) == 1, "nothing of p read past"
    gate.set()
    await wait_until(node.runs)
    await wait_until(lambda: command.request_id in results(log))
    await wait_until(lambda: log.committed("g", TOPICS.commands, P) == 1)
    assert node.node._failure is None


TOPIC = "log"


async def test_a_batch_of_a_partition_no_task_runs_is_put_back_and_paused() -> None:
    """Whatever forgot p's pause while its take is past its rewind: the poll loop reads
    again from the batch it could hand to no task, and pauses p; its take resumes it, and
    its task gets every record of p."""
    log = MemoryLog()
    log.create_topic(TOPIC, 2)

    async def nothing(_: set[tuple[str, int]]) -> None:
        return None

    consumer = log.group_member("g", [TOPIC], on_assigned=nothing, on_revoked=nothing)
    await consumer.start()
    workers = Workers()
    for w in workers.of.values():
        w.go.set()
    running = workers.start()
    taken = running.pop(TaskId(TYPE, 0))  # 1's task runs, 0's is being taken
    failures: list[str] = []
    polling = asyncio.create_task(
        poll_loop(consumer, running, workers, failures.append, workers.type_of([TOPIC]))
    )
    try:
        for i in range(3):
            await log.publisher().send(TOPIC, b"k", b"%d" % i, 0)
        await log.publisher().send(TOPIC, b"k", b"x", 1)
        # Its poll, or an earlier one, fetched 0's records.
        await wait_until(lambda: log.committed("g", TOPIC, 1) == 1)
        assert (TOPIC, 0) in consumer.paused()
        assert await consumer.backlog(TOPIC, 0) == 3, "nothing of 0 read past"
        running[TaskId(TYPE, 0)] = taken  # it runs from where the consumer is, as `run`
        consumer.resume([(TOPIC, 0)])
        await log.publisher().send(TOPIC, b"k", b"3", 0)
        await wait_until(lambda: log.committed("g", TOPIC, 0) == 4)
        assert workers.of[0].got == list(range(4)), "every record of 0 once, in order"
    finally:
        for t in [polling, *workers.tasks]:
            t.cancel()
        await asyncio.gather(polling, *workers.tasks, return_exceptions=True)
    assert failures == []
