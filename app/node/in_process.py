"""A type's timer loop in a node (`NodeTimerLoop`): the node drives its runner's rounds, so
that the runner never calls back into the node. It runs no round of its own: each
partition task drives its own partition's rounds (`PartitionTimerLoop`, started by the
task's `start_firing`), so that one partition's store calls, burst or commits hold no
other partition's timers up. What it keeps is the type's view of them: it starts and
stops them with the node, wakes them, and says whether they fail (`/healthz`) and how
many rounds they ran."""

from __future__ import annotations

import asyncio
import logging

from app.node.partition_timers import FiringTask, PartitionTimerLoop, TypeLoops
from app.protocol.topics import AggregateTopics
from app.timers.runner import InProcessTargets, PartitionFiring

__all__ = ["FiringTask", "NodeTimerLoop", "TypeLoops", "in_process_targets"]

logger = logging.getLogger(__name__)


def in_process_targets(topics: AggregateTopics, partitions: int) -> InProcessTargets:
    """The targets a node decides itself in a partition of type `topics` whose commands
    it decides: its aggregates there (a timer's owner, by default)."""
    return InProcessTargets(topics.context, topics.aggregate, partitions)


class NodeTimerLoop:
    """The timer loops of the type of `shared`, one per partition task firing it."""

    def __init__(self, shared: TypeLoops) -> None:
        self._shared = shared
        # Each partition's loop, from its task's start_firing until another replaces it.
        self._loops: dict[int, PartitionTimerLoop] = {}
        # Those replaced or ended, until they are done (the node's stop waits for them).
        self._ending: set[PartitionTimerLoop] = set()
        self._ended_rounds = 0
        self._started = False

    @property
    def running(self) -> bool:
        return self._started

    @property
    def rounds(self) -> int:
        """Rounds its partitions' loops ran, all told."""
        loops = [*self._loops.values(), *self._ending]
        return self._ended_rounds + sum(loop.rounds for loop in loops)

    def start(self) -> None:
        """The node runs: its partitions' loops run (those started already, and those
        started from now on)."""
        self._started = True
        for loop in self._loops.values():
            loop.start()

    async def stop(self, within: float | None = None) -> None:
        """Ends every partition's loop after its round in progress, and waits for them, at
        once: `within` seconds at most (None: as long as they take), then the rounds still
        in progress are cancelled (one may wait on a ledger write, 10 s each, queued) and
        given a second more; one that does not end even then is left to end by itself
        (said in a warning), its firing stopped already."""
        self._started = False
        loops = [*self._loops.values(), *self._ending]
        if not loops:
            return
        stops = [asyncio.ensure_future(loop.stop()) for loop in loops]
        for stop in stops:  # one left running is read when it ends (no "never retrieved")
            stop.add_done_callback(_read)
        _, late = await asyncio.wait(stops, timeout=within)
        for stop in late:
            stop.cancel()  # and its loop's task, which it awaits
        if late:
            _, stuck = await asyncio.wait(late, timeout=1.0)
            logger.warning(
                "%d timer loop(s) not ended within %.1f s: cut short%s",
                len(late),
                within,
                f" ({len(stuck)} not even then)" if stuck else "",
            )
        self._ending.clear()

    def wake(self, *, reload: bool = True) -> None:
        """Runs every partition's next round now (`PartitionTimerLoop.wake`)."""
        for loop in self._loops.values():
            loop.wake(reload=reload)

    def wake_partition(self, p: int, *, reload: bool = True) -> None:
        """Runs p's next round now (puts offered to its wheel: `reload=False`)."""
        if (loop := self._loops.get(p)) is not None:
            loop.wake(reload=reload)

    def start_partition(self, task: FiringTask, firing: PartitionFiring) -> PartitionTimerLoop:
        """The loop of `task`'s partition firing `firing`, running while the node runs; one
        of an earlier firing of it is ended (it ends by itself once its firing stopped)."""
        p = firing.partition
        loop = self._loops.get(p)
        if loop is not None and loop.firing is firing:
            loop.wake()
            return loop
        if loop is not None:
            self._end(loop)
        self._loops[p] = loop = PartitionTimerLoop(self._shared, firing, task)
        if self._started:
            loop.start()
        return loop

    def end_partition(self, loop: PartitionTimerLoop) -> None:
        """Ends a partition's loop (its task closes), not waited for: a round in progress
        finds its firing stopped and claims, sends and sweeps nothing more of it."""
        if self._loops.get(loop.p) is loop:
            del self._loops[loop.p]
        self._end(loop)

    def _end(self, loop: PartitionTimerLoop) -> None:
        loop.end()
        if not loop.running:
            self._ended_rounds += loop.rounds
            return
        self._ending.add(loop)

        def ended(_: object) -> None:
            if loop in self._ending:
                self._ending.discard(loop)
                self._ended_rounds += loop.rounds

        loop.when_done(ended)


def _read(stop: asyncio.Future[None]) -> None:
    """A timer loop's stop ended: what it raised is logged."""
    if not stop.cancelled() and (exc := stop.exception()) is not None:
        logger.warning("a timer loop's stop failed: %r", exc)
