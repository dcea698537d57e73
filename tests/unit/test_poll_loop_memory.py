"""The node's consumer loop (`app.node.polling.poll_loop`) on the in-memory log: a
partition whose worker is stuck (its queue full) is paused and its batches kept, and holds
no other partition's records or offsets up; unstuck, it gets every record once, in order."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from fakes import RunningNode, running, wait_until
from fakes_poll import TYPE, Task, Workers
from pydantic import BaseModel

from app.kafka.memory import MemoryLog
from app.kafka.memory_group import MemoryGroupMember
from app.model.aggregate import AggregateType, Command, Decision
from app.node.polling import Batch, poll_loop
from app.node.task_id import TaskId
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import CommandEnvelope, CommandResult, EventEnvelope, decode, encode
from app.service import Service
from tables import AggregateRef, CommandSpec, OnceRule
from tables.partitioner import partition_of

TOPIC = "log"


@dataclass
class Loop:
    log: MemoryLog
    member: MemoryGroupMember
    running: dict[TaskId, Task]
    workers: Workers

    async def send(self, p: int, n: int) -> None:
        for i in range(n):
            await self.log.publisher().send(TOPIC, b"k", str(i).encode(), p)

    async def committed(self, p: int, offset: int) -> None:
        """Waits until the group's committed offset of p is `offset`."""
        await wait_until(lambda: self.log.committed("g", TOPIC, p) == offset, within=5)


@pytest.fixture
async def loop() -> AsyncIterator[Loop]:
    log = MemoryLog()
    log.create_topic(TOPIC, 2)

    async def nothing(_: set[tuple[str, int]]) -> None:
        return None

    member = log.group_member("g", [TOPIC], on_assigned=nothing, on_revoked=nothing)
    await member.start()
    workers = Workers()
    workers.of[1].go.set()
    running = workers.start()
    failures: list[str] = []
    polling = asyncio.create_task(
        poll_loop(member, running, workers, failures.append, workers.type_of([TOPIC]))
    )
    yield Loop(log, member, running, workers)
    for t in [polling, *workers.tasks]:
        t.cancel()
    await asyncio.gather(polling, *workers.tasks, return_exceptions=True)
    assert failures == []
    assert not polling.done() or polling.cancelled(), "the loop ended by itself"


async def stuck(loop: Loop) -> None:
    """Partition 0's worker takes nothing, its queue is full, and a batch waits behind it."""
    await loop.send(0, 3)
    await wait_until(loop.workers.of[0].queue.full)
    await loop.send(0, 2)
    await wait_until(lambda: (TOPIC, 0) in loop.member.paused(), within=5)


async def test_a_stuck_partition_holds_no_other_up_and_gets_all_its_records_once(
    loop: Loop,
) -> None:
    log, w0, w1 = loop.log, loop.workers.of[0], loop.workers.of[1]
    await stuck(loop)
    for _ in range(3):  # partition 1 reads on, and its offsets are committed, batch by batch
        await loop.send(1, 4)
        await loop.committed(1, log.offsets(TOPIC, 1)[1])
    await loop.send(0, 4)  # fetched only once partition 0 is resumed, after what was kept
    assert w1.got == list(range(12))
    assert w0.got == [] and log.committed("g", TOPIC, 0) is None
    w0.go.set()
    await loop.committed(0, 9)
    assert w0.got == list(range(9)), "every record once, in order"
    await wait_until(lambda: (TOPIC, 0) not in loop.member.paused())
    await loop.send(0, 1)
    await wait_until(lambda: w0.got == list(range(10)))


async def test_a_retake_drops_what_was_kept_and_reads_again_from_the_committed_offsets(
    loop: Loop,
) -> None:
    """The take the batches were kept for ended (p failed, and was rewound and taken
    again): they are stale, and never handed over; the new take reads p from its committed
    offset, and resumes it itself."""
    w0 = loop.workers.of[0]
    await stuck(loop)
    while not w0.queue.empty():  # as `PartitionInput.stop` does
        w0.queue.get_nowait()
    loop.running[TaskId(TYPE, 0)] = Task(w0.queue)  # taken again: a new task, nothing kept
    await loop.member.rewind([(TOPIC, 0)])
    loop.member.resume([(TOPIC, 0)])
    w0.go.set()
    await loop.committed(0, 5)
    await loop.send(1, 1)
    await loop.committed(1, 1)
    assert w0.got == list(range(5)), "the kept batch (3, 4) was dropped, not handed over"


class Counter(BaseModel):
    pass


counter = AggregateType("stuck", "counter", Counter)
SERVICE = Service(aggregates=(counter,))
TOPICS = AggregateTopics("stuck", "counter")


@counter.command("Schedule")
def _schedule(state: Counter, cmd: Command, d: Decision) -> None:
    d.schedule("k", OnceRule(at=int(cmd.body["at"])), CommandSpec(type="Fire"))


async def command(log: MemoryLog, owner: str) -> str:
    """Sends a Schedule (due in an hour) to `owner`; its request id."""
    now = int(time.time() * 1000)
    cmd = CommandEnvelope(
        request_id=uuid.uuid4().hex,
        type="Schedule",
        aggregate=AggregateRef(context="stuck", aggregate="counter", id=owner),
        body={"at": now + 3_600_000},
        issued_at=now,
    )
    await log.publisher().send(TOPICS.commands, owner.encode(), encode(cmd), partition_of(owner, 2))
    return cmd.request_id


def scheduled(log: MemoryLog, p: int) -> list[str]:
    """The owners of the timers set in p's log, in its order."""
    events = [decode(EventEnvelope, r.value) for r in log.records(TOPICS.events, p)]
    return [e.aggregate.id for e in events if e.type == "wow.ScheduleSet"]


async def test_a_node_goes_on_with_its_other_partitions_while_one_is_stuck(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Partition 0's cycles hang (as a store or a commit that does not answer): its queue
    fills and it is paused, while partition 1's commands are decided and committed. Once
    it answers, partition 0 decides every command it was sent, once each, in order."""
    log = MemoryLog()
    owners = [f"o{i}" for i in range(100)]
    zero = [o for o in owners if partition_of(o, 2) == 0][:8]
    one = [o for o in owners if partition_of(o, 2) == 1][:3]
    async with running(RunningNode(log, tmp_path, "a", SERVICE, 2)) as n:
        cycles, (member,) = n.node.cycles, log.groups["g"].members
        stuck = asyncio.Event()
        cycle = cycles._cycle

        async def hanging(key: TaskId, items: list[Batch], backlogs: Mapping[str, int]) -> bool:
            if key.p == 0:
                await stuck.wait()
            return await cycle(key, items, backlogs)

        monkeypatch.setattr(cycles, "_cycle", hanging)

        async def fetched() -> bool:
            return await member.backlog(TOPICS.commands, 0) == 0

        # One poll a command: the first in the hung cycle, four queued, the sixth kept.
        for owner in zero[:6]:
            await command(log, owner)
            await wait_until(fetched)
        # Partition 1 goes on: decided, its events and results committed.
        requests = [await command(log, owner) for owner in one]
        await wait_until(lambda: scheduled(log, 1) == one, within=5)
        assert set(requests) <= results(log)
        assert member.paused() == {(t, 0) for t, q in member.assignment() if q == 0}
        for owner in zero[6:]:
            await command(log, owner)  # not fetched while paused
        assert scheduled(log, 0) == [] and await member.backlog(TOPICS.commands, 0) == 2
        stuck.set()
        await wait_until(lambda: len(scheduled(log, 0)) >= len(zero), within=5)
        assert scheduled(log, 0) == zero, "every command once, in order"
        await wait_until(lambda: member.paused() == set())


def results(log: MemoryLog) -> set[str]:
    topic = ContextTopics("stuck").results
    return {
        decode(CommandResult, r.value).request_id for p in range(2) for r in log.records(topic, p)
    }


async def test_a_worker_that_dies_outside_its_cycle_has_its_partition_taken_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault of partition 0's worker itself (here the wait for room to stage, outside the
    cycle's own handling) closes 0's task and takes it afresh: 0 is never left with no
    worker while its queue fills, paused for ever and the node still ready, and its
    commands are decided once each."""
    log = MemoryLog()
    owners = [f"o{i}" for i in range(100)]
    zero = [o for o in owners if partition_of(o, 2) == 0][:3]
    async with running(RunningNode(log, tmp_path, "a", SERVICE, 2)) as n:
        commits = n.node.commits
        room = commits.room
        faults = [RuntimeError("the worker's own fault")]

        async def failing(types: object, p: int) -> None:
            if p == 0 and faults:
                raise faults.pop()
            await room(types, p)  # type: ignore[arg-type]

        monkeypatch.setattr(commits, "room", failing)
        for owner in zero:
            await command(log, owner)
        # The worker may have passed its wait for room before the patch: then the fault
        # comes at its next turn, after the commands it had (all three, fetched at once).
        await wait_until(lambda: not faults and scheduled(log, 0) == zero, within=10)
        (member,) = log.groups["g"].members
        await wait_until(lambda: member.paused() == set())
        assert scheduled(log, 0) == zero, "each decided once, the retake included"
