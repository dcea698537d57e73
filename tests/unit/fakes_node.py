"""A whole node on the in-memory log (`app.kafka.memory`), run in the background, and a
bounded wait for what it does: the runner `test_node_memory` and the other node tests share;
a node with its web edge and token on a fake clock, called over HTTP (`web_node`), for the
tests of its routes and pages. Tests import it from `fakes`, which re-exports it; it
imports no test module."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import orjson
from yarl import URL

from app.jobs import DEFAULT_REQUEST_ID_WINDOW_MS
from app.kafka.memory import MemoryLog
from app.node import Node
from app.node.settings import Settings
from app.ops.web import WebServer
from app.service import Service
from app.timers.runner import Clock, SystemClock, TimerOptions

__all__ = [
    "WEB_TOKEN",
    "FakeClock",
    "RunningNode",
    "WebNode",
    "running",
    "wait_until",
    "web_node",
]

WEB_TOKEN = "s3cret"
"""The web token of a `web_node`'s node (its writes need it)."""


class FakeClock:
    """Time moves only by `set`/`advance`; sleepers wake when it passes their time."""

    def __init__(self, now: int) -> None:
        self._now = now
        self._sleepers: list[tuple[int, asyncio.Future[None]]] = []

    def now(self) -> int:
        return self._now

    async def sleep_until(self, t: int) -> None:
        if t <= self._now:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (t, fut)
        self._sleepers.append(entry)
        try:
            await fut
        finally:
            self._sleepers.remove(entry)

    @property
    def sleeping_until(self) -> list[int]:
        return sorted(t for t, _ in self._sleepers)

    def set(self, t: int) -> None:
        self._now = max(self._now, t)
        for at, fut in self._sleepers:
            if at <= self._now and not fut.done():
                fut.set_result(None)

    def advance(self, ms: int) -> None:
        self.set(self._now + ms)

    def step(self, t: int) -> None:
        """The wall clock stepped to `t`, back as well as forward (NTP, a resumed VM)."""
        self._now = t
        self.set(t)


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
    """A node of group "g" (unless told) on a shared memory log, its data in `data / name`,
    run in the background. Its session timeout is a test's usual 1 s unless told."""

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
        group_id: str = "g",
    ) -> None:
        settings = Settings(
            bootstrap_servers="memory",
            partitions=partitions,
            data_dir=data / name,
            group_id=group_id,
            session_timeout_ms=session_timeout_ms,
            commit_interval_ms=20,
            timers=timers or TimerOptions(),
            request_id_window_ms=request_id_window_ms,
        )
        self.name, self.partitions = name, partitions
        # Records dated by the node's clock, as a broker's are by the hosts' (a log's first
        # node's): a command dated far from it would be refused as past the request-id
        # window.
        log.date_by((clock or SystemClock()).now)
        self.node = Node(settings, service, clock=clock, options=options, clients=log)
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> RunningNode:
        await self.node.start()
        self.task = asyncio.create_task(self.node.run())
        return self

    async def stop(self) -> None:
        """Stops the node, its run's own failure (if it ended by one) raised after."""
        try:
            if self.task is not None:
                self.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self.task
        finally:
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


@dataclass
class WebNode:
    """A node on the in-memory log with its web edge, and a client session to call it."""

    log: MemoryLog
    clock: FakeClock
    node: Node
    url: URL
    http: aiohttp.ClientSession

    async def call(
        self, method: str, path: str, body: Any = None, token: str | None = WEB_TOKEN, **kw: Any
    ) -> tuple[int, Any]:
        """`method path` with the web token (None: without), `body` as JSON (text and bytes
        as they are); its status and its JSON answer."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        headers.update(kw.pop("headers", {}))
        data = body if isinstance(body, str | bytes) or body is None else orjson.dumps(body)
        async with self.http.request(
            method, self.url.with_path(path, encoded=True), data=data, headers=headers, **kw
        ) as r:
            return r.status, await r.json()


W = TypeVar("W", bound=WebNode)


@contextlib.asynccontextmanager
async def web_node(
    service: Service,
    data: Path,
    clock: FakeClock,
    kind: type[W],
    *,
    partitions: int = 2,
    cookies: bool = False,
    token: str | None = WEB_TOKEN,
    timers: TimerOptions | None = None,
) -> AsyncIterator[W]:
    """A node of `service` (its data in `data / "n"`) with its web edge on a free port and
    web token `token` (None: none, its writes open), once it runs every partition, as a
    `kind`; stopped after. `cookies`: the session keeps an IP address host's cookies (the
    loopback's: the page's forms); `timers`: the node's timer options."""
    log = MemoryLog()
    settings = Settings(
        bootstrap_servers="memory",
        partitions=partitions,
        data_dir=data / "n",
        group_id="g",
        session_timeout_ms=1_000,
        commit_interval_ms=20,
        web_token=token,
        timers=timers or TimerOptions(),
    )
    log.date_by(clock.now)  # as a RunningNode's
    node = Node(settings, service, clients=log, clock=clock)
    await node.start()
    task = asyncio.create_task(node.run())
    server = WebServer(node, 0, timer_wait_s=5.0)
    await server.start()
    try:
        await wait_until(lambda: bool(node.health()["ready"]) and len(node.owned) == partitions)
        jar = aiohttp.CookieJar(unsafe=True) if cookies else None
        async with aiohttp.ClientSession(cookie_jar=jar) as http:
            yield kind(log, clock, node, URL(f"http://127.0.0.1:{server.port}/"), http)
    finally:
        await server.stop()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        await node.stop()
