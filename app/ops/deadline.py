"""A wait bounded by one deadline over several awaits (`by`): an operator's request waits
for its answer through calls that may each wait far longer (a `Reader`'s requests, 40 s,
for a partition leader that is gone) than the caller's `--wait`; and the stop of the client
it read through, bounded by the same deadline (`stop_by`); and a results reader opened for
such a wait (`reader_for`), which every change's sender uses, so none stops unbounded."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from app.kafka.ports import Clients, ReaderClient

__all__ = ["STOP_GRACE_S", "by", "reader_for", "stop_by"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

STOP_GRACE_S = 2.0
"""How long past the deadline (or from now, when it is past) a client's stop is waited for:
a read cut at the deadline stops after it, and a close that nothing holds up (aiokafka's,
librdkafka's with no call in flight) takes milliseconds."""


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


async def stop_by(deadline: float, stop: Awaitable[None], what: str) -> None:
    """Awaits `stop`, a client's, until `deadline` or `STOP_GRACE_S` from now, whichever is
    later; cut short there (cancelled), with a warning naming `what`. librdkafka's reader
    closes its consumer on its thread after the call in flight, which a read cut at the
    deadline left waiting up to the reader's own timeout (30 s): its close, cancelled, ends
    there, and the thread with it (`RdkafkaReader.stop`)."""
    loop = asyncio.get_running_loop()
    if await by(max(deadline, loop.time() + STOP_GRACE_S), _done(stop)) is None:
        logger.warning(
            "%s did not stop within the wait (and %g s more): left to end on its own "
            "(librdkafka's reader closes on its thread, after the call to the broker in "
            "flight)",
            what,
            STOP_GRACE_S,
        )


async def _done(stop: Awaitable[None]) -> bool:
    await stop
    return True


@asynccontextmanager
async def reader_for(
    clients: Clients, wait_s: float, what: str = "the results' reader"
) -> AsyncIterator[ReaderClient]:
    """A reader of `clients`, started, for a wait of `wait_s` seconds from now: its stop on
    the way out is bounded by that wait (`stop_by`), as the reads through it are. Every
    change that waits for its answers (the CLI's, the web edge's routes and page buttons)
    reads through one: librdkafka's reader, stopped plainly after a read cut at the
    deadline, held the answer up to its own timeout (30 s) past the wait."""
    reader = clients.reader()
    await reader.start()
    deadline = asyncio.get_running_loop().time() + wait_s
    try:
        yield reader
    finally:
        await stop_by(deadline, reader.stop(), what)
