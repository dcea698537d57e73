"""`Round`: one round of the runner between its claims and its sends, as `TimerRunner.round`
hands it to a node: the node commits the claims of the partitions it names, says which
committed, and only those are sent when the round ends. A fenced owner can commit no
claim, so it sends nothing. A partition whose store failed in it (`failed`) is for its
owner to let go and restore: the round claimed nothing more of it."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

from app.timers.runner.decision_types import Decision
from app.timers.runner.partition import PartitionFiring
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
    firings: Mapping[int, PartitionFiring] = field(default_factory=dict)
    """The partitions' firings as the round began (those it claims from)."""
    failed: dict[int, tuple[PartitionFiring, BaseException]] = field(default_factory=dict)
    """By partition, each firing the store failed in (`PartitionFiring.fault`), as the
    round ended: its owner lets it go (a node's task of it closes dirty, is revived)."""

    @property
    def to_commit(self) -> frozenset[int]:
        """The partitions whose claims must commit before their commands leave."""
        return frozenset(t.partition for t in self.remote)

    def claims_committed(self, partitions: frozenset[int] | set[int]) -> None:
        """The claims of `partitions` are committed: their commands may leave."""
        self.committed |= partitions
