"""The node's consumer loop (`app.node.polling.poll_loop`) on the in-memory log: a
partition whose worker is stuck (its queue full) is paused and its batches kept, and holds
no other partition's records or offsets up; unstuck, it gets every record once, in order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from fakes import wait_until

from app.kafka.memory import MemoryLog
from app.kafka.memory_group import MemoryGroupMember
from app.node.polling import Batch, poll_loop

TOPIC = "log"


@dataclass(eq=False)
class Task:
    takes: int = 1


@dataclass
class Worker:
    """A partition's worker: takes its queue's batches once `go` is set, and says their
    offsets done (as a cycle with nothing to write)."""

    p: int
    done: dict[tuple[str, int], int]
    queue: asyncio.Queue[Batch] = field(default_factory=lambda: asyncio.Queue(maxsize=1))
    go: asyncio.Event = field(default_factory=asyncio.Event)
    got: list[int] = field(default_factory=list)

    async def run(self) -> None:
        while True:
            await self.go.wait()
            topic, records = await self.queue.get()
            self.got += [r.offset for r in records]
            self.done[(topic, self.p)] = records[-1].offset + 1


class Workers:
    def __init__(self) -> None:
        self.done: dict[tuple[str, int], int] = {}
        self.of = {p: Worker(p, self.done) for p in (0, 1)}
        self.tasks = [asyncio.create_task(w.run()) for w in self.of.values()]

    def queue(self, p: int) -> asyncio.Queue[Batch]:
        return self.of[p].queue

    def take_offsets(self) -> dict[tuple[str, int], int]:
        done = dict(self.done)
        self.done.clear()
        return done


@dataclass
class Loop:
    log: MemoryLog
    member: MemoryGroupMember
    running: dict[int, Task]
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
    running = {0: Task(), 1: Task()}
    failures: list[str] = []
    polling = asyncio.create_task(poll_loop(member, running, workers, workers, failures.append))
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
    while not w0.queue.empty():  # as `PartitionCycles.stop` does
        w0.queue.get_nowait()
    loop.running[0] = Task(takes=2)
    await loop.member.rewind([(TOPIC, 0)])
    loop.member.resume([(TOPIC, 0)])
    w0.go.set()
    await loop.committed(0, 5)
    await loop.send(1, 1)
    await loop.committed(1, 1)
    assert w0.got == list(range(5)), "the kept batch (3, 4) was dropped, not handed over"
