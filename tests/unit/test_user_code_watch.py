"""The handler timeout's watch alone (`app.node.user_code_watch`): user code on the main
thread that blocks past the timeout is interrupted with `UserCodeTimeout`; one that ends
in time, or a signal arriving after it ended, raises nothing; and what the watch does at
each time (interrupt, end the process, nothing) is a pure function of it."""

from __future__ import annotations

import gc
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from app.model.user_code import UserCodeTimeout, current, user_code
from app.node.user_code_watch import (
    INTERRUPT_SIGNAL,
    RESEND_S,
    TICK_S,
    UserCodeWatch,
    Watchdog,
    verdict,
    watch_user_code,
)

TIMEOUT_S = 0.2


@pytest.fixture
def watch() -> Iterator[UserCodeWatch]:
    """A watch of the test's own (a node an earlier test left running may hold the
    process's), whose end of the process is recorded: a broken interruption fails the
    test rather than end the test run."""
    ended: list[str] = []
    hold = Watchdog(lambda invocation, *_: ended.append(invocation.what)).watch(TIMEOUT_S)
    try:
        yield hold
    finally:
        hold.stop()
    assert ended == [], "the watch would have ended the process"


@pytest.mark.usefixtures("watch")
def test_a_sleep_past_the_timeout_is_interrupted() -> None:
    started = time.monotonic()
    with pytest.raises(UserCodeTimeout) as raised, user_code("the handler of", "Sleepy"):
        time.sleep(10)
    took = time.monotonic() - started
    assert TIMEOUT_S <= took < 1.0
    assert "the handler of Sleepy ran for" in str(raised.value)
    assert "TICKWHEEL_HANDLER_TIMEOUT_MS" in str(raised.value)
    assert current() is None


@pytest.mark.usefixtures("watch")
def test_a_wait_on_an_event_and_a_python_loop_are_interrupted() -> None:
    # Bounded (5 s) only so that a watch that does not work fails the test, not hangs it.
    with pytest.raises(UserCodeTimeout), user_code("the handler of", "Waits"):
        threading.Event().wait(5)
    deadline = time.monotonic() + 5
    with pytest.raises(UserCodeTimeout), user_code("the applier of", "Spins"):
        while time.monotonic() < deadline:
            pass


def test_a_look_that_fails_once_leaves_the_watch_running(monkeypatch: pytest.MonkeyPatch) -> None:
    # One look's fault (a bug, say) once ended the watch's thread: every handler after it
    # ran untimed, with nothing but the thread's traceback to say so.
    from app.node import user_code_watch

    real, raised = user_code_watch.verdict, threading.Event()

    def fails_once(*args: object) -> object:
        if not raised.is_set():
            raised.set()
            raise RuntimeError("one look fails")
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(user_code_watch, "verdict", fails_once)
    hold = Watchdog(lambda *_: None).watch(TIMEOUT_S)
    try:
        with user_code("the handler of", "First"):
            assert raised.wait(5), "the watch never looked"
        # Bounded (5 s) only so that a dead watch fails the test, not hangs it.
        with pytest.raises(UserCodeTimeout), user_code("the handler of", "Later"):
            threading.Event().wait(5)
    finally:
        hold.stop()


@pytest.mark.usefixtures("watch")
def test_user_code_ending_in_time_raises_nothing() -> None:
    for _ in range(3):
        with user_code("the handler of", "Quick"):
            time.sleep(TIMEOUT_S / 2)
    # Time outside user code is no one's to bound.
    time.sleep(TIMEOUT_S + 3 * TICK_S)
    assert current() is None


@pytest.mark.usefixtures("watch")
def test_a_signal_after_the_invocation_ended_raises_nothing() -> None:
    with pytest.raises(UserCodeTimeout), user_code("the handler of", "First"):
        time.sleep(10)
    # The same signal again, late: its invocation is over, a new one is not overdue.
    signal.raise_signal(INTERRUPT_SIGNAL)
    with user_code("the handler of", "Next"):
        signal.raise_signal(INTERRUPT_SIGNAL)
        time.sleep(TIMEOUT_S / 4)
    signal.raise_signal(INTERRUPT_SIGNAL)


@pytest.mark.usefixtures("watch")
def test_nested_user_code_is_timed_as_the_outer_which_goes_on_once_caught() -> None:
    """A job's handler in its schedule's tick: timed as part of the tick (the outermost
    block), so that once the job's timeout is caught where the job is answered for (its
    run failed), no outer one is overdue too and interrupted a second time."""
    with user_code("the handler of", "Outer"):
        outer = current()
        with (
            pytest.raises(UserCodeTimeout, match="the handler of Outer"),
            user_code("the handler of job", "Inner"),
        ):
            assert current() is outer
            time.sleep(10)
        assert current() is outer
        time.sleep(TIMEOUT_S)  # the rest of the tick's work: not interrupted again
    assert current() is None


def test_an_interruption_caught_is_sent_again() -> None:
    """A retry loop's `except Exception` (or a logging handler's error handling) that
    swallows the timeout and blocks again is interrupted again, `RESEND_S` later, not
    left to the end of the process."""
    ended: list[str] = []
    watchdog = Watchdog(lambda invocation, *_: ended.append(invocation.what), grace_s=30)
    hold = watchdog.watch(TIMEOUT_S)
    caught = 0
    try:
        with user_code("the handler of", "Retrying"):
            for _ in range(3):
                try:
                    time.sleep(10)
                except UserCodeTimeout:
                    caught += 1
    finally:
        hold.stop()
    assert caught == 3 and ended == []


def test_a_watch_runs_while_any_node_holds_it_and_restores_the_signal() -> None:
    # A watch of its own: a node an earlier test left running may hold the process's.
    watchdog = Watchdog(lambda *_: None)
    before = signal.getsignal(INTERRUPT_SIGNAL)
    first, second = watchdog.watch(5.0), watchdog.watch(TIMEOUT_S)
    try:
        assert signal.getsignal(INTERRUPT_SIGNAL) is not before
        first.stop()
        first.stop()  # a second stop is nothing
        # The other node's hold (and its timeout) still holds.
        with pytest.raises(UserCodeTimeout), user_code("the handler of", "Held"):
            time.sleep(10)
    finally:
        second.stop()
    assert signal.getsignal(INTERRUPT_SIGNAL) is before


def test_user_code_the_interruption_cannot_end_is_the_process_end() -> None:
    """As a C call that never looks for signals: the interruption goes unseen (here the
    handler swallows it and blocks on), and at twice the timeout the watch ends the
    process (`exit_hung`; recorded here instead)."""
    ended: list[tuple[str, float]] = []
    watchdog = Watchdog(
        lambda invocation, ran_s, _: ended.append((invocation.what, ran_s)), grace_s=0
    )
    hold = watchdog.watch(TIMEOUT_S)
    try:
        with user_code("the handler of", "Stubborn"):
            try:
                time.sleep(10)
            except UserCodeTimeout:
                time.sleep(2 * TIMEOUT_S + 3 * TICK_S)
    finally:
        hold.stop()
    assert ended, "the watch never ended the process"
    what, ran_s = ended[0]
    assert what == "the handler of Stubborn"
    assert 2 * TIMEOUT_S <= ran_s < 2 * TIMEOUT_S + 2 * TICK_S + 0.2


def test_off_the_main_thread_nothing_is_watched() -> None:
    holds: list[UserCodeWatch] = []
    thread = threading.Thread(target=lambda: holds.append(watch_user_code(TIMEOUT_S)))
    thread.start()
    thread.join()
    assert holds[0].timeout_s is None
    holds[0].stop()


@pytest.mark.parametrize(
    ("ran_s", "first", "last", "expected"),
    [
        (0.0, None, None, None),
        (4.99, None, None, None),
        (5.0, None, None, "interrupt"),
        (7.0, None, None, "interrupt"),
        (7.0, 2.0, 0.5, None),  # interrupted: its exception is on its way
        (7.0, 2.0, RESEND_S, "interrupt"),  # caught, it runs on: again
        (9.99, 4.99, 0.5, None),
        (10.0, 5.0, 0.5, "exit"),  # no interruption ended it (a C call)
        (60.0, None, None, "interrupt"),  # frozen past it (SIGSTOP): interrupted first
        (60.0, 55.0, 0.1, "exit"),
    ],
)
def test_the_verdict_by_time(
    ran_s: float, first: float | None, last: float | None, expected: str | None
) -> None:
    assert verdict(ran_s, 5.0, first, last, grace_s=0) == expected
    assert verdict(ran_s, 5.0, first, last, grace_s=5.0) == expected


@pytest.mark.parametrize(
    ("first", "expected"), [(None, "interrupt"), (1.0, None), (9.99, None), (10.0, "exit")]
)
def test_a_short_timeout_ends_the_process_only_its_grace_after(
    first: float | None, expected: str | None
) -> None:
    """A test's or a fast failover's 0.5 s timeout: a stall of a second (a garbage
    collection, a loaded machine) is interrupted, but ends no process before 10 s more."""
    assert verdict(12.0, 0.5, first, 0.5 if first is not None else None) == expected


def test_a_signal_taken_over_by_another_library_is_not_sent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Another library's handler installed since (a server's reload, a profiler): sent, the
    signal would run that one's action and interrupt nothing, and the process would end.
    Not sent: said once, the code runs on untimed; the other's handler stays at the stop."""
    ended: list[str] = []
    others: list[int] = []
    before = signal.getsignal(INTERRUPT_SIGNAL)
    watchdog = Watchdog(lambda invocation, *_: ended.append(invocation.what), grace_s=0)
    hold = watchdog.watch(TIMEOUT_S)

    def theirs(signum: int, frame: object) -> None:
        others.append(signum)

    signal.signal(INTERRUPT_SIGNAL, theirs)
    try:
        with user_code("the handler of", "Untimed"):
            time.sleep(3 * TIMEOUT_S)
    finally:
        hold.stop()
        assert signal.getsignal(INTERRUPT_SIGNAL) is theirs
        signal.signal(INTERRUPT_SIGNAL, before)
    assert others == [] and ended == []
    assert caplog.text.count("was replaced by another's") == 1


@pytest.mark.usefixtures("watch")
def test_an_interruption_landing_in_a_gc_callback_is_sent_again_after_it() -> None:
    """A collection's callback (hypothesis times them) running when the signal came: an
    exception raised there is lost (reported as unraisable, which failed a CI run), so
    the signal is declined there and sent again once the collection ended."""

    def slow_callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            time.sleep(TIMEOUT_S * 2)  # the interruption comes here

    gc.callbacks.append(slow_callback)
    try:
        with pytest.raises(UserCodeTimeout), user_code("the applier of", "Collects"):
            gc.collect()
            time.sleep(10)
    finally:
        gc.callbacks.remove(slow_callback)
