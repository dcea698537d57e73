"""The node's one consumer loop, which its partition tasks share: each polled batch goes to
its partition's cycle while the task still runs the take it was fetched for, and the
offsets of work done with nothing to write are committed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from app.errors import KafkaUnavailable
from app.kafka.ports import GroupMember
from app.kafka.records import refused
from app.node.commits import Commits
from app.node.cycles import PartitionCycles
from app.node.partition_task import PartitionTask

__all__ = ["poll_loop"]

logger = logging.getLogger(__name__)


async def poll_loop(
    consumer: GroupMember,
    running: Mapping[int, PartitionTask],
    cycles: PartitionCycles,
    commits: Commits,
    fail: Callable[[str], None],
) -> None:
    """Hands each polled batch to its partition's worker, and commits what they did; ends
    after `fail` when the consumer is refused (no retry passes an ACL).

    Partitions are independent: each has a worker of its own, so one partition's slow
    transaction does not hold up the others' commands.
    """
    while True:
        try:
            batches = await consumer.poll(timeout_ms=200)
            # No await since the poll: the take of each running task as it was fetched.
            takes = {p: (task, task.takes) for p, task in running.items()}
            for (topic, p), records in batches.items():
                # else revoked, or taken again (and rewound) since it was fetched
                task = running.get(p)
                if task is not None and takes.get(p) == (task, task.takes):
                    await cycles.queue(p).put((topic, records))
            await consumer.commit(commits.take_offsets())
        except KafkaUnavailable as exc:
            if refused(exc):
                # An ACL missing (the group's Read, a topic's): no retry will pass it.
                fail(f"the group consumer was refused: {exc}")
                return
            # The broker or the group is in flux: the node keeps going and reads again.
            logger.warning("reading paused: %s", exc)
            await asyncio.sleep(1)
