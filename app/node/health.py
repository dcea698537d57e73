"""What `/healthz` says of a node, read from its partition tasks' states (one task per
type and partition; what it says is of the partitions, as before: a partition is
restoring while a task of it is taken, stalled while one is). Pure: the node hands over
what it sees (its tasks, the group's assignment, the broker, the clock's gaps, its
followers' failing polls) and gets the body back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.node.commits import COMMIT_DEADLINE_S
from app.node.partition_task import PartitionTask
from app.node.task_id import TaskId
from app.node.task_state import TaskState

__all__ = ["FAILING_IN_A_ROW", "FOLLOWER_FAILING_S", "MAX_COMMIT_LAG_S", "node_health", "oldest"]

FAILING_IN_A_ROW = 3
"""A partition failing this many times in a row at the same offsets makes the node not ready."""
FOLLOWER_FAILING_S = 5.0
"""A follower the node depends on whose polls have failed this long, none passing, makes
the node not ready (its remote sends' results, or the ledger's other writers, go unread):
longer than a poll or two that a broker's blip fails, far below `POLL_FAILING_S`, past
which the node stops."""


MAX_COMMIT_LAG_S = COMMIT_DEADLINE_S / 2
"""Readiness fails when a partition's oldest commit not landed is older than this (the
commits run every `TICKWHEEL_COMMIT_INTERVAL_MS`; one pending this long is stuck): half the
commit's deadline, past which it is given up and the partition let go, so that a stuck
commit shows first (at 60 s, above the deadline, it never showed)."""


def oldest(*lags: Mapping[int, float]) -> dict[int, float]:
    """Per partition, the longest of its commit lags in any of `lags`."""
    out: dict[int, float] = {}
    for each in lags:
        for p, lag in each.items():
            out[p] = max(out.get(p, 0.0), lag)
    return out


def node_health(
    tasks: Mapping[TaskId, PartitionTask],
    *,
    closing: Mapping[TaskId, float],
    given: set[TaskId] | None,
    suspended: float | None,
    broker: dict[str, Any],
    commit_lags: Mapping[int, float],
    failure: str | None,
    following: Mapping[str, tuple[float, str]] | None = None,
    answered: bool = True,
    topics: Mapping[str, list[str]] | None = None,
) -> dict[str, Any]:
    """Ready only while every type's partition given to this node runs: not while one is
    restored, was let go on a failure and not taken again yet, or its firing loop keeps
    failing; nor when the node failed for good. What it says is of the partitions: p is
    owned while a task of it runs (its state RUNNING), and restoring or stalled while one
    of its types' is.

    `closing`: how long each task's close under way (a revoke's, or the group's assignment
    no longer giving it) has been going; `given`: the tasks of the group's assignment
    (None: not in the group yet); `suspended`: how long the process was stopped, if the
    group has not answered since; `following`: the followers the node depends on (each
    context's results reader and ledger) whose polls fail, none passing, each with how long
    and the last error, said as `followers_failing` (`{"for_s", "error"}` by follower): one
    failing `FOLLOWER_FAILING_S` or longer makes the node not ready (past `POLL_FAILING_S`
    it fails); `answered`: whether the group has given this node its partitions since it
    joined or a rebalance began (until then it owns nothing it can tell, and is not ready:
    a rollout would go on while nothing is worked). `commit_lags`: per partition, how long
    its oldest commit not landed has been going (said as the longest, `commit_lag_s`); one
    longer than `MAX_COMMIT_LAG_S` makes it not ready, `not_ready` naming the partitions.
    `topics`: what is wrong with the replication of each topic found so at the start, or
    at a check since (`app.node.topic_watch`, every minute: gone once fixed), said as
    `topics` (`app.kafka.replication`), and a partition count found not the node's since;
    it does not make the node not ready (it runs as well, less safely)."""
    running = frozenset(key for key, task in tasks.items() if task.state is TaskState.RUNNING)
    stalled: dict[int, str] = {}
    failing: dict[int, dict[str, object]] = {}
    for (_, p), task in sorted(tasks.items()):
        if task.broken is not None:
            stalled.setdefault(p, task.broken)
        # A held partition says so whether or not it is being taken again: it is what an
        # operator needs to know (the message names the failure too).
        stalled.update(task.failing.stalled())
        failing.update({int(q): f for q, f in task.failing.report().items()})
    taking = {key for key, task in tasks.items() if task.taking}
    if suspended is not None:
        for key in sorted(running | taking):
            stalled.setdefault(
                key.p, f"the process was stopped for {suspended:.1f} s: waiting for the group"
            )
    # Given (back) by the group, and closing still: taken once its close is done.
    for key in sorted((given or set()) & set(closing)):
        stalled.setdefault(key.p, f"closing for {closing[key]:.1f} s: taken again once closed")
    # Given by the group but neither worked on nor being taken: nobody runs it.
    for key in sorted((given or set()) - running - taking):
        stalled.setdefault(key.p, "assigned by the group, not taken")
    for key in sorted(running):
        if tasks[key].rounds_failing:
            stalled.setdefault(key.p, f"{key.type_name}: timer rounds failing")
    closes: dict[int, float] = {}
    for (_, p), seconds in closing.items():
        closes[p] = max(closes.get(p, 0.0), seconds)
    restoring = sorted({key.p for key in taking})
    commit_lag_s = max(commit_lags.values(), default=0.0)
    body: dict[str, Any] = {
        "owned": sorted({key.p for key in running}),
        "restoring": restoring,
        "stalled": {str(p): why for p, why in sorted(stalled.items())},
        "broker": broker,
        "commit_lag_s": round(commit_lag_s, 3),
        "ready": bool(broker["reachable"]) and not restoring and not stalled and failure is None,
    }
    if body["ready"] and not answered:
        body["ready"] = False
        body["not_ready"] = "waiting for the group to give this node its partitions"
    late = sorted(p for p, lag in commit_lags.items() if lag > MAX_COMMIT_LAG_S)
    if body["ready"] and late:
        body["ready"] = False
        body["not_ready"] = (
            f"{_partitions(late)}: the oldest write waiting to commit is {commit_lag_s:.1f} s old "
            f"(more than {MAX_COMMIT_LAG_S:g} s; given up at {COMMIT_DEADLINE_S:g} s)"
        )
    if failing:
        body["failing"] = {str(p): f for p, f in sorted(failing.items())}
        # Failing again and again at the same place, even between takes that look fine:
        # not ready, whatever else holds.
        if any(t.failing.again_and_again(FAILING_IN_A_ROW) for t in tasks.values()):
            body["ready"] = False
    if following:
        body["followers_failing"] = {
            what: {"for_s": round(seconds, 3), "error": error}
            for what, (seconds, error) in sorted(following.items())
        }
        if max(seconds for seconds, _ in following.values()) >= FOLLOWER_FAILING_S:
            body["ready"] = False
    if closes:
        body["closing"] = {str(p): round(s, 3) for p, s in sorted(closes.items())}
    if suspended is not None:
        body["suspended_s"] = round(suspended, 3)
    if topics:
        body["topics"] = {topic: list(faults) for topic, faults in sorted(topics.items())}
    if failure is not None:
        body["failed"] = failure
    return body


def _partitions(ps: list[int], shown: int = 10) -> str:
    """`ps` named: "partition 3", "partitions 1, 3", the first `shown` and how many more."""
    if len(ps) == 1:
        return f"partition {ps[0]}"
    more = f" and {len(ps) - shown} more" if len(ps) > shown else ""
    return "partitions " + ", ".join(str(p) for p in ps[:shown]) + more
