"""In-process firing: the runner's `LocalFirer` that hands a partition's timers aimed at
its own aggregates to the partition's cycles (`PartitionCycles.fire_local`)."""

from __future__ import annotations

from collections.abc import Callable

from app.node.cycles import PartitionCycles
from app.node.kept import KeptType
from tables import Timer
from tables.partitioner import partition_of

__all__ = ["InProcess"]


class InProcess:
    """The runner's `LocalFirer`: a timer whose target is an aggregate of the same type in
    the timer's own partition (the default: its owner) is decided by this node, in the
    partition's transaction, instead of a round trip through the command topic."""

    def __init__(
        self, cycles: PartitionCycles, kept: Callable[[], KeptType | None], partitions: int
    ) -> None:
        self._cycles = cycles
        self._kept = kept
        self._partitions = partitions

    def accepts(self, timer: Timer) -> bool:
        kept = self._kept()
        if kept is None or self._cycles.processor(kept.name, timer.partition) is None:
            return False
        target = timer.target
        if target.context != kept.topics.context or target.aggregate != kept.topics.aggregate:
            return False
        return target == timer.owner or (
            partition_of(target.id, self._partitions) == timer.partition
        )

    def fire(self, timers: list[Timer]) -> None:
        kept = self._kept()
        if kept is not None:
            self._cycles.fire_local(kept.name, timers)
