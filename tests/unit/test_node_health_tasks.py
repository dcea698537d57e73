"""`/healthz` of a node of several types (`node_health`): one task per type and
partition, what it says of the partitions. A partition of which one type's task runs and
another type's, given by the group, does not, is not well."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from app.node.commits import COMMIT_DEADLINE_S
from app.node.failing import FailingPartitions
from app.node.health import MAX_COMMIT_LAG_S, node_health
from app.node.partition_task import PartitionTask
from app.node.task_id import TaskId
from app.node.task_state import TaskState

A, B = TaskId("shop.order", 1), TaskId("shop.cart", 1)


@dataclass
class Task:
    """What `node_health` reads of a task."""

    taking: bool = False
    broken: str | None = None
    failing: FailingPartitions = field(default_factory=FailingPartitions)
    state: TaskState = TaskState.CREATED
    rounds_failing: bool = False


def health(
    tasks: dict[TaskId, Task], running: set[TaskId], given: set[TaskId], **more: Any
) -> dict[str, Any]:
    """`running`: those of `tasks` whose state is RUNNING; `failing_loops`: those whose
    timer rounds keep failing."""
    for key, task in tasks.items():
        task.state = TaskState.RUNNING if key in running else task.state
        task.rounds_failing = key in more.get("failing_loops", ())
    return node_health(
        cast(dict[TaskId, PartitionTask], tasks),
        closing=more.get("closing", {}),
        given=given,
        suspended=None,
        broker={"reachable": True},
        commit_lags=more.get("commit_lags", {}),
        failure=None,
        answered=more.get("answered", True),
    )


def test_a_partition_is_ready_when_every_types_task_of_it_runs() -> None:
    body = health({A: Task(), B: Task()}, {A, B}, {A, B})
    assert body["ready"] and body["owned"] == [1] and body["stalled"] == {}


def test_a_types_partition_given_and_not_taken_stalls_it_while_another_type_runs() -> None:
    body = health({A: Task()}, {A}, {A, B})
    assert body["owned"] == [1] and not body["ready"]
    assert body["stalled"] == {"1": "assigned by the group, not taken"}


def test_a_types_partition_being_taken_makes_it_restoring() -> None:
    body = health({A: Task(), B: Task(taking=True)}, {A}, {A, B})
    assert body["restoring"] == [1] and body["owned"] == [1] and not body["ready"]


def test_a_close_of_a_type_no_longer_given_here_does_not_stall_the_partition() -> None:
    """B's p moved to another node while A's stays: B's close under way is no retake."""
    body = health({A: Task()}, {A}, {A}, closing={B: 2.5})
    assert body["ready"] and body["stalled"] == {} and body["closing"] == {"1": 2.5}


def test_a_close_of_a_type_given_back_stalls_the_partition_until_it_is_done() -> None:
    body = health({A: Task()}, {A}, {A, B}, closing={B: 2.5})
    assert body["stalled"] == {"1": "closing for 2.5 s: taken again once closed"}


def test_a_types_failing_timer_rounds_stall_only_its_partitions() -> None:
    c, d = TaskId("shop.cart", 2), TaskId("shop.cart", 3)
    body = health({A: Task(), c: Task(), d: Task()}, {A, c, d}, {A, c, d}, failing_loops={c})
    assert body["stalled"] == {"2": "shop.cart: timer rounds failing"}


def test_a_commit_waiting_too_long_makes_it_not_ready_and_says_why() -> None:
    """Said by the node itself: the page, the node report and the cluster's status read
    it (only `/readyz` applied it, and the page said "ready" beside a 503)."""
    assert health({A: Task()}, {A}, {A}, commit_lags={1: 1.5})["ready"]
    body = health({A: Task()}, {A}, {A}, commit_lags={1: MAX_COMMIT_LAG_S * 2})
    assert not body["ready"]
    assert body["not_ready"] == (
        f"partition 1: the oldest write waiting to commit is {MAX_COMMIT_LAG_S * 2:.1f} s old "
        f"(more than {MAX_COMMIT_LAG_S:g} s; given up at {COMMIT_DEADLINE_S:g} s)"
    )


def test_a_node_the_group_has_not_answered_is_not_ready() -> None:
    """Before its first assignment, and from a rebalance's revoke to its assignment, it
    owns nothing and nothing is given: it said ready (a rollout went on meanwhile)."""
    body = health({}, set(), set(), answered=False)
    assert not body["ready"] and body["owned"] == []
    assert body["not_ready"] == "waiting for the group to give this node its partitions"
    # Answered with nothing to give (more workers than partitions): ready, idle.
    assert health({}, set(), set())["ready"]
