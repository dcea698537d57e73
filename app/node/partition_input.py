"""One take of a partition task's input (`PartitionInput`, of one type's partition): the
queue the poll loop hands its type's batches of the partition to, the batches that did
not fit meanwhile (`Held`, the poll loop's to hand over, the consumer paused on the
task's topics of the partition), the worker that runs its cycles over them
(`PartitionCycles.work`), the lock a cycle holds so that what it writes commits in one
transaction, whether timers wait to fire in-process at its next cycle (and those a
cycle's budget left), whether a cycle was cut short, and where its last failed cycle read.

Its task creates one each time it starts running and stops it when it closes (clean or
dirty): nothing of a take outlives it, and a retake starts with an empty queue. The
worker is supervised: one that ends other than by `stop` fails its task (closed dirty,
taken afresh), never a partition left paused for ever while the rest go on."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.kafka import Record
from app.node.failing import ITS_WORKER
from app.node.own_records import OwnRecords
from app.node.task_id import TaskId

if TYPE_CHECKING:
    from app.node.cycles import PartitionCycles
    from app.node.partition_transaction import PartitionTransaction
    from tables import Timer

__all__ = ["LOCAL", "QUEUE_SIZE", "Batch", "Held", "PartitionInput"]

logger = logging.getLogger(__name__)

Batch = tuple[str, list[Record]]
"""A polled batch of one topic of a partition."""

LOCAL: Batch = ("", [])
"""Queued for a partition's worker: timers were claimed to fire in-process."""

QUEUE_SIZE = 4
"""Batches queued for a worker: bounded, so that a partition that falls behind is paused
by the poll loop (its batches kept there), not piled up here."""


@dataclass
class Held:
    """A partition's batches that did not fit in its queue, in order, to be handed over
    before any later one (`app.node.polling`); the consumer is paused on `paused` while
    there are any. They are their take's: a new take has a new input, and reads again
    from the committed offsets (resuming the partition itself)."""

    batches: deque[Batch] = field(default_factory=deque)
    paused: list[tuple[str, int]] = field(default_factory=list)


class PartitionInput:
    """One take of the input of task `key` (a type's partition), its worker started at
    once; `on_failure` (its task's `failed`) is told when the worker ends other than by
    `stop`. `transaction` gives its task's transaction of p, where the cycles stage their
    work (None: it holds none)."""

    def __init__(
        self,
        key: TaskId,
        cycles: PartitionCycles,
        on_failure: Callable[[str, BaseException], None],
        transaction: Callable[[], PartitionTransaction | None],
    ) -> None:
        self.key = key
        self.type_name, self.p = key
        self.transaction = transaction
        self.queue: asyncio.Queue[Batch] = asyncio.Queue(maxsize=QUEUE_SIZE)
        self.held = Held()
        # Held by a cycle and around taking its transaction (`Commits`): what one cycle
        # writes (events, settles) commits in one transaction, never half of it.
        self.lock = asyncio.Lock()
        # Whether its firing holds timers claimed to fire in-process here.
        self.local = False
        # While the earlier slices of a poll are decided: the timers handed over fire in
        # its last, so that a cancel read in the same poll is decided before them.
        self.holding = False
        # While a poll's slices are decided: per topic, the records of the slices after.
        self.behind: dict[str, int] = {}
        # A cycle was stopped in its middle: what the transaction holds is half a cycle.
        self.cut = False
        # The records of the last cycle's batches its budget for deciding left (its last
        # ones, `DECIDE_BUDGET_S`): not done, its worker's next cycle decides them first.
        self.unreached = 0
        # Timers claimed to fire in-process here that a cycle's budget left (in its order):
        # still in their firing's hand (claimed), fired first by the next cycle. Dropped
        # with the take, as the runner's stop drops their claims (the next owner fires them).
        self._timers_left: list[Timer] = []
        # The last offset of each topic the last cycle read, if it failed.
        self.failed_at: dict[str, int] = {}
        # The ids of its own events whose timer operations its cycles carried out at once
        # (`TimerTableCycles._carry_out`), until the subscription reads them back: then
        # they are passed over. Applied again, one command's events read back one by one
        # would undo what the command did as a whole (its cancel of a key read back after
        # its set of the key again cancelled the new timer). A retake starts with none:
        # read back by it, they are applied as any event is.
        self.carried: set[str] = set()
        # Its own records on its input topics, committed, until read back: passed over
        # undecoded (`app.node.own_records`). A retake starts with none, as `carried`.
        self.own = OwnRecords()
        self._on_failure = on_failure
        self._stopped = False
        self._worker = asyncio.create_task(
            cycles.work(self), name=f"partition {self.p} of {self.type_name}"
        )
        self._worker.add_done_callback(self._worker_ended)

    @property
    def running(self) -> bool:
        """Whether its worker runs (neither stopped nor ended)."""
        return not self._worker.done()

    def fire_local(self) -> None:
        """The next cycle fires the timers its type's runner claimed to fire in-process
        here (it asks the runner for them)."""
        if self._stopped:
            return  # let go: the runner's stop drops them, the next owner fires them
        self.local = True
        if not self.queue.full():  # else the worker has batches to do, and fires with them
            self.queue.put_nowait(LOCAL)

    def take_local(self) -> bool:
        """Whether timers wait to fire in-process, forgotten here (a cycle takes them);
        False while `holding` (kept for the cycle after)."""
        if self.holding:
            return False
        local, self.local = self.local, False
        return local

    def keep_timers(self, timers: list[Timer]) -> None:
        """Timers taken to fire in-process that a cycle's budget left: the next cycle fires
        them first (its worker woken for it)."""
        if timers:
            self._timers_left = timers + self._timers_left
            self.fire_local()

    def take_timers_left(self) -> list[Timer]:
        """The timers a cycle's budget left (`keep_timers`), forgotten here."""
        left, self._timers_left = self._timers_left, []
        return left

    def _worker_ended(self, worker: asyncio.Task[None]) -> None:
        """A worker ends only by `stop`; any other end is a fault of the node, and the task
        is closed and taken afresh: a worker cancelled by anything but its stop (a
        `CancelledError` leaking out of a client's call) too, never a partition whose
        cycles stopped while its task looks as if it runs."""
        if self._stopped:
            return
        if worker.cancelled():
            exc: BaseException = RuntimeError("the worker was cancelled, not stopped")
        else:
            exc = worker.exception() or RuntimeError("the worker returned")
        logger.error("%s: its worker failed", self.key, exc_info=exc)
        self._on_failure(ITS_WORKER, exc)

    async def stop(self) -> bool:
        """Ends the worker and drops what was queued or kept for it (read again after a
        take); whether a cycle was cut short. Every caller waits for the worker's end: a
        close must not commit before a cycle cut short has thrown its half away."""
        self._stopped = True
        self._worker.cancel()  # nothing, if it ended
        await asyncio.wait([self._worker])
        if not self._worker.cancelled():
            self._worker.exception()  # seen (`_worker_ended` told the task, if it ran)
        while not self.queue.empty():
            self.queue.get_nowait()  # stale: read again after a take
        self.held.batches.clear()
        self.local = False
        self._timers_left = []
        return self.cut
