"""What the node's poll loop (`app.node.polling.poll_loop`) sees of the tasks and their
workers, for its tests on the in-memory log and on a real broker."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from app.node.partition_input import Held
from app.node.polling import Batch
from app.node.task_id import TaskId

TYPE = "t"
"""The one type the workers' topics are of."""


@dataclass(eq=False)
class Task:
    """A running task, as the loop sees it: its worker's queue and what was kept of its
    take."""

    queue: asyncio.Queue[Batch]
    held: Held = field(default_factory=Held)


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
    """The workers of partitions 0 and 1 (of one type, `TYPE`), running from `start`, and
    the offsets they did."""

    def __init__(self) -> None:
        self.done: dict[tuple[str, int], int] = {}
        self.of = {p: Worker(p, self.done) for p in (0, 1)}
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> dict[TaskId, Task]:
        """Starts the workers; the running tasks the loop reads, one a partition."""
        self.tasks = [asyncio.create_task(w.run()) for w in self.of.values()]
        return {TaskId(TYPE, p): Task(w.queue) for p, w in self.of.items()}

    @staticmethod
    def type_of(topics: list[str]) -> dict[str, str]:
        """The loop's map of the topics read to their type: all of `TYPE`."""
        return dict.fromkeys(topics, TYPE)

    def take_offsets(self) -> dict[tuple[str, int], int]:
        done = dict(self.done)
        self.done.clear()
        return done

    def offsets_landed(self) -> None:
        """The loop's commits land in the group (the test reads the log's)."""

    def offsets_ended(self) -> None:
        """Its commit ended (nothing waits on it here)."""


class NoOffsets:
    """A poll loop's offsets done that never has any (its commits land at once)."""

    def take_offsets(self) -> dict[tuple[str, int], int]:
        return {}

    def offsets_landed(self) -> None:
        pass

    def offsets_ended(self) -> None:
        pass
