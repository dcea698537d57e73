"""The node's timer loop (`NodeTimerLoop`): the node drives its runner's rounds, so that
the runner never calls back into the node. Each round, the partitions with timers
claimed to fire in-process have their cycles woken (each cycle asks its partition's
firing for them, `TimerRunner.in_process_due`, and decides them with its commands, in
its transaction), and the claims of remote timers are committed, partition by partition,
before the runner is told it may send them (`Round.claims_committed`). A partition whose
store failed in the round (`Round.failed`: a corrupt row) fails its task alone, which
closes dirty and is revived (its local copy restored from its changelog)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from app.node.commits import Commits
from app.node.cycles import PartitionCycles
from app.node.kept import KeptType
from app.protocol.topics import AggregateTopics
from app.timers.runner import (
    InProcessTargets,
    PartitionFiring,
    Round,
    RoundStats,
    TimerLoop,
    TimerRunner,
)
from app.timers.runner.slow_start import HELD_AT_MOST_MS

__all__ = ["FiringTask", "NodeTimerLoop", "in_process_targets"]

logger = logging.getLogger(__name__)


def in_process_targets(topics: AggregateTopics, partitions: int) -> InProcessTargets:
    """The targets a node decides itself in a partition of type `topics` whose commands
    it decides: its aggregates there (a timer's owner, by default)."""
    return InProcessTargets(topics.context, topics.aggregate, partitions)


class FiringTask(Protocol):
    """The task running a partition, as its type's timer loop sees it (`PartitionTask`)."""

    @property
    def firings(self) -> Mapping[str, PartitionFiring]:
        """Per type, its partition's firing (held from its start to its close)."""
        ...

    def failed(self, what: str, exc: BaseException) -> None:
        """Its work failed: it is closed dirty and taken afresh."""
        ...


class NodeTimerLoop(TimerLoop):
    """A type's timer loop in a node (`type_name`, found in `types` once it is kept);
    `running`: the task running each partition."""

    def __init__(
        self,
        runner: TimerRunner,
        *,
        type_name: str,
        types: Mapping[str, KeptType],
        commits: Commits,
        cycles: PartitionCycles,
        running: Mapping[int, FiringTask],
        on_round: Callable[[RoundStats], None] | None = None,
    ) -> None:
        super().__init__(runner, on_round)
        self._type_name = type_name
        self._running = running
        self._types = types
        self._commits = commits
        self._cycles = cycles
        # A burst under way (`TimerRunner.bursting`): of each partition that fires its
        # timers in-process, its commits landed when the burst first reached it; and
        # whether one has landed since.
        self._landed_before: dict[int, int] = {}
        self._landed = False
        self._began = 0

    def _burst_may_grow(self) -> bool:
        """Whether the burst's slice may double (`slow_start`): once the first of its
        commits landed (its first timers fired), not before, so that the round trips of
        those commits never wait behind a turn of the loop grown large; or once it was
        held `HELD_AT_MOST_MS` (a slow broker). Claims of timers sent, not fired here,
        commit within the round: nothing to wait for."""
        if not self._runner.bursting:
            self._landed_before.clear()
            self._landed = False
            self._began = self._clock.now()  # a burst that begins at this round, if one
            return True
        kept = self._types.get(self._type_name)
        if self._landed or kept is None or not self._landed_before:
            return True
        self._landed = any(
            self._commits.landed(kept, p) > before for p, before in self._landed_before.items()
        )
        return self._landed or self._clock.now() - self._began >= HELD_AT_MOST_MS

    async def round(self) -> RoundStats:
        async with self._runner.round(grow=self._burst_may_grow()) as r:
            for p in sorted(r.in_process):
                self._cycles.fire_local(self._type_name, p)
            if self._runner.bursting and (kept := self._types.get(self._type_name)):
                # Before p's cycle can run (no await since its wake-up): a commit of it
                # that lands from now on is one of the burst's.
                for p in r.in_process - self._landed_before.keys():
                    self._landed_before[p] = self._commits.landed(kept, p)
            for p in sorted(r.to_commit):
                # A fenced owner commits no claim: it sends nothing. One partition's
                # failure (its task is reset) holds no other's sends up.
                try:
                    await self._commits.commit_claims(self._types[self._type_name], {p})
                except Exception as exc:
                    logger.warning("partition %d: claims not committed, none sent: %s", p, exc)
                else:
                    r.claims_committed({p})
        self._fail_tasks(r)
        return r.stats

    def _fail_tasks(self, r: Round) -> None:
        """The tasks whose firing the store failed in: each closed dirty and revived, its
        local copy dropped and restored from its changelog; no other task is touched."""
        for p, (firing, exc) in sorted(r.failed.items()):
            task = self._running.get(p)
            if task is not None and task.firings.get(self._type_name) is firing:
                task.failed(f"the timer store of {self._type_name}", exc)
