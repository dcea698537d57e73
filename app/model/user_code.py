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
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["UserCodeFailed", "not_awaitable", "plain_function", "user_code"]


class UserCodeFailed(Exception):
    """User code raised what its record answers for, but no caller could take as it was."""


class user_code:
    """Runs a `with` block as user code (`whose` and `name` say whose, for the message,
    formatted on a failure only): an `Exception` it raises passes unchanged when its text
    can be read; anything else is `UserCodeFailed` (the original as its cause). A class,
    not a generator: it runs once a command and once an event folded (#20)."""

    __slots__ = ("name", "whose")

    def __init__(self, whose: str, name: str = "") -> None:
        self.whose = whose
        self.name = name

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if exc is None:
            return
        what = f"{self.whose} {self.name}".strip()
        if isinstance(exc, MemoryError):
            raise UserCodeFailed(f"{what} ran out of memory: {_text(exc)}") from exc
        if isinstance(exc, Exception):
            if _readable(exc):
                return  # raised as it is
            raise UserCodeFailed(
                f"{what} raised {type(exc).__name__} (its text cannot be read)"
            ) from exc
        raise UserCodeFailed(f"{what} raised {type(exc).__name__}: {_text(exc)}") from exc


def plain_function(fn: Callable[..., Any], what: str) -> None:
    """Refuses `async def` (or a generator) where a plain function is called: its call only
    makes a coroutine, and nothing of its body would ever run."""
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        raise TypeError(f"{what} must be a plain function (def), not async def: {fn!r}")
    if inspect.isgeneratorfunction(fn):
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
