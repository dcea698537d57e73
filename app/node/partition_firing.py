"""A task's timer firing: started as it runs, unless it is held since a failure
(`start_firing`: p's firing from its type's runner, its store calls through p's handle, in
rounds of p's own), started again once its log is read past the failure (`read_past`),
and its loop ended by its close (`end_timer_loop`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from app.node.in_process import in_process_targets
from app.node.task_state import TaskState
from app.timers.runner.partition_store import PartitionStore

if TYPE_CHECKING:
    from app.node.partition_task import PartitionTask

__all__ = ["end_timer_loop", "read_past", "start_firing"]

logger = logging.getLogger("app.node.partition_task")


def start_firing(task: PartitionTask) -> None:
    """p's timers of its type fire from now on: those whose targets p decides itself
    in-process, in its cycles (`in_process_targets`), the others sent; in rounds of
    p's own (`PartitionTimerLoop`), which no other partition's hold up."""
    kept = task.kept
    partitions = task.shared.settings.partitions
    local = task.processor is not None
    in_process = in_process_targets(kept.topics, partitions) if local else None
    # Its store calls through p's own handle: refused once p is let go.
    store = None if task.store is None else PartitionStore(task.store)
    firing = kept.runner.start_partition(
        task.p, in_process=in_process, store=store, check_named=True
    )
    task.firing = firing
    firing.unparked.note(task.unparked_early)
    task.unparked_early = []
    task.timer_loop = kept.loop.start_partition(task, firing)


def read_past(task: PartitionTask, done: dict[str, int]) -> None:
    """A cycle of p staged: a task held since a failure fires again once its log was
    read past where the failure was."""
    commits = task.commits  # the cycle is carried by the next commit to start
    carried_by = commits.landed + (2 if commits.running() is not None else 1)
    if task.failing.read(task.p, done, carried_by) and task.state is TaskState.RUNNING:
        logger.info("%s: its log read past its failure, firing again", task.key)
        task.start_firing()


def end_timer_loop(task: PartitionTask) -> None:
    """Its timer loop ends (not waited for: a round in progress finds its firing
    stopped by the close and does nothing more of it)."""
    if (loop := task.timer_loop) is not None:
        if (kept := task.shared.types.get(task.type_name)) is not None:
            kept.loop.end_partition(loop)
        else:
            loop.end()
    task.timer_loop = None
