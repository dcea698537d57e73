"""The HTTP edge's cap on open connections (`app.ops.connection_cap`) and its idle timeout:
connections held open and silent cannot keep anyone out (the idlest is closed for a
newcomer); with every connection in a request, the probes still answer on the room kept
for them and anything else is refused; a request in progress (a slow body) is never cut
for a newcomer; an idle keep-alive connection is closed after `TICKWHEEL_WEB_IDLE_TIMEOUT_MS`.
A real server on 127.0.0.1 port 0, as the node's, and raw socket clients, as
`test_web_slow_client`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from fakes import FakeNode, wait_until
from multidict import MultiMapping

import app.ops.web
from app.node.settings import Settings
from app.ops.connection_cap import PROBE_ROOM, place
from app.ops.forms import posted_form
from app.ops.page import Acted
from app.ops.web import WebServer

# Every read is bounded by this: without the cap or the timeout under test a connection
# held would be answered or closed never.
OUTER_S = 10.0

_FORM = b"type=shop.order&owner=o&key=k"
_POST = (
    b"POST /timers/retry HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: %d\r\n\r\n"
) % len(_FORM)

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def get(path: str, close: bool = True) -> bytes:
    keep = b"Connection: close\r\n" if close else b""
    return b"GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s\r\n" % (path.encode(), keep)


class Edge:
    """The server, and every connection a test opens to it (closed at its end)."""

    def __init__(self, server: WebServer) -> None:
        self.server = server
        self.conns: list[Conn] = []

    async def connect(self, sent: bytes = b"") -> Conn:
        conn = await asyncio.open_connection("127.0.0.1", self.server.port)
        self.conns.append(conn)
        if sent:
            conn[1].write(sent)
            await conn[1].drain()
        return conn


@asynccontextmanager
async def serving(node: FakeNode, **options: float) -> AsyncIterator[Edge]:
    server = WebServer(node, 0, **options)  # type: ignore[arg-type]
    await server.start()
    edge = Edge(server)
    try:
        yield edge
    finally:
        for _, writer in edge.conns:
            writer.close()
        await server.stop()


async def answer_of(conn: Conn, sent: bytes = b"") -> bytes:
    """All the server sends until it closes the connection."""
    reader, writer = conn
    if sent:
        writer.write(sent)
        await writer.drain()
    return await asyncio.wait_for(reader.read(), OUTER_S)


def open_now(node: FakeNode) -> float:
    return node.metrics.registry.get_sample_value("tickwheel_http_connections") or 0.0


def shed(node: FakeNode, why: str) -> float:
    name = "tickwheel_http_connections_shed_total"
    return node.metrics.registry.get_sample_value(name, {"why": why}) or 0.0


async def opened(node: FakeNode, n: int) -> None:
    await wait_until(lambda: open_now(node) == n, OUTER_S, lambda: f"{open_now(node)} open")


def test_a_new_connection_is_served_then_given_the_probes_room_then_refused() -> None:
    assert place(0, 0, 3) == place(2, 0, 3) == "served"
    assert place(3, 0, 3) == place(3, PROBE_ROOM - 1, 3) == "probes"
    assert place(3, PROBE_ROOM, 3) == place(4, PROBE_ROOM, 3) == "refused"
    assert place(3, 0, 3, room=0) == "refused"


async def answered(conn: Conn, sent: bytes) -> bytes:
    """The answer to `sent` on a connection kept alive (its head and its body)."""
    reader, writer = conn
    writer.write(sent)
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), OUTER_S)
    (length,) = [
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.startswith(b"Content-Length")
    ]
    return head + await asyncio.wait_for(reader.readexactly(length), OUTER_S)


async def test_connections_held_silent_are_closed_for_newcomers_the_idlest_first() -> None:
    node = FakeNode()
    async with serving(node, max_connections=3) as edge:
        held = [await edge.connect() for _ in range(3)]  # the review's flood: nothing sent
        await opened(node, 3)
        # A request answered makes its connection the most recently active.
        assert (await answered(held[0], get("/livez", close=False))).startswith(b"HTTP/1.1 200")
        newcomer = await edge.connect()
        assert await answer_of(held[1]) == b""  # the idlest closed unanswered
        await opened(node, 3)  # the newcomer, in its place
        other = await edge.connect()
        assert await answer_of(held[2]) == b""
        got = await answer_of(newcomer, get("/healthz"))
        assert got.startswith(b"HTTP/1.1 200 "), got
        got = await answer_of(other, get("/ledger"))  # served in full, not only probes
        assert got.startswith(b"HTTP/1.1 200 "), got
        got = await answer_of(held[0], get("/livez"))  # kept: it was in use
        assert got.startswith(b"HTTP/1.1 200 "), got
        assert (shed(node, "idle"), shed(node, "refused")) == (2, 0)


async def test_with_every_connection_in_a_request_probes_answer_and_the_rest_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cap = 2
    reading: list[object] = []
    scraping: list[object] = []
    scraped = asyncio.Event()

    async def posted(request: object) -> object:
        reading.append(request)  # in its read, the body not all sent: a slow upload
        return await posted_form(request)  # type: ignore[arg-type]

    async def act(action: str, form: MultiMapping[object]) -> Acted:
        return Acted(location="/?done")

    async def refresh() -> None:
        scraping.append(None)
        await scraped.wait()

    monkeypatch.setattr(app.ops.web, "posted_form", posted)
    node = FakeNode()
    monkeypatch.setattr(node, "refresh_metrics", refresh, raising=False)
    async with serving(node, max_connections=cap, body_timeout_s=60.0) as edge:
        assert edge.server.page is not None
        monkeypatch.setattr(edge.server.page, "act", act)
        uploads = [await edge.connect(_POST + _FORM[:5]) for _ in range(cap)]
        await wait_until(lambda: len(reading) == cap, OUTER_S)
        # Every connection in a request: none is closed for the newcomers, and the room
        # kept for probes answers them.
        got = await answer_of(await edge.connect(), get("/healthz"))
        assert got.startswith(b"HTTP/1.1 200 "), got
        got = await answer_of(await edge.connect(), get("/ledger"))
        assert got.startswith(b"HTTP/1.1 503 "), got
        assert b"this one is for probes only" in got
        await opened(node, cap)
        # Probes in progress on the whole room (scrapes waiting): the next is refused.
        scrapes = [await edge.connect(get("/metrics")) for _ in range(PROBE_ROOM)]
        await wait_until(lambda: len(scraping) == PROBE_ROOM, OUTER_S)
        began = time.monotonic()
        got = await answer_of(await edge.connect())
        assert got.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), got
        assert b"Retry-After: 1\r\n" in got and b"too many connections" in got
        assert time.monotonic() - began < OUTER_S / 2  # at once, not by a timeout
        scraped.set()
        for scrape in scrapes:
            assert (await answer_of(scrape)).startswith(b"HTTP/1.1 200 ")
        # The slow uploads were never cut: their bodies end, and they are answered.
        for reader, writer in uploads:
            writer.write(_FORM[5:])
            await writer.drain()
            got = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), OUTER_S)
            assert got.startswith(b"HTTP/1.1 303 "), got
        assert (shed(node, "idle"), shed(node, "probe_only"), shed(node, "refused")) == (0, 1, 1)


async def test_an_idle_keepalive_connection_is_closed_after_the_idle_timeout() -> None:
    node = FakeNode(settings=Settings(web_idle_timeout_ms=1_000))
    async with serving(node) as edge:
        reader, _ = await edge.connect(get("/livez", close=False))
        got = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), OUTER_S)
        assert got.startswith(b"HTTP/1.1 200 ") and b"Connection: close" not in got
        answered = time.monotonic()
        rest = await asyncio.wait_for(reader.read(), OUTER_S)  # the body, then closed
        assert rest.startswith(b"{") and rest.endswith(b"}"), rest
        assert time.monotonic() - answered >= 0.9  # by the timeout, not at once
        await opened(node, 0)


def test_the_edge_takes_its_cap_and_idle_timeout_from_the_settings() -> None:
    assert (Settings().web_max_connections, Settings().web_idle_timeout_ms) == (100, 75_000)
    env = {"TICKWHEEL_WEB_MAX_CONNECTIONS": "7", "TICKWHEEL_WEB_IDLE_TIMEOUT_MS": "5000"}
    node = FakeNode(settings=Settings.from_env(env))
    server = WebServer(node, 0)  # type: ignore[arg-type]
    assert (server._max_connections, server._keepalive_s) == (7, 5.0)
