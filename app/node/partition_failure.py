"""A failed task let go (`let_go`, the rest of `PartitionTask.failed` once p is suspended):
the node told, the failure noted (`FailingPartitions`) and p's reading paused; then, unless
the group takes p away, a refusal of another context's topic noted for the retake to
answer, the limits read again before a retake after a refusal as too large, and p taken
afresh (`retake_after`; a fenced one after the session's wait), or the node failed for a
refusal no retake passes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.kafka.records import too_large
from app.node.failing import refused_elsewhere, refused_for_good, retake_after
from app.node.kept import node_topics
from app.node.opening import written_topics

if TYPE_CHECKING:
    from app.node.partition_task import PartitionTask

__all__ = ["let_go"]


def let_go(task: PartitionTask, what: str, exc: BaseException, fenced: bool) -> None:
    """The rest of `PartitionTask.failed`, p suspended and no longer running: its reading
    paused, and its retake begun (or the node failed, for a refusal no retake passes)."""
    s = task.shared
    task.manager.task_failed(task)
    at = {} if task.input is None else task.input.failed_at
    failing = task.failing.failed(task.p, at, f"{what}: {exc}", what)
    task.broken = failing.describe()
    mine = task.given()
    s.consumer.pause(mine)
    if task.leaving:
        return  # being revoked: closed dirty there (it is suspended), never taken again
    own = {spec.name for spec in node_topics([k.topics for k in s.types.values()], 1)}
    # Another context's topic refused: the retake answers the commands to it ERROR.
    s.targets.writes_refused(refused_elsewhere(exc, own), str(exc))
    if too_large(exc) and task.transaction is not None:
        # Its topics' limits and those of the others the refused commit wrote (another
        # type's or context's commands) are read again before its producer is made.
        wrote = task.transaction.unlanded_topics()
        task.kept.batch_topics.update(wrote.difference(written_topics(task.kept.topics)))
        task.limits_doubtful = True
    if refused_for_good(exc, own):
        task.manager.fail(f"{task.key}: {what} was refused (an ACL this node needs): {exc}")
        return
    delay = 2 * s.settings.session_timeout_ms / 1000 if fenced else retake_after(failing)
    task.take({t for t, _ in mine}, after_failure=delay)
