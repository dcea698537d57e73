"""A client that never finishes its request (a slowloris on the operator API): the body's
bound (`app.ops.slow_body`) answers it 408 and frees its handler and connection; a body
that arrived in time is not cut however long its route then takes; a head never finished
is closed by aiohttp's keep-alive timeout. A real server on 127.0.0.1 port 0, started as
the node's, and a raw socket client; the bounds are made small through `WebServer`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from fakes import FakeNode
from multidict import MultiMapping

import app.ops.web
from app.ops.forms import posted_form
from app.ops.page import Acted
from app.ops.web import WebServer

# Every read of the client is bounded by this: without the bounds under test it would
# wait the default keep-alive timeout (75 s) or for ever.
OUTER_S = 15.0

_HEAD = (
    b"POST /timers/retry HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: %d\r\n\r\n"
)
_FORM = b"type=shop.order&owner=o&key=k"


@asynccontextmanager
async def serving(**bounds: float) -> AsyncIterator[WebServer]:
    server = WebServer(FakeNode(), 0, **bounds)  # type: ignore[arg-type]
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def answer_of(reader: asyncio.StreamReader) -> bytes:
    """All the server sends until it closes the connection."""
    return await asyncio.wait_for(reader.read(), OUTER_S)


async def test_a_body_that_never_finishes_is_answered_408_and_its_connection_closed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    async with serving(body_timeout_s=0.2) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(_HEAD % 1000 + b"type=sh")  # then nothing
        await writer.drain()
        got = await answer_of(reader)  # the server closed it: the handler let go
        writer.close()
        assert got.startswith(b"HTTP/1.1 408 "), got
        assert b"did not arrive within 0.2 s" in got
        # The server still answers.
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert (await answer_of(reader)).startswith(b"HTTP/1.1 200 ")
        writer.close()
    said = [r for r in caplog.records if r.name == "app.ops.slow_body"]
    assert [r.levelno for r in said] == [logging.INFO]
    assert "POST /timers/retry: its body did not all arrive within 0.2 s" in said[0].getMessage()
    assert [r.getMessage() for r in caplog.records if r.exc_info or r.levelno > logging.INFO] == []


async def test_a_body_in_time_is_not_cut_however_long_its_route_then_takes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bound = 0.3
    reading = asyncio.Event()

    async def posted(request: object) -> object:
        reading.set()  # the handler is in its read, the body not all sent: the bound runs
        return await posted_form(request)  # type: ignore[arg-type]

    async def act(action: str, form: MultiMapping[object]) -> Acted:
        assert form["owner"] == "o"
        await asyncio.sleep(3 * bound)  # a command whose answer takes longer than the bound
        return Acted(location="/?done")

    monkeypatch.setattr(app.ops.web, "posted_form", posted)
    async with serving(body_timeout_s=bound) as server:
        assert server.page is not None
        monkeypatch.setattr(server.page, "act", act)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(_HEAD % len(_FORM) + _FORM[:5])
        await writer.drain()
        await asyncio.wait_for(reading.wait(), OUTER_S)
        writer.write(_FORM[5:])
        await writer.drain()
        got = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), OUTER_S)
        writer.close()
    assert got.startswith(b"HTTP/1.1 303 "), got


async def test_a_head_that_never_finishes_is_closed_by_the_keepalive_timeout() -> None:
    # aiohttp bounds the head itself (no request is in progress yet): `keepalive_s`.
    async with serving(keepalive_s=0.2) as server:
        for sent in (b"POST /timers/ret", _HEAD.split(b"\r\n", 2)[0] + b"\r\nHost: 127"):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(sent)
            await writer.drain()
            assert await answer_of(reader) == b""  # closed unanswered
            writer.close()
