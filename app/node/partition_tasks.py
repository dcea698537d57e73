"""A node's partition tasks as the group gives and takes their partitions (Kafka Streams'
`TaskManager`): an assignment creates a task for each aggregate type and partition given
here (`TaskId`: the type of each topic given, and its partition) and starts taking it in
the background; a revoke takes each of its tasks out of the map and closes it in the
background, and waits for that close. A new task of a type's partition still closing
takes it only once that close is done (it reopens the transactional id the close
commits on). What the node says of its partitions (owned, restoring, closing) is of the
partitions, whatever their types: p is owned while a task of it runs, restoring while
one is taken.

No lock: the maps change only between awaits, and each task's state guards its own
lifecycle, so that no task's close (a commit, which may hang until its deadline) holds
up another task, an assignment or the node's other work."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

from app.node.kept import KeptType
from app.node.partition_commits import commit_lags
from app.node.partition_task import PartitionTask, TaskShared
from app.node.task_id import TaskId
from app.node.task_state import TaskState
from app.task_ends import cancelled_here

__all__ = ["SPLIT_GRACE_S", "PartitionTasks"]

logger = logging.getLogger(__name__)

SPLIT_GRACE_S = 30.0
"""How long the group's assignments may stay ones that cannot be run (`_unrunnable`)
before the node stops."""


class PartitionTasks:
    """The tasks of the types' partitions given to a node, and what they tell it (the
    tasks' `TaskManager`). `owned` is told how many partitions run, `all_running` that
    every task given runs, `fail` why the node must stop."""

    def __init__(
        self,
        *,
        owned: Callable[[int], None],
        all_running: Callable[[], None],
        fail: Callable[[str], None],
    ) -> None:
        # One task per type and partition given to this node, from its assignment to its
        # revoke.
        self.tasks: dict[TaskId, PartitionTask] = {}
        # The task running each type's partition (kept by the tasks): what `owns` reads,
        # and where a cycle's processor, failure and progress go. A revoked task runs its
        # partition until its close begins: what its cycles decide meanwhile is its own.
        self.running: dict[TaskId, PartitionTask] = {}
        # The revoked tasks still closing.
        self.closing: dict[PartitionTask, asyncio.Task[bool]] = {}
        self.shared: TaskShared | None = None  # what the tasks share, once the node started
        # Set (and replaced) at each assignment: a retake after a failure waits for it.
        self._answered = asyncio.Event()
        self._owned = owned
        self._all_running = all_running
        self._fail = fail
        # Since when the group's assignments are split (`assign`), and the watch that
        # fails the node once they were for `SPLIT_GRACE_S`.
        self._split_since: float | None = None
        self._split_watch: asyncio.Task[None] | None = None

    @property
    def restoring(self) -> frozenset[int]:
        """The partitions given to this node that it is still restoring (a task of any of
        their types is being taken)."""
        return frozenset(key.p for key, task in self.tasks.items() if task.taking)

    @property
    def owned(self) -> frozenset[int]:
        """The partitions of which a task runs here."""
        return frozenset(key.p for key in self.running)

    def owned_of(self, type_name: str) -> frozenset[int]:
        """The partitions of `type_name` whose task runs here."""
        return frozenset(key.p for key in self.running if key.type_name == type_name)

    def keys(self, assigned: set[tuple[str, int]]) -> set[TaskId]:
        """The tasks of topics' partitions: each topic's type (the node's), and p (none
        before the node started)."""
        if self.shared is None:
            return set()
        by_topic = self.shared.by_topic
        return {TaskId(by_topic[t][0].name, p) for t, p in assigned if t in by_topic}

    def leftover(self) -> set[TaskId]:
        """Every task, and every task whose close is under way."""
        return {*self.tasks, *(task.key for task in self.closing)}

    def assign(self, assigned: set[tuple[str, int]]) -> None:
        """Creates a task for each new type's partition and starts taking it in the
        background, the consumer paused on the topics of every task given until it runs.

        Restoring inside the rebalance callback would hold the group up (and a long restore
        would cost the node its membership): the consumer is paused on them instead.
        """
        assert self.shared is not None, "the node is not started"
        # Retakes waiting after a failure go on now: the group has answered.
        self._answered.set()
        self._answered = asyncio.Event()
        by_topic = self.shared.by_topic
        topics: dict[TaskId, set[str]] = {}
        for t, p in assigned:
            if t in by_topic:
                topics.setdefault(TaskId(by_topic[t][0].name, p), set()).add(t)
        split = _unrunnable(topics, by_topic, self.shared.settings.partitions)
        self._cancel_split_watch()
        if split is None:
            self._split_since = None
        else:
            # Run, such a task would pass over the commands it cannot decide, or fire
            # timers into a partition whose commands no task decides: nothing is taken.
            # A topic missing from the group leader's metadata for a moment (just made)
            # splits an assignment too, until the next one: the node stops only when the
            # assignments stay split for the grace. A task left from before (a revoke after
            # a lost membership may have named none) is let go too: nothing of it runs.
            for key in list(self.tasks):
                self._close(self.tasks.pop(key))
            self._owning()
            self.shared.consumer.pause(sorted(assigned))
            now = time.monotonic()
            since = self._split_since = self._split_since or now
            logger.error("%s; the node stops unless the group assigns otherwise", split)
            self._split_watch = asyncio.create_task(
                self._fail_after(since + SPLIT_GRACE_S - now, split), name="split assignment"
            )
            return
        # The group is the authority: what it no longer gives here is let go (a revoke
        # after a lost membership may have named none of it); not waited for here.
        for key in set(self.tasks) - set(topics):
            self._close(self.tasks.pop(key))
        new = sorted(set(topics) - set(self.tasks))
        # Every task given that does not run, not only the new ones: a new assignment
        # forgets every pause (a lost membership gives the same partitions back), and what
        # the poll loop fetched of a task taken (rewound, not yet running) or waiting for
        # its retake would be dropped, the position past it (`poll_loop` puts it back).
        waiting = [key for key, task in self.tasks.items() if task.state is not TaskState.RUNNING]
        self.shared.consumer.pause([(t, key.p) for key in [*new, *waiting] for t in topics[key]])
        for key in new:
            self.tasks[key] = task = PartitionTask(key, self.shared, self)
            # Its take reopens the transactional id a close of it under way still commits on.
            behind = [closing for gone, closing in self.closing.items() if gone.key == key]
            task.take(topics[key], behind=behind)
        if not new:
            self._owning()

    async def _fail_after(self, seconds: float, why: str) -> None:
        await asyncio.sleep(max(seconds, 0.0))
        self._fail(why)

    def _cancel_split_watch(self) -> None:
        if self._split_watch is not None:
            self._split_watch.cancel()
            self._split_watch = None

    async def revoke(self, gone: set[TaskId]) -> None:
        """Closes the tasks `gone` clean (a hand-off), each in a task of its own, and waits
        for them, and for their closes under way: a close whose commit hangs holds up no
        other task's. A split assignment's watch ends: the group assigns again, or the
        node stops."""
        self._cancel_split_watch()
        for key in sorted(gone & set(self.tasks)):
            self._close(self.tasks.pop(key))
        closes = [closing for task, closing in self.closing.items() if task.key in gone]
        if closes:
            # Not cancelled with the revoke: a close cut in two would leave p half open.
            await asyncio.wait(closes)
        self._owning()

    def closes(self) -> dict[TaskId, float]:
        """How long each task's close under way has been going, in seconds."""
        now, closes = time.monotonic(), dict[TaskId, float]()
        for task in self.closing:
            if task.closing_since is not None:
                closes[task.key] = max(closes.get(task.key, 0.0), now - task.closing_since)
        return closes

    def closing_commit_lags(self) -> dict[int, float]:
        """Per partition, how long the oldest commit of a close under way of it has been
        going (only those with one)."""
        return commit_lags((task.commits for task in self.closing), time.monotonic())

    def _close(self, task: PartitionTask) -> asyncio.Task[bool]:
        """Closes a task taken out of the map, in the background (`PartitionTask.revoke`).
        Until its close begins it still runs p: what its cycles decide, and their commits,
        are its own (`running` finds it, not a new task of p)."""

        async def closing() -> bool:
            """Whether p was closed (a new task of p takes it only then)."""
            try:
                await task.revoke()
                return True
            except (Exception, asyncio.CancelledError) as exc:
                cancelled = isinstance(exc, asyncio.CancelledError)
                if cancelled and cancelled_here():
                    raise  # this close itself was cancelled
                # A bug, or a CancelledError leaked out of a call (a client's) although
                # nobody cancelled this close: p may be half open, so the node stops.
                logger.exception("closing partition %d of %s failed", task.p, task.type_name)
                self._fail(f"closing partition {task.p} of {task.type_name} failed: {exc!r}")
                return False
            finally:
                del self.closing[task]

        task.leave()
        task.closing_since = (
            time.monotonic()
        )  # no retake starts now, not even on a failure before its close
        self.closing[task] = close = asyncio.create_task(
            closing(), name=f"close {task.type_name} {task.p}"
        )
        return close

    def _owning(self) -> None:
        owned = self.owned
        self._owned(len(owned))
        logger.info("owning partitions %s", sorted(owned))

    # The task manager's side (`TaskManager`): what the tasks tell the node.

    def answered(self) -> asyncio.Event:
        return self._answered

    def task_running(self, task: PartitionTask) -> None:
        if not any(t.taking for t in self.tasks.values() if t is not task):
            self._owning()
            self._all_running()

    def task_failed(self, task: PartitionTask) -> None:
        self._owning()  # it owns p no more until retaken: the gauge says so now

    def task_gone(self, task: PartitionTask) -> None:
        if self.tasks.get(task.key) is task:
            del self.tasks[task.key]

    def fail(self, why: str) -> None:
        self._fail(why)


def _unrunnable(
    topics: dict[TaskId, set[str]], by_topic: Mapping[str, tuple[KeptType, str]], partitions: int
) -> str | None:
    """Why the group's assignment cannot be run (None: it can): a partition past the
    context's count, or a type's partition given without all of the type's topics. The
    range assignor gives p of every topic to one member only while co-partitioned topics
    have one partition count: partitions added to some of them, or one deleted, splits p
    between members; added to all, the keys' partitions move under the aggregates."""
    wanted: dict[str, set[str]] = {}
    for topic, (kept, _) in by_topic.items():
        wanted.setdefault(kept.name, set()).add(topic)
    missing = [
        f"{key.type_name}[{key.p}] without {', '.join(sorted(wanted[key.type_name] - given))}"
        for key, given in sorted(topics.items(), key=lambda item: item[0])
        if given != wanted[key.type_name]
    ]
    if not missing:
        if past := sorted({key.p for key in topics if key.p >= partitions}):
            return (
                f"the group gave partition(s) {past[:5]} of topics this node keeps with "
                f"{partitions} partitions (TICKWHEEL_PARTITIONS): partitions were added to "
                "a context's topics while it ran. A context's partition count never "
                "changes: each aggregate's records and timers are placed by it (see "
                "docs/operations.md)"
            )
        return None
    shown = "; ".join(missing[:5]) + (f"; and {len(missing) - 5} more" if len(missing) > 5 else "")
    return (
        f"the group split co-partitioned topics between members: {shown}. Their partition "
        "counts differ (partitions added to some of them?) or one was deleted; every "
        "topic of a context has the same partition count, for good (see docs/operations.md)"
    )
