"""What names a partition task (`TaskId`): its aggregate type and its partition. Pure, no
imports of the node's: every module keyed by task (the tasks' maps, the commits, the
cycles, the poll loop) may import it."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["TaskId"]


class TaskId(NamedTuple):
    """A partition task's name: one task per aggregate type and partition the node owns.
    Co-partitioned, the group gives the same p of every type's topics to one node, but
    each type's p is a task of its own, its faults its own."""

    type_name: str
    p: int

    def __str__(self) -> str:
        return f"partition {self.p} of {self.type_name}"
