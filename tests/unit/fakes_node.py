"""A whole node on the in-memory log (`app.kafka.memory`), run in the background, and a
bounded wait for what it does: the runner `test_node_memory` and the other node tests share.
Tests import it from `fakes`, which re-exports it; it imports no test module."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from app.jobs import DEFAULT_REQUEST_ID_WINDOW_MS
from app.kafka.memory import MemoryLog
from app.node import Node
from app.node.settings import Settings
from app.service import Service
from app.timers.runner import Clock, TimerOptions

__all__ = ["RunningNode", "running", "wait_until"]


async def wait_until(
    check: Callable[[], bool | Awaitable[bool]],
    within: float = 10.0,
    what: Callable[[], str] | None = None,
) -> None:
    """Lets nodes on the memory log run until `check` holds; their loops sleep in real time,
    so this waits by the wall clock (bounded: fails, saying `what`, rather than hang)."""
    deadline = time.monotonic() + within
    while True:
        got = check()
        if not isinstance(got, bool):
            got = await got
        if got:
            return
        if time.monotonic() > deadline:
            raise AssertionError(what() if what is not None else "condition never held")
        await asyncio.sleep(0.01)


class RunningNode:
    """A node of group "g" on a shared memory log, its data in `data / name`, run in the
    background. Its session timeout is a test's usual 1 s unless told."""

    def __init__(
        self,
        log: MemoryLog,
        data: Path,
        name: str,
        service: Service,
        partitions: int,
        *,
        session_timeout_ms: int = 1_000,
        timers: TimerOptions | None = None,
        options: TimerOptions | None = None,
        clock: Clock | None = None,
        request_id_window_ms: int = DEFAULT_REQUEST_ID_WINDOW_MS,
    ) -> None:
        settings = Settings(
            bootstrap_servers="memory",
            partitions=partitions,
            data_dir=data / name,
            group_id="g",
            session_timeout_ms=session_timeout_ms,
            commit_interval_ms=20,
            timers=timers or TimerOptions(),
            request_id_window_ms=request_id_window_ms,
        )
        self.name, self.partitions = name, partitions
        self.node = Node(settings, service, clock=clock, options=options, clients=log)
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> RunningNode:
        await self.node.start()
        self.task = asyncio.create_task(self.node.run())
        return self

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await self.node.stop()

    def runs(self, partitions: int | None = None) -> bool:
        """Ready, owning `partitions` partitions (all of them unless told)."""
        h = self.node.health()
        return bool(h["ready"]) and len(h["owned"]) == (
            self.partitions if partitions is None else partitions
        )


@contextlib.asynccontextmanager
async def running(node: RunningNode, within: float = 15.0) -> AsyncIterator[RunningNode]:
    """`node` started, once it runs every partition; stopped after."""
    await node.start()
    try:
        await wait_until(
            node.runs, within=within, what=lambda: f"{node.name} never ran: {node.node.health()}"
        )
        yield node
    finally:
        await node.stop()
