"""Where a service author's code runs (handlers, appliers, state models, job functions):
what it raises is the record's that ran it, never the node's.

Whatever user code raises ends as an `Exception` the caller answers for its record (an
ERROR, a dead letter, a failed run): `SystemExit`, `KeyboardInterrupt`, `GeneratorExit` or
a `CancelledError` from synchronous code would otherwise end the worker or its task, on
every node that takes the partition after it; a `MemoryError` would count as the node's
own fault (`app.errors.node_fault`), so one record asking for a huge allocation would
retake its partition for ever; and an exception whose text cannot be read would fail the
very code that writes its dead letter. The worker takes SIGINT and SIGTERM through its
event loop (`app.cli.worker`), so no `KeyboardInterrupt` met here comes from a signal.

Each block run on the main thread is the current invocation while it runs (`current`):
the node's watchdog (`app.node.user_code_watch`) ends one that overruns its time with
`UserCodeTimeout`, raised in it.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from threading import get_ident, main_thread
from time import monotonic
from typing import Any

__all__ = [
    "UserCodeFailed",
    "UserCodeTimeout",
    "current",
    "not_awaitable",
    "plain_function",
    "user_code",
]

_MAIN_THREAD = main_thread().ident
"""Only the main thread's user code is watched: the watchdog's signal interrupts it alone."""


class UserCodeFailed(Exception):
    """User code raised what its record answers for, but no caller could take as it was."""


class UserCodeTimeout(Exception):
    """User code ran past the node's handler timeout (`TICKWHEEL_HANDLER_TIMEOUT_MS`) and
    was interrupted: its record's failure (answered ERROR, dead-lettered), not the node's."""

    def __init__(self, what: str, ran_s: float, timeout_s: float) -> None:
        super().__init__(
            f"{what} ran for {ran_s:.2f} s, past the handler timeout of {timeout_s:g} s "
            "(TICKWHEEL_HANDLER_TIMEOUT_MS): interrupted"
        )
        self.what = what
        self.ran_s = ran_s


class user_code:
    """Runs a `with` block as user code (`whose` and `name` say whose, for the message,
    formatted on a failure only): an `Exception` it raises passes unchanged when its text
    can be read; anything else is `UserCodeFailed` (the original as its cause). A class,
    not a generator: it runs once a command and once an event folded (#20).

    On the main thread the outermost block is the current invocation (`current`) from its
    start (`started`, monotonic) until it ends: a block nested in it (a job's handler in
    its schedule's tick) is timed as part of it, so that the inner one's timeout, caught
    where the inner one is answered for, leaves no outer one overdue as well."""

    __slots__ = ("name", "started", "whose")
    # Set by `__enter__` on the main thread only, read only while it is `current`: not
    # set at construction, one object made per command decided.
    started: float

    def __init__(self, whose: str, name: str = "") -> None:
        self.whose = whose
        self.name = name

    @property
    def what(self) -> str:
        """Whose code this is, as messages name it."""
        return f"{self.whose} {self.name}".strip()

    def __enter__(self) -> None:
        # On the hot path (twice per command decided): a few assignments. The slot is set
        # last, so an interruption before it leaves the slot as it was.
        global _current
        if _current is None and get_ident() == _MAIN_THREAD:
            self.started = monotonic()
            _current = self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        global _current
        if _current is self:  # first: whatever follows, the watch never sees it run on
            _current = None
        if exc is None:
            return
        what = self.what
        if isinstance(exc, MemoryError):
            raise UserCodeFailed(f"{what} ran out of memory: {_text(exc)}") from exc
        if isinstance(exc, Exception):
            if _readable(exc):
                return  # raised as it is
            raise UserCodeFailed(
                f"{what} raised {type(exc).__name__} (its text cannot be read)"
            ) from exc
        raise UserCodeFailed(f"{what} raised {type(exc).__name__}: {_text(exc)}") from exc


_current: user_code | None = None
"""The main thread's user code running now (the outermost block), or None."""


def current() -> user_code | None:
    """The main thread's user code running now (the outermost block), or None."""
    return _current


def plain_function(fn: Callable[..., Any], what: str) -> None:
    """Refuses `async def` (or a generator) where a plain function is called: its call only
    makes a coroutine, and nothing of its body would ever run."""
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        raise TypeError(f"{what} must be a plain function (def), not async def: {fn!r}")
    if inspect.isgeneratorfunction(fn):
        raise TypeError(f"{what} must be a plain function, not a generator: {fn!r}")
    # A callable object whose `__call__` yields: its call only makes a generator too. (A
    # class's call is its constructor, a function's its own.)
    call = inspect.getattr_static(type(fn), "__call__", None)
    yields = inspect.isgeneratorfunction(call) or inspect.isasyncgenfunction(call)
    if yields and not inspect.isfunction(fn) and not isinstance(fn, type):
        raise TypeError(f"{what} must be a plain function, not a generator: {fn!r}")


def not_awaitable(result: object, what: str) -> None:
    """Refuses a result that is awaitable (a callable object whose `__call__` is async): it
    is closed, so no 'never awaited' warning follows, and its body never ran."""
    if inspect.isawaitable(result):
        if isinstance(result, asyncio.Future):
            # A task it started (asyncio.ensure_future): refused, so it must not run on
            # after the answer, as a coroutine closed never ran.
            result.cancel()
        close = getattr(result, "close", None)
        if callable(close):
            close()
        raise TypeError(f"{what} returned {type(result).__name__}: it must not be async")


def _readable(exc: BaseException) -> bool:
    try:
        str(exc)
        repr(exc)
    except BaseException:  # a __str__ raising SystemExit is no text either
        return False
    return True


def _text(exc: BaseException) -> str:
    """What `exc` says, or its type's name when that cannot be read."""
    try:
        return repr(exc)
    except BaseException:
        return type(exc).__name__
