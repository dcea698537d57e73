"""A bound on how long a request's body may take to arrive (`body_deadline`).

aiohttp bounds no body: a client that sends its head (`Content-Length: 1000`) and a few
bytes of the body, then nothing, held the connection and the route's handler, waiting in
its read, for as long as it liked (aiohttp's keep-alive timeout only closes a connection
with no request in progress). The middleware gives the body `BODY_TIMEOUT_S` from the
moment the handler is called; once it has all come in the bound is off (a route then waits
for its command's answer as long as its own wait says). Past it the handler is cancelled,
the client is answered 408 and the connection closed, and one INFO line says so (at most
one a minute, as `app.ops.client_faults` logs a client's other faults).

The head (the request line and headers) is aiohttp's to bound: a connection that has not
sent a whole head is closed the keep-alive timeout (`TICKWHEEL_WEB_IDLE_TIMEOUT_MS`, 75 s)
after it opened or after its last answer, as is one idle that long between requests. That
timeout never cuts a request in progress: a slow body has this bound, whatever it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Middleware

from app.log_limit import LogLimit
from app.ops.json_answers import json_response

__all__ = ["BODY_TIMEOUT_S", "body_deadline"]

logger = logging.getLogger(__name__)

BODY_TIMEOUT_S: Final = 30.0
"""How long a request's body may take to arrive, all of it (bodies are at most aiohttp's
1 MiB: 35 KB/s)."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def body_deadline(seconds: float = BODY_TIMEOUT_S, limit: LogLimit | None = None) -> Middleware:
    """The middleware bounding a request's body to `seconds` (see the module)."""
    limit = limit or LogLimit()

    @web.middleware
    async def deadline(request: web.Request, handler: Handler) -> web.StreamResponse:
        body = request.content
        if body.is_eof():  # no body, or all of it came with the head
            return await handler(request)
        waiting = True

        def arrived() -> None:
            # Called by the parser once the body's last byte is in (maybe after the
            # handler returned without reading it, or after the bound ran out).
            if waiting and not bound.expired():  # expiring already: too late, a 408
                bound.reschedule(None)

        try:
            async with asyncio.timeout(seconds) as bound:
                body.on_eof(arrived)
                return await handler(request)
        except TimeoutError:
            if not bound.expired():
                raise  # the handler's own
        finally:
            waiting = False
        # The handler waited in its read (routes read the body first): it is cancelled.
        # A handler that does not read a body larger than aiohttp's buffer (128 KiB) is
        # cut here too, its body never taken in; no route of this edge does that.
        if (more := limit.check()) is not None:
            logger.info(
                "%s %s: its body did not all arrive within %g s; answered 408 and its "
                "connection closed (the client's fault, not this node's)%s",
                request.method,
                request.path,
                seconds,
                more,
            )
        return await _timed_out(request, seconds)

    return deadline


async def _timed_out(request: web.Request, seconds: float) -> web.StreamResponse:
    """Answers 408 and closes the connection at once: aiohttp would otherwise linger up to
    10 s reading the rest of the body."""
    reason = f"the request's body did not arrive within {seconds:g} s"
    response = json_response({"error": reason, "path": request.path}, 408)
    response.force_close()
    with contextlib.suppress(ConnectionError):  # the client went away meanwhile
        await response.prepare(request)
        await response.write_eof()
    request.protocol.force_close()  # the answer written is sent, then the socket closed
    return response
