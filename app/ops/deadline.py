"""A wait bounded by one deadline over several awaits (`by`): an operator's request waits
for its answer through calls that may each wait far longer (a `Reader`'s requests, 40 s,
for a partition leader that is gone) than the caller's `--wait`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["by"]

T = TypeVar("T")


async def by(deadline: float, work: Awaitable[T]) -> T | None:
    """`work`'s value, or None once the event loop's clock reaches `deadline` first (a
    `TimeoutError` of `work`'s own is raised)."""
    timeout = asyncio.timeout_at(deadline)
    try:
        async with timeout:
            return await work
    except TimeoutError:
        if timeout.expired():
            return None
        raise
