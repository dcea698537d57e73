"""The node's one consumer loop, which its partition tasks share: each polled batch goes to
the queue of the task running its partition (its input's, `PartitionInput`) while that
task still runs the take it was fetched for, and the offsets of work done with nothing to
write are committed.

A partition whose worker falls behind (its queue full: a slow cycle, a commit that hangs)
holds up no other: as Kafka Streams does, the consumer is paused on it, and the batches
that did not fit are kept, in order, and handed over before any later one of it once its
queue has room; then it is resumed. A take that ends (a revoke, a failure, a retake, which
rewinds it to its committed offsets) drops what was kept, and its pauses are the take's.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from app.errors import KafkaUnavailable
from app.kafka.ports import GroupMember
from app.kafka.records import refused
from app.node.partition_input import Batch

__all__ = ["Batch", "poll_loop"]

logger = logging.getLogger(__name__)

POLL_MS = 200
HELD_POLL_MS = 50
"""How long a poll waits while a partition is held: its queue is looked at between polls."""


class Running(Protocol):
    """A partition's task as the loop sees it (`PartitionTask`)."""

    @property
    def takes(self) -> int:
        """How many times it started running: a batch of an earlier take is stale."""
        ...

    @property
    def queue(self) -> asyncio.Queue[Batch]:
        """Its worker's queue (its take's, bounded)."""
        ...


class DoneOffsets(Protocol):
    """Offsets of work done with nothing to write (`Commits`)."""

    def take_offsets(self) -> dict[tuple[str, int], int]: ...


@dataclass(eq=False)
class _Held:
    """A partition's batches that did not fit in its queue, of one take of its task; the
    consumer is paused on `paused` meanwhile."""

    task: Running
    takes: int
    paused: list[tuple[str, int]]
    batches: deque[Batch] = field(default_factory=deque)

    def of(self, task: Running | None) -> bool:
        """Whether `task` still runs the take these batches were fetched for."""
        return task is self.task and task.takes == self.takes


async def poll_loop(
    consumer: GroupMember,
    running: Mapping[int, Running],
    commits: DoneOffsets,
    fail: Callable[[str], None],
) -> None:
    """Hands each polled batch to the worker of the task running its partition, and
    commits what they did; ends after `fail` when the consumer is refused (no retry
    passes an ACL).

    Partitions are independent: each has a worker of its own, so one partition's slow
    transaction does not hold up the others' commands, nor (paused on while its queue is
    full) their records and offsets.
    """
    held: dict[int, _Held] = {}
    while True:
        try:
            _hand_over(consumer, running, held)
            batches = await consumer.poll(timeout_ms=HELD_POLL_MS if held else POLL_MS)
            # No await since the poll: the take of each running task as it was fetched.
            takes = {p: (task, task.takes) for p, task in running.items()}
            for (topic, p), records in batches.items():
                # else revoked, or taken again (and rewound) since it was fetched
                task = running.get(p)
                if task is None or takes.get(p) != (task, task.takes):
                    continue
                h = held.get(p)
                if h is not None and not h.of(task):
                    del held[p]  # of an earlier take (its pauses were that take's)
                    h = None
                queue = task.queue
                if h is None and not queue.full():
                    queue.put_nowait((topic, records))
                    continue
                if h is None:
                    mine = [(t, q) for t, q in consumer.assignment() if q == p]
                    h = held[p] = _Held(task, task.takes, mine)
                # Again on each batch kept: a new assignment (a lost membership that gave p
                # back to its running task) forgets the pause, and p must not pile up here.
                consumer.pause(h.paused)
                h.batches.append((topic, records))
            await consumer.commit(commits.take_offsets())
        except KafkaUnavailable as exc:
            if refused(exc):
                # An ACL missing (the group's Read, a topic's): no retry will pass it.
                fail(f"the group consumer was refused: {exc}")
                return
            # The broker or the group is in flux: the node keeps going and reads again.
            logger.warning("reading paused: %s", exc)
            await asyncio.sleep(1)


def _hand_over(
    consumer: GroupMember,
    running: Mapping[int, Running],
    held: dict[int, _Held],
) -> None:
    """Hands the held batches over as their queues have room, in order; a partition whose
    batches are all handed over is resumed. Those of a take that ended are dropped: the
    next take rewinds to the committed offsets, and resumes the partition itself."""
    for p, h in list(held.items()):
        if not h.of(task := running.get(p)):
            del held[p]
            continue
        assert task is not None
        queue = task.queue
        while h.batches and not queue.full():
            queue.put_nowait(h.batches.popleft())
        if not h.batches:
            del held[p]
            consumer.resume(h.paused)
