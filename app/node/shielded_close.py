"""A close that runs in an asyncio task of its own, shared by whoever asks for it, whose
failure every caller that waits on it hears, and the next caller when none did.

A partition task's close (`PartitionTask.close`) must never be cut short by its caller (a
revoke cancelling the retake that closes the task after a failure), must run once however
many ask at once, and must not lose its failure when the caller that began it went away
(a close that failed unheard would leave p taken again half let go). That bookkeeping is
one concept apart from what a close does to the partition, so it is kept here, with no
state of the task's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from app.task_ends import cancelled_here

__all__ = ["CloseCancelled", "ShieldedClose"]


class CloseCancelled(Exception):
    """A close ended by a CancelledError that leaked out of a call in it (a client's),
    although nobody cancelled it: cut in two, it failed as a crashed close does."""


class ShieldedClose:
    """The close under way, or the last one, and that one's failure while no caller has
    heard it."""

    def __init__(self) -> None:
        self._closing: asyncio.Task[None] | None = None
        self._unheard: BaseException | None = None

    async def run(
        self, close: Callable[[], Coroutine[Any, Any, None]], *, closed: bool, name: str
    ) -> None:
        """Waits for the close under way, or starts `close()` in a task named `name` when
        none is and the owner is not `closed` already; raises the close's failure, or the
        last close's that no caller heard."""
        if (closing := self._closing) is None or closing.done():
            if (unheard := self._unheard) is not None:
                # Its last close failed while no caller waited (the one that began it was
                # cancelled): this caller hears it, as that one would have.
                self._unheard = None
                raise unheard
            if closed:
                return
            closing = self._closing = asyncio.create_task(_guarded(close, name), name=name)
            closing.add_done_callback(self._closed)
        try:
            await asyncio.shield(closing)
        except asyncio.CancelledError:
            raise
        except BaseException:
            self._unheard = None  # heard here
            raise

    def _closed(self, closing: asyncio.Task[None]) -> None:
        if not closing.cancelled() and (exc := closing.exception()) is not None:
            self._unheard = exc  # until a caller hears it (a waiter of it, or the next)


async def _guarded(close: Callable[[], Coroutine[Any, Any, None]], name: str) -> None:
    """Runs `close()`; a CancelledError out of it while its task is not being cancelled
    leaked out of a call (a client's): a failure (`CloseCancelled`), never a close that
    ends as cancelled and so unheard."""
    try:
        await close()
    except asyncio.CancelledError as exc:
        if cancelled_here():
            raise
        raise CloseCancelled(f"{name}: cancelled inside a client library") from exc
