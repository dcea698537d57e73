"""The handler timeout: user code that blocks the node's event loop is interrupted, and a
node that cannot interrupt it stops.

User code (`app.model.user_code`) runs synchronously on the worker's one event loop, on
the main thread: a handler that never returns (an HTTP call without a timeout, a wait on
a lock) would take the whole node with it (no heartbeat, no /livez, no SIGTERM), and then
every node the group gives its partition next. While a node runs, a daemon thread here
looks at the current invocation every `TICK_S`:

- past the timeout, it sends `SIGUSR2` to the main thread; the handler installed for it
  raises `UserCodeTimeout` there, in the user code (a signal handler that raises ends
  `time.sleep`, a socket's or a lock's wait, and interrupts any Python loop: PEP 475).
  Raised out of user code, it is that record's failure: the command answered ERROR and
  dead-lettered, the job's run failed; the partition goes on;
- still the same invocation at twice the timeout, and `HUNG_GRACE_S` after it at least
  (a C call that never checks for signals), it dumps every thread's stack to stderr,
  logs CRITICAL and ends the process with `HUNG_EXIT_CODE`: a node that stops loudly is
  restarted and its partitions move, one that hangs silently stops the cluster.

Only a node started from the main thread is watched (a signal's handler runs there
alone); one started elsewhere runs without a timeout, said once in a warning.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import logging
import os
import signal
import threading
from collections.abc import Callable
from time import monotonic
from types import FrameType
from typing import Any, Final, Literal

from app.log_limit import LogLimit
from app.model.user_code import UserCodeTimeout, current, user_code

__all__ = [
    "HUNG_EXIT_CODE",
    "HUNG_GRACE_S",
    "INTERRUPT_SIGNAL",
    "RESEND_S",
    "TICK_S",
    "UserCodeWatch",
    "Verdict",
    "Watchdog",
    "exit_hung",
    "verdict",
    "watch_user_code",
]

logger = logging.getLogger(__name__)

HUNG_EXIT_CODE: Final = 70
"""The worker's exit code when user code could not be interrupted (sysexits' EX_SOFTWARE)."""

INTERRUPT_SIGNAL: Final = signal.SIGUSR2

HUNG_GRACE_S: Final = 10.0
"""How long past its timeout an interrupted invocation may still run before the process
ends, at the least: a short timeout (a test's, a fast failover's) must not end a process
that a moment's stall (a full garbage collection, a loaded machine) held up."""

TICK_S: Final = 0.05
"""How often the watch looks: an overrun is interrupted at most this late."""

Verdict = Literal["interrupt", "exit"]

_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None

# Interrupted at the very start of its own `__enter__`/`__exit__` (the invocation ending
# just as it was found overdue), a block would not clear its slot: the signal is then
# declined and sent again at the next look.
_ENTRY_CODES: Final = frozenset({user_code.__enter__.__code__, user_code.__exit__.__code__})


def _in_gc_callback(frame: FrameType) -> bool:
    """Whether `frame` runs in a garbage collection's callback (`gc.callbacks`, a library's:
    hypothesis times collections): an exception raised there is reported as unraisable
    and lost, not raised in the user code the collection interrupted."""
    codes = {getattr(callback, "__code__", None) for callback in gc.callbacks}
    at: FrameType | None = frame
    while at is not None:
        if at.f_code in codes:
            return True
        at = at.f_back
    return False


RESEND_S: Final = 1.0
"""How often an invocation still running after its interruption is interrupted again: one
that caught the first (a retry loop's `except Exception`, a logging handler's error
handling) is given another, not left to the process's end."""


def verdict(
    ran_s: float,
    timeout_s: float,
    first_sent_s: float | None,
    last_sent_s: float | None,
    grace_s: float = HUNG_GRACE_S,
) -> Verdict | None:
    """What the watch does about an invocation running for `ran_s`, interrupted first and
    last `first_sent_s` and `last_sent_s` ago (None: never): interrupt it once past the
    timeout, and again every `RESEND_S` while it runs on; end the process once the first
    interruption is the timeout and `grace_s` old at least (none ended it), never before
    one was sent (a process frozen past it, SIGSTOP or a paused VM, is interrupted first)."""
    if first_sent_s is not None and first_sent_s >= max(timeout_s, grace_s):
        return "exit"
    if ran_s >= timeout_s and (last_sent_s is None or last_sent_s >= RESEND_S):
        return "interrupt"
    return None


class UserCodeWatch:
    """One node's hold on the watch (`watch_user_code`); `stop` lets go of it."""

    def __init__(self, watchdog: Watchdog, timeout_s: float | None) -> None:
        self._watchdog = watchdog
        self.timeout_s = timeout_s
        """None: the node is not watched (started off the main thread)."""

    def stop(self) -> None:
        if self.timeout_s is not None:
            self._watchdog.release(self)
            self.timeout_s = None


def watch_user_code(timeout_s: float) -> UserCodeWatch:
    """Watches the main thread's user code until the returned hold's `stop` (held by each
    node that runs: the watch runs while any does, with the shortest of their timeouts)."""
    return _WATCHDOG.watch(timeout_s)


class Watchdog:
    """A watch: its thread and its signal handler, while any hold is. The process has one
    (`watch_user_code`); `die` ends the process (a test's records the call instead)."""

    def __init__(
        self, die: Callable[[user_code, float, float], None], grace_s: float = HUNG_GRACE_S
    ) -> None:
        self._grace_s = grace_s
        self._holds: list[UserCodeWatch] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._previous: _Handler = None
        self._warned = False
        self._die = die
        self.timeout_s = 0.0
        self._target: tuple[user_code, float] | None = None
        """The invocation interrupted (and its start), or None: the signal raises in it
        alone."""
        self._sent: tuple[float, float] = (0.0, 0.0)
        """When `_target` was first and last sent the signal (monotonic)."""
        self._lost_signal = False

    def watch(self, timeout_s: float) -> UserCodeWatch:
        """A hold on the watch, with `timeout_s`; none off the main thread (said once)."""
        if threading.current_thread() is not threading.main_thread():
            self._warn_off_main()
            return UserCodeWatch(self, None)
        hold = UserCodeWatch(self, timeout_s)
        self._hold(hold)
        return hold

    def _warn_off_main(self) -> None:
        if not self._warned:
            self._warned = True
            logger.warning(
                "the node was started off the main thread: user code runs without a "
                "timeout (TICKWHEEL_HANDLER_TIMEOUT_MS is not applied)"
            )

    def _hold(self, hold: UserCodeWatch) -> None:
        assert hold.timeout_s is not None
        with self._lock:
            self._holds.append(hold)
            self.timeout_s = min(h.timeout_s for h in self._holds if h.timeout_s is not None)
            if self._thread is not None:
                return
            self._previous = signal.signal(INTERRUPT_SIGNAL, self._on_signal)
            self._stopping.clear()
            self._target = None
            self._thread = threading.Thread(
                target=self._run, name="tickwheel-user-code-watch", daemon=True
            )
            self._thread.start()

    def release(self, hold: UserCodeWatch) -> None:
        with self._lock:
            if hold not in self._holds:
                return
            self._holds.remove(hold)
            if self._holds:
                self.timeout_s = min(h.timeout_s for h in self._holds if h.timeout_s is not None)
                return
            thread, self._thread = self._thread, None
            self._stopping.set()
        if thread is not None:
            thread.join()
        if (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(INTERRUPT_SIGNAL) == self._on_signal
        ):  # not another's, installed since
            signal.signal(INTERRUPT_SIGNAL, self._previous or signal.SIG_DFL)
        # Else left installed: it raises nothing without a target, which none is now.
        self._target = None

    def _run(self) -> None:
        failures = LogLimit(60.0)
        while not self._stopping.wait(TICK_S):
            try:
                self._look()
            except Exception as exc:
                # One look's fault (a bug, a MemoryError's aftermath) must not end the watch:
                # a dead thread would leave every later handler untimed, with no sign.
                if (more := failures.check(type(exc))) is not None:
                    logger.exception("the user-code watch's look failed; looking on%s", more)

    def _look(self) -> None:
        invocation = current()
        if invocation is None:
            return
        now, started = monotonic(), invocation.started
        sent = self._target == (invocation, started)
        first, last = (now - self._sent[0], now - self._sent[1]) if sent else (None, None)
        match verdict(now - started, self.timeout_s, first, last, self._grace_s):
            case "interrupt":
                if not self._ours():
                    return  # said once; the node runs on untimed, as without the watch
                if not sent:
                    self._target, self._sent = (invocation, started), (now, now)
                else:
                    self._sent = (self._sent[0], now)
                main = threading.main_thread().ident
                assert main is not None
                signal.pthread_kill(main, INTERRUPT_SIGNAL)
            case "exit" if current() is invocation and invocation.started == started:
                self._die(invocation, now - started, self.timeout_s)

    def _ours(self) -> bool:
        """Whether the signal's handler is still this watch's: another library may have
        taken the signal over since (a server's reload, a profiler); sent, it would run
        that one's action and interrupt nothing."""
        if signal.getsignal(INTERRUPT_SIGNAL) == self._on_signal:
            return True
        if not self._lost_signal:
            self._lost_signal = True
            logger.error(
                "%s's handler was replaced by another's: user code runs without a timeout "
                "(TICKWHEEL_HANDLER_TIMEOUT_MS is not applied)",
                INTERRUPT_SIGNAL.name,
            )
        return False

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """In the main thread: `UserCodeTimeout` raised in the interrupted invocation, if it
        is still the one running (it may have just ended: then nothing)."""
        target, invocation = self._target, current()
        if target is None or invocation is not target[0] or invocation.started != target[1]:
            return
        if frame is not None and frame.f_code in _ENTRY_CODES:
            return  # sent again (`RESEND_S`), once its slot is settled
        if frame is not None and _in_gc_callback(frame):
            return  # raised there, it would be lost: sent again once the collection ends
        raise UserCodeTimeout(invocation.what, monotonic() - invocation.started, self.timeout_s)


def exit_hung(invocation: user_code, ran_s: float, timeout_s: float) -> None:
    """Ends the process: the invocation outlived its interruption (a C call that never
    looks for signals). Its stack, with every thread's, says where it hangs."""
    # No lock taken on the way out (no logging, no flush): the main thread, hung, may hold
    # a log handler's (a handler that blocks writing its log was its way of hanging).
    said = (
        f"CRITICAL {invocation.what} has run for {ran_s:.1f} s and could not be interrupted "
        f"at the handler timeout ({timeout_s:g} s, TICKWHEEL_HANDLER_TIMEOUT_MS): the node "
        f"stops (exit code {HUNG_EXIT_CODE}) rather than hang; every thread's stack follows\n"
    )
    with contextlib.suppress(OSError):
        os.write(2, said.encode("utf-8", "replace"))
    with contextlib.suppress(OSError, RuntimeError, ValueError):
        faulthandler.dump_traceback(file=2, all_threads=True)
    os._exit(HUNG_EXIT_CODE)


_WATCHDOG: Final = Watchdog(exit_hung)
