"""`GET /timers/upcoming`'s reads are synchronous (a store call reads and decodes its rows
at once): a request gives the event loop a turn after each (`test_upcoming_reads`: each
a bounded chunk), and a node reads for one request at a time (another waits
`upcoming_wait_s`, then is a 503)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from itertools import pairwise
from typing import Any

import aiohttp
import pytest
from fakes import PAGE_PARTITIONS, T0, FakeNode, ref
from yarl import URL

from app.ops.web import WebServer
from tables import CommandSpec, OnceRule, Timer
from tables.partitioner import partition_of


def timer(owner: str, key: str, due: int) -> Timer:
    p = partition_of(owner, PAGE_PARTITIONS)
    return Timer(
        id=f"{owner}-{key}",
        owner=ref(owner),
        key=key,
        version=1,
        partition=p,
        rule=OnceRule(at=due),
        target=ref(owner),
        command=CommandSpec(type="Fire"),
        slot=0,
        slot_due_at=due,
        due_at=due,
    )


@pytest.fixture
async def web() -> AsyncIterator[tuple[FakeNode, WebServer, URL, aiohttp.ClientSession]]:
    node = FakeNode(owned=list(range(PAGE_PARTITIONS)))
    for n in range(40):
        assert await node.store.put(timer(f"o{n}", "k", T0 + n))
    server = WebServer(node, 0)  # type: ignore[arg-type]
    await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            yield node, server, URL(f"http://127.0.0.1:{server.port}/timers/upcoming"), http
    finally:
        await server.stop()


async def get(http: aiohttp.ClientSession, url: URL) -> tuple[int, dict[str, str], Any]:
    async with http.get(url.with_query(limit="5")) as r:
        return r.status, dict(r.headers), await r.json()


async def test_a_request_gives_the_loop_a_turn_after_each_read(
    web: tuple[FakeNode, WebServer, URL, aiohttp.ClientSession],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The store's reads never suspend: every partition's scan was read in one stretch
    of the loop (seconds at a dozen full partitions on RocksDB)."""
    node, _, url, http = web
    turns = 0
    done = asyncio.Event()

    async def count_turns() -> None:
        nonlocal turns
        while not done.is_set():
            await asyncio.sleep(0)
            turns += 1

    seen: list[int] = []
    due_after = node.store.due_after

    async def counted(*args: Any) -> list[Timer]:
        seen.append(turns)  # how many turns the loop gave others before this read
        return await due_after(*args)

    monkeypatch.setattr(node.store, "due_after", counted)
    counter = asyncio.create_task(count_turns())
    try:
        status, _, body = await get(http, url)
    finally:
        done.set()
        await counter
    assert status == 200, body
    assert len(body["timers"]) == 5 and body["scanned_all"] is True
    assert len(seen) >= PAGE_PARTITIONS
    assert all(a < b for a, b in pairwise(seen)), seen


async def test_one_read_at_a_time_another_waits_then_is_busy(
    web: tuple[FakeNode, WebServer, URL, aiohttp.ClientSession],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node, server, url, http = web
    server.upcoming_wait_s = 0.05
    reading, go = asyncio.Event(), asyncio.Event()
    calls = 0
    due_after = node.store.due_after

    async def held(*args: Any) -> list[Timer]:
        nonlocal calls
        calls += 1
        if calls == 1:  # the first request's first read waits until told
            reading.set()
            await go.wait()
        return await due_after(*args)

    monkeypatch.setattr(node.store, "due_after", held)
    first = asyncio.create_task(get(http, url))
    await reading.wait()
    status, headers, body = await get(http, url)
    assert status == 503, body
    assert headers["Retry-After"] == "1"
    assert "another request is reading upcoming timers" in body["error"]
    assert calls == 1  # the busy one read nothing
    go.set()
    status, _, body = await first
    assert status == 200 and len(body["timers"]) == 5
    # The turn was given back: the next request reads, and one waiting gets its turn.
    server.upcoming_wait_s = 5.0
    answers = await asyncio.gather(get(http, url), get(http, url))
    assert [a[0] for a in answers] == [200, 200]
    assert answers[0][2] == answers[1][2] == body
