"""How an asyncio task ended, and whether a `CancelledError` is the running task's own: what
every package's supervision asks alike. A leaf: it imports nothing of `app`."""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["cancelled_here", "how_ended"]


def cancelled_here() -> bool:
    """Whether the running task is being cancelled: a `CancelledError` caught now is its own
    (re-raise it), otherwise one leaked out of a call (a client library's), a failure."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def how_ended(task: asyncio.Task[Any]) -> str:
    """How a task that runs until its owner cancels it ended, read without raising what it
    raised (its owner cancels it only once it no longer watches it: a cancellation seen is
    one leaked out of a call)."""
    if task.cancelled():
        return "ended cancelled, though nothing cancelled it"
    exc = task.exception()
    return "returned" if exc is None else f"failed: {exc!r}"
