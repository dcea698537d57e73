"""What a node's partition tasks share (`TaskShared`), each touching only its own type's
partition of it, and what a task tells the node (`TaskManager`, which `PartitionTasks`
is)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from app.kafka import LogReader
from app.kafka.catalog import TopicCatalog
from app.kafka.ports import GroupMember
from app.node.cycles import PartitionCycles
from app.node.kept import KeptType
from app.node.metrics import NodeMetrics
from app.node.settings import Settings
from app.node.task_id import TaskId
from app.protocol.limits import InputLimits
from app.timers.sender import ResultsReader

if TYPE_CHECKING:
    from app.node.partition_task import PartitionTask

__all__ = ["TaskManager", "TaskShared"]


@dataclass
class TaskShared:
    """What the node's tasks share; each touches only its own type's partition of it."""

    settings: Settings
    limits: InputLimits
    types: Mapping[str, KeptType]
    # Each topic the consumer reads: its type and its kind ("events", "commands",
    # "timer-ops"); a task's topics are those of its type.
    by_topic: Mapping[str, tuple[KeptType, str]]
    consumer: GroupMember
    reader: LogReader
    results: Mapping[str, ResultsReader]
    cycles: PartitionCycles
    metrics: NodeMetrics
    now: Callable[[], int]
    # The cluster's topics: a command into a missing one is refused (NO_TARGET).
    targets: TopicCatalog
    # The task running each type's partition: the index every `owns` check reads (the
    # commits, the cycles, the poll loop), kept by the tasks as they start and stop running.
    running: dict[TaskId, PartitionTask]
    # How long a task's whole close may take (`Settings.close_deadline_s`: well below the
    # group's rebalance timeout, which a revoke's closes are held to).
    close_deadline_s: float
    # Whether the cluster still lets this node's clients in (`Admin.check_access`): a
    # take that failed asks, as a new connection's refused login or TLS handshake reaches
    # aiokafka's clients as "Unable to bootstrap" alone.
    check_access: Callable[[], Awaitable[None]]
    # Each timer changelog's `delete.retention.ms` as last read (None: not known): how
    # long a clean local copy of it is read on from (`app.node.copy_age`).
    tombstones_kept: Callable[[str], int | None] = lambda topic: None
    # Per partition, the types whose task reads its results (opened it, not closed yet):
    # the results readers read p while any does (each type's task of p adds it; the last
    # to close removes it).
    reading_results: dict[int, set[str]] = field(default_factory=dict)


class TaskManager(Protocol):
    """What a task tells the node (`PartitionTasks` is the task manager)."""

    def answered(self) -> asyncio.Event:
        """Set when the group next answers (an assignment): a retake waits for it."""
        ...

    def task_running(self, task: PartitionTask) -> None:
        """The task runs (taken, or taken again after a failure)."""
        ...

    def task_gone(self, task: PartitionTask) -> None:
        """The task was closed for good: the group gives its partition elsewhere now."""
        ...

    def task_failed(self, task: PartitionTask) -> None:
        """The task stopped running on a failure (it is taken afresh, or let go)."""
        ...

    def fail(self, why: str) -> None:
        """Stops the node loudly: it cannot do the work it was given."""
        ...
