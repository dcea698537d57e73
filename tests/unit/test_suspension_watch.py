"""A process stopped past the group's session timeout is not ready until the group answers,
or until a session timeout after waking passes with no rebalance begun (the broker had not
expired the member: no rebalance ever comes)."""

from __future__ import annotations

from app.node.suspension import CONFIRM_S, SuspensionWatch


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def ticking(watch: SuspensionWatch, clock: Clock, seconds: float) -> None:
    """The watch ticks every 0.1 s for `seconds`."""
    for _ in range(round(seconds * 10)):
        clock.now += 0.1
        watch.observe()


def started() -> tuple[SuspensionWatch, Clock]:
    clock = Clock()
    watch = SuspensionWatch(6_000, clock=clock)
    watch.observe()  # the watch's first tick: it runs
    return watch, clock


def test_ticks_within_the_session_timeout_are_no_stop() -> None:
    watch, clock = started()
    ticking(watch, clock, 10.0)
    assert watch.suspended() is None


def test_a_stop_is_read_on_waking_before_the_watch_ticks() -> None:
    watch, clock = started()
    clock.now += 9.0
    assert watch.suspended() == 9.0
    watch.observe()
    assert watch.suspended() == 9.0


def test_the_groups_answer_ends_it() -> None:
    watch, clock = started()
    clock.now += 9.0
    watch.observe()
    watch.group_rebalancing()
    watch.group_answered()
    assert watch.suspended() is None


def test_a_heartbeats_request_timeout_after_waking_with_no_rebalance_ends_it() -> None:
    """The tasks hunt's case: readiness stayed "suspended" until the next rebalance. Not
    sooner (a review): a dead connection's heartbeat answers only after its request
    timeout, and an expelled member hears of it only then."""
    watch, clock = started()
    clock.now += 6.5
    watch.observe()
    ticking(watch, clock, CONFIRM_S - 0.1)
    assert watch.suspended() == 6.5
    ticking(watch, clock, 0.2)
    assert watch.suspended() is None


def test_a_rebalance_begun_after_waking_waits_for_the_groups_answer() -> None:
    watch, clock = started()
    clock.now += 9.0
    assert watch.suspended() == 9.0
    watch.group_rebalancing()  # before the watch's own tick after waking
    watch.observe()
    ticking(watch, clock, 60.0)
    assert watch.suspended() == 9.0
    watch.group_answered()
    assert watch.suspended() is None


def test_a_rebalance_before_the_stop_does_not_hold_the_next_one() -> None:
    watch, clock = started()
    watch.group_rebalancing()  # not suspended: nothing to wait for
    clock.now += 7.0
    watch.observe()
    ticking(watch, clock, CONFIRM_S + 0.1)
    assert watch.suspended() is None
