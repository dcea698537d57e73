"""`Round`: one round of the runner between its claims and its sends, as `TimerRunner.round`
hands it to a node: the node commits the claims of the partitions it names, says which
committed, and only those are sent when the round ends. A fenced owner can commit no
claim, so it sends nothing."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from app.timers.runner.decisions import Decision
from app.timers.runner.stats import RoundStats
from tables.timer import Timer

__all__ = ["Round"]


@dataclass
class Round:
    stats: RoundStats
    now: int
    owned: frozenset[int]
    remote: list[Timer] = field(default_factory=list)
    """Claimed and written (their partitions' transactions hold the claims), not sent."""
    in_process: frozenset[int] = frozenset()
    """The partitions with timers claimed to fire in-process: their cycles take them
    (`TimerRunner.in_process_due`)."""
    handed: int = 0
    committed: set[int] = field(default_factory=set)
    tasks: list[asyncio.Task[Decision]] = field(default_factory=list)

    @property
    def to_commit(self) -> frozenset[int]:
        """The partitions whose claims must commit before their commands leave."""
        return frozenset(t.partition for t in self.remote)

    def claims_committed(self, partitions: frozenset[int] | set[int]) -> None:
        """The claims of `partitions` are committed: their commands may leave."""
        self.committed |= partitions
