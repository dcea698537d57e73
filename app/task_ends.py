"""How an asyncio task ended, whether a `CancelledError` is the running task's own, and one
part of a stop awaited whatever it raises: what every package's supervision asks alike. A
leaf: it imports nothing of `app`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

__all__ = ["cancelled_here", "how_ended", "stop_part"]

logger = logging.getLogger(__name__)


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


async def stop_part(what: str, stop: Awaitable[object]) -> None:
    """Awaits one part's stop; what it raises is logged, not passed on (the next part is
    stopped all the same). A cancellation of the stopping task itself still ends it."""
    try:
        await stop
    except asyncio.CancelledError:
        if cancelled_here():
            raise
        logger.warning("stopping %s: cancelled inside the client library", what)
    except Exception as exc:
        logger.warning("stopping %s failed: %r", what, exc)
