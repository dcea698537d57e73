"""A partition task's state machine (`app.node.task_state`): no illegal transition is ever
accepted, and every legal lifecycle stays possible."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.node.task_state import ALLOWED, IllegalTransition, TaskState, closes_clean, transition

C, R, RUN, S, X = (
    TaskState.CREATED,
    TaskState.RESTORING,
    TaskState.RUNNING,
    TaskState.SUSPENDED,
    TaskState.CLOSED,
)

# The lifecycle the node relies on, written out here independently of the table: taken
# (restoring, running), let go through suspended to closed, revived (created again).
LEGAL = {(C, R), (C, S), (R, RUN), (R, S), (RUN, S), (S, X), (X, C)}

states = st.sampled_from(list(TaskState))


@settings(max_examples=200, deadline=None)
@given(states, states)
def test_a_transition_is_accepted_exactly_when_the_lifecycle_allows_it(
    current: TaskState, target: TaskState
) -> None:
    if (current, target) in LEGAL:
        assert transition(current, target) is target
    else:
        with pytest.raises(IllegalTransition):
            transition(current, target)


@settings(max_examples=300, deadline=None)
@given(st.lists(states, max_size=40))
def test_no_sequence_of_requests_leaves_the_lifecycle(requests: list[TaskState]) -> None:
    """Whatever a task is asked, in any order: it runs only after restoring, is closed only
    after being suspended, and is created again only from closed; a refused request leaves
    it where it was."""
    state = C
    path = [state]
    for target in requests:
        try:
            state = transition(state, target)
        except IllegalTransition:
            assert path[-1] is state
            continue
        path.append(state)
    for before, after in itertools.pairwise(path):
        assert (before, after) in LEGAL
        if after is RUN:
            assert before is R
        if after is X:
            assert before is S
        if after is C:
            assert before is X


@settings(max_examples=100, deadline=None)
@given(states)
def test_every_state_can_be_closed_and_a_closed_task_revived_to_run(start: TaskState) -> None:
    """No dead end: from anywhere a task can be closed (a fault, a revoke), and from closed
    it can be revived and run again."""

    def reachable(src: TaskState) -> set[TaskState]:
        seen, todo = {src}, [src]
        while todo:
            for nxt in ALLOWED[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    assert X in reachable(start) or start is X
    assert RUN in reachable(X)


@settings(max_examples=300, deadline=None)
@given(st.lists(states, max_size=40), st.booleans())
def test_only_a_task_that_ran_closes_clean(requests: list[TaskState], asked: bool) -> None:
    """Wherever a lifecycle stands when its task is closed, the close commits and marks the
    local copy clean only if the task was running (a take that got there restored it) and
    was asked to: a take cut short, or a task whose work failed, closes dirty."""
    state = C
    restored = False  # a running task passed through restoring to get there
    for target in requests:
        try:
            before, state = state, transition(state, target)
        except IllegalTransition:
            continue
        restored = (before, state) == (R, RUN) or (restored and state is RUN)
    assert closes_clean(state, asked) == (asked and state is RUN)
    if closes_clean(state, asked):
        assert restored
