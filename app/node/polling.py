"""The node's one consumer loop, which its partition tasks share: each polled batch of a
topic's partition goes to the queue of the task running that partition of the topic's
type (its input's, `PartitionInput`) while that task still runs the take it was fetched
for, and the offsets of work done with nothing to write are committed. A batch of a
partition that no task runs is read again once its take runs (`_put_back`), never skipped.

A task whose worker falls behind (its queue full: a slow cycle, a commit that hangs)
holds up no other, not even another type's task of its partition: as Kafka Streams does,
the consumer is paused on its topics of the partition, and the batches that did not fit
are kept, in order, and handed over before any later one of it once its queue has room;
then they are resumed. What was kept is the take's (`PartitionInput.held`):
a take that ends (a revoke, a failure, a retake, which rewinds it to its committed
offsets) drops it with its input, and its pauses are the take's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Final, Protocol

from app.errors import KafkaUnavailable
from app.kafka.in_log_refusals import FetchRefused
from app.kafka.ports import POLL_FAILING_S, GroupMember
from app.kafka.records import Record, instance_fenced, never_joins, refused
from app.node.partition_input import Batch, Held
from app.node.task_id import TaskId

__all__ = ["COMMITS_FAILING_S", "POLL_FAILING_S", "Batch", "poll_loop"]

logger = logging.getLogger(__name__)

POLL_MS = 200
HELD_POLL_MS = 50
"""How long a poll waits while a partition is held: its queue is looked at between polls."""
POLL_RETRY_S = 1.0
"""The pause after a poll that failed, before the next."""
# `POLL_FAILING_S` (the port's): polls failing that long, none passing, stop the node, as
# the node's followers' do (`app.timers.sender.FollowerPolls`): a batch corrupt on a
# broker's disk fails every poll that fetches it, for good (the consumer reads every other
# partition again each time, and passes none).
COMMITS_FAILING_S: Final = 300.0
"""The group's offset commits failing this long, none landing, stop the node, whatever the
polls between them do: each waits up to `GROUP_CALL_S` (30 s) for a coordinator away, the
node not ready meanwhile (commit lag). Longer than the polls' bound: the coordinator is one
broker for every node of the group, and its offsets' failover (a broker lost, a large
offsets partition loaded) may take a minute or two, which every busy node would otherwise
be stopped by at once."""


class Running(Protocol):
    """A type's partition's task as the loop sees it (`PartitionTask`): its take's input."""

    @property
    def queue(self) -> asyncio.Queue[Batch]:
        """Its worker's queue (its take's, bounded)."""
        ...

    @property
    def held(self) -> Held:
        """Its batches that did not fit in its queue (its take's)."""
        ...


class DoneOffsets(Protocol):
    """Offsets of work done with nothing to write (`Commits`), and their commits landing
    (how long one has not is readiness's)."""

    def take_offsets(self) -> dict[tuple[str, int], int]: ...

    def offsets_landed(self) -> None: ...

    def offsets_ended(self) -> None:
        """The commit of the offsets last taken ended, landed or not."""
        ...


async def poll_loop(
    consumer: GroupMember,
    running: Mapping[TaskId, Running],
    commits: DoneOffsets,
    fail: Callable[[str], None],
    type_of: Mapping[str, str],
    *,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Hands each polled batch to the worker of the task running its partition of its
    topic's type (`type_of`: each topic read, its type's name), and commits what they did;
    ends after `fail` when the consumer is refused (no retry passes an ACL), a partition's
    fetches are refused where its log holds their position, or go unanswered while records
    wait, for too long (`FetchRefused`, `FetchStalled`), or its polls or its offset
    commits keep failing (`POLL_FAILING_S`, `COMMITS_FAILING_S`, by `clock`).

    Tasks are independent: each has a worker of its own, so one task's slow transaction
    does not hold up the others' commands, nor (paused on while its queue is full) their
    records and offsets.
    """
    polls = _Failing("polls", POLL_FAILING_S)
    commits_failing = _Failing("offset commits", COMMITS_FAILING_S)
    while True:
        calls, started = polls, clock()
        try:
            holding = _hand_over(consumer, running)
            batches = await consumer.poll(timeout_ms=HELD_POLL_MS if holding else POLL_MS)
            polls.since = None
            for (topic, p), records in batches.items():
                # A take rewinds p (to its committed offsets) before it runs, and the
                # consumer drops what it fetched of p before a seek: what comes back is
                # the running take's. None running: put back (`_put_back`).
                key = TaskId(type_of.get(topic, ""), p)
                task = running.get(key)
                if task is None:
                    _put_back(consumer, topic, p, records)
                    continue
                held, queue = task.held, task.queue
                if not held.batches and not queue.full():
                    queue.put_nowait((topic, records))
                    continue
                if not held.batches:
                    held.paused = [
                        (t, q)
                        for t, q in consumer.assignment()
                        if q == p and type_of.get(t) == key.type_name
                    ]
                # Again on each batch kept: a new assignment (a lost membership that gave p
                # back to its running task) forgets the pause, and p must not pile up here.
                consumer.pause(held.paused)
                held.batches.append((topic, records))
            calls, started = commits_failing, clock()
            try:
                await consumer.commit(commits.take_offsets())
            finally:
                commits.offsets_ended()
            # Landed, or none to commit: nothing waits for the group's commit (no lag).
            commits_failing.since = None
            commits.offsets_landed()
        except KafkaUnavailable as exc:
            if refused(exc):
                # An ACL missing (the group's Read, a topic's): no retry will pass it.
                fail(f"the group consumer was refused: {exc}")
                return
            if instance_fenced(exc):
                # Another worker runs with this one's group.instance.id: it holds the
                # partitions now, and every join of this one is refused.
                fail(f"the group fenced the node: {exc}")
                return
            if never_joins(exc):
                # Else the node would own nothing, for good, and say it was ready.
                fail(f"the group turned the node's join down: {exc}")
                return
            if isinstance(exc, FetchRefused):
                # Else that partition would read nothing, for good, while the others go on
                # and the node says it is ready (the other polls pass: no bound above ends it).
                fail(f"a partition's reading stopped: {exc}")
                return
            # The broker or the group is in flux: the node keeps going and reads again (a
            # poll that fails hands nothing out and moves no partition: `GroupMember.poll`).
            now = clock()
            # A poll's failure counts from when it was seen, as ever; a commit's from when
            # the first in a row began (a coordinator away takes 30 s to fail each).
            failing_s = calls.failed(now if calls is polls else started, now)
            if failing_s >= calls.bound_s:
                failed = f"the group consumer's {calls.what} failed for {failing_s:.0f} s"
                fail(f"{failed}, none passing: {exc}")
                return
            logger.warning("reading paused: %s", exc)
            await asyncio.sleep(POLL_RETRY_S)


class _Failing:
    """Since when one kind of the group consumer's calls (`what`) has failed, none passing
    since (None: the last one passed), and how long it may (`bound_s`)."""

    def __init__(self, what: str, bound_s: float) -> None:
        self.what = what
        self.bound_s = bound_s  # failing this long, none passing, stops the node
        self.since: float | None = None

    def failed(self, since: float, now: float) -> float:
        """One failed (counting from `since`, unless an earlier one in a row does): how
        long they have failed at `now`."""
        self.since = since if self.since is None else self.since
        return now - self.since


def _put_back(consumer: GroupMember, topic: str, p: int, records: list[Record]) -> None:
    """A batch of a partition that no task runs is handed to none: read again from its
    first record, the partition paused. Revoked, p is not sought (its next owner reads it
    from the committed offsets). Still assigned here, its task is being taken (or waits for
    its retake), which pauses it and resumes it when it runs; but a take already past its
    rewind reads on from where the consumer is, and what was dropped here would never be
    decided, the next commit passing it. Whatever forgot the pause (a new assignment does),
    the position never passes a record no task was handed: done here, before the loop's
    next await, rather than by a take rewinding again (a call to the coordinator each)."""
    if records and consumer.seek(topic, p, records[0].offset):
        consumer.pause([(topic, p)])


def _hand_over(consumer: GroupMember, running: Mapping[TaskId, Running]) -> bool:
    """Hands the running tasks' held batches over as their queues have room, in order; a
    task whose batches are all handed over is resumed on its topics. Whether any are still held.
    (Those of a take that ended went with its input: the next take rewinds to the
    committed offsets, and resumes the partition itself.)"""
    holding = False
    for task in list(running.values()):
        held, queue = task.held, task.queue
        if not held.batches:
            continue
        while held.batches and not queue.full():
            queue.put_nowait(held.batches.popleft())
        if held.batches:
            holding = True
        else:
            consumer.resume(held.paused)
    return holding
