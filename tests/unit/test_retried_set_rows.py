"""A set written again under another event id at its version (a producer's retry that
writes the event anew) is its timer's set again: the row keeps the timer it holds and its
id (`tables.writes.put_row`, `rewritten`), whether the timer fired before the retry was
read (live) or not (a rebuild, which replays both sets before anything fires). Before, a
PENDING timer was replaced by the retry's: a rebuild's timer sent the command under a new
request id (`<retry id>#0`), which the target applied again instead of answering DUPLICATE.
Pure, so hypothesis holds the rule to every rule kind and body."""

from __future__ import annotations

from fakes import MIN, T0, TARGET, Rule, slot_timer
from hypothesis import given
from hypothesis import strategies as st

from app.timers.runner.options import DAY_MS
from tables.refs import AggregateRef
from tables.rules import CronRule, IntervalRule, OnceRule
from tables.slots import first_slot
from tables.timer import CommandSpec, Outcome, Timer, TimerStatus
from tables.writes import cancel_row, pause_row, put_row

rules: st.SearchStrategy[Rule] = st.one_of(
    st.builds(OnceRule, at=st.integers(T0, T0 + DAY_MS), jitter=st.sampled_from([None, 500])),
    st.builds(
        IntervalRule,
        start=st.integers(T0 - DAY_MS, T0),
        every=st.sampled_from([1000, MIN, 3_600_000]),
        coalesce=st.booleans(),
    ),
    st.builds(CronRule, expr=st.sampled_from(["*/5 * * * *", "0 * * * *"]), start=st.just(T0)),
)
commands = st.builds(
    CommandSpec,
    type=st.sampled_from(["Remind", "Run"]),
    body=st.dictionaries(st.sampled_from(["n", "slot"]), st.integers(0, 3), max_size=2),
)
targets = st.sampled_from([TARGET, AggregateRef(context="shop", aggregate="order", id="o-3")])


@st.composite
def sets(draw: st.DrawFn) -> tuple[Timer, Timer]:
    """A set (id evt-1) and its retry (id evt-1-retry) at version 3, each as the node
    builds it from its event: the retry's own time may differ, and so its first slot."""
    rule, command, target = draw(rules), draw(commands), draw(targets)

    def built(id: str) -> Timer:
        slot = first_slot(rule, draw(st.integers(T0 - DAY_MS, T0)))
        return slot_timer(rule, slot, id=id, version=3, command=command, target=target)

    return built("evt-1"), built("evt-1-retry")


def fired(timer: Timer) -> Timer:
    return timer.model_copy(update={"status": TimerStatus.FIRED, "outcome": Outcome.COMMITTED})


@given(sets())
def test_a_retried_set_keeps_the_timer_held_and_its_id(pair: tuple[Timer, Timer]) -> None:
    first, retry = pair
    assert put_row(None, first) == first
    # Read before the timer fired (a rebuild's replay; live, a retry read soon): kept.
    assert put_row(first, retry) is None
    # Read after it fired (live): passed over as well, as before.
    assert put_row(fired(first), retry) is None
    # Whichever of the two the log holds first is kept: a live node and a rebuild read
    # them in the log's order, so they keep the same one.
    assert put_row(retry, first) is None


@given(sets(), st.sampled_from(["rule", "target", "command"]), rules, commands)
def test_a_set_at_the_version_with_another_timer_replaces_it(
    pair: tuple[Timer, Timer], field: str, rule: Rule, command: CommandSpec
) -> None:
    """The key set twice in one command: the last set wins, unless it is the same timer."""
    first, retry = pair
    other: object = {
        "rule": rule,
        "target": AggregateRef(context="shop", aggregate="order", id="elsewhere"),
        "command": command.model_copy(update={"type": "Other"}),
    }[field]
    if getattr(first, field) == other:
        return
    second = retry.model_copy(update={field: other})
    assert put_row(first, second) == second


@given(sets())
def test_a_set_after_a_cancel_or_a_pause_in_one_command_replaces_it(
    pair: tuple[Timer, Timer],
) -> None:
    first, again = pair
    for held in (cancel_row(first, 3), pause_row(first, 3)):
        assert held is not None
        assert put_row(held, again) == again
    # A later set of the same timer is a new timer: it replaces the held one.
    later = again.model_copy(update={"version": 4})
    assert put_row(first, later) == later
