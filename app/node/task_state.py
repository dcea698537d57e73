"""A partition task's states and the transitions allowed between them, in one place.

Kafka Streams' task model: a task is created when the group gives its partition here,
restores (fences the previous owner, folds the log, restores the timer table), runs,
and is suspended and closed when the partition goes (revoked: closed clean if it ran) or
when its own work fails (closed dirty, then revived: created again and taken afresh).
Pure: no I/O; `transition` is the only way a task's state changes, and `closes_clean`
says whether a close may commit and mark the local copy clean.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

__all__ = ["ALLOWED", "IllegalTransition", "TaskState", "closes_clean", "transition"]


class TaskState(enum.Enum):
    CREATED = "created"
    RESTORING = "restoring"
    RUNNING = "running"
    SUSPENDED = "suspended"
    CLOSED = "closed"


ALLOWED: Mapping[TaskState, frozenset[TaskState]] = {
    # Taken: restoring; or let go before its take began (through suspended, as all closes).
    TaskState.CREATED: frozenset({TaskState.RESTORING, TaskState.SUSPENDED}),
    # Restored: runs; a take that fails or is revoked half done is suspended and closed.
    TaskState.RESTORING: frozenset({TaskState.RUNNING, TaskState.SUSPENDED}),
    TaskState.RUNNING: frozenset({TaskState.SUSPENDED}),
    # Nothing resumes a suspended task: it is closed, and revived if it is to run again
    # (nothing of its local copy is trusted after a failure).
    TaskState.SUSPENDED: frozenset({TaskState.CLOSED}),
    # Revived: created again, to be taken afresh.
    TaskState.CLOSED: frozenset({TaskState.CREATED}),
}


class IllegalTransition(ValueError):
    """A task was asked to go where its state machine does not lead (a bug)."""


def transition(current: TaskState, target: TaskState) -> TaskState:
    """`target`, if a task in `current` may go there; else `IllegalTransition`."""
    if target not in ALLOWED[current]:
        raise IllegalTransition(f"a task {current.value} cannot become {target.value}")
    return target


def closes_clean(current: TaskState, asked: bool) -> bool:
    """Whether a task in `current`, `asked` to close clean, commits what its transactions
    hold and marks its local copy clean. Only a running task's copy is whole: a take cut
    short (created, restoring) may not have restored it yet (the copy may be a dirty one,
    to be dropped), and a suspended task's work failed; both close dirty."""
    return asked and current is TaskState.RUNNING
