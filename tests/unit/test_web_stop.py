"""The web edge's stop gives requests in flight `STOP_GRACE_S`, not aiohttp's 60 s: a
worker's stop stops the node's run first, so a request waiting for its command's answer
waited its whole wait (30 s), the node's partitions held unworked and its group member in,
past a container's grace period (then SIGKILL: no commit, no clean mark)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from fakes import FakeNode

import app.ops.web
from app.ops.web import WebServer
from tables import Timer


async def test_a_request_in_flight_holds_the_stop_no_longer_than_the_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(app.ops.web, "STOP_GRACE_S", 0.3)
    node = FakeNode()
    node.owned = [0]
    asked = asyncio.Event()

    async def never(*_: object) -> list[Timer]:
        asked.set()
        await asyncio.Event().wait()  # e.g. a command whose answer never comes
        return []

    monkeypatch.setattr(node.store, "due_after", never)
    server = WebServer(node, 0)  # type: ignore[arg-type]
    await server.start()
    async with aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{server.port}/timers/upcoming"
        request = asyncio.create_task(http.get(url))
        await asyncio.wait_for(asked.wait(), 5)
        began = time.monotonic()
        await asyncio.wait_for(server.stop(), 10)  # aiohttp's own grace: 60 s
        assert time.monotonic() - began < 5
        with pytest.raises(aiohttp.ClientError):
            await request  # cut: the client sends it again
