"""A cap on the HTTP edge's open connections (`ConnectionCap`), with room kept for the
orchestrator's probes and the scraper.

Each open connection holds one of the worker's file descriptors, which its Kafka sockets
and RocksDB files need too, and aiohttp opens as many as clients ask for. The cap lets
`limit` connections be served; past them a new connection first closes the one idle the
longest (no request in progress: an idle keep-alive, or a head not sent whole; bytes it
sends count as its activity), so that connections held open and silent cannot keep
anyone out. A request in progress is never cut for a newcomer: a body still arriving (up
to `BODY_TIMEOUT_S`), a route waiting for its command's answer. When every connection is
in a request, the new one takes one of `PROBE_ROOM` more slots, where only probes are
answered (`PROBES`, without a body: fast, so such a slot is soon idle again); anything
else asked there is answered 503 and its connection closed. With those taken too, a new
connection is answered 503 (`Retry-After: 1`) and closed at once.

Each connection closed or refused is counted (`tickwheel_http_connections_shed_total{why}`)
and logged, a line a minute at most (`LogLimit`); the open ones are a gauge
(`tickwheel_http_connections`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, Literal

import orjson
from aiohttp import web
from aiohttp.typedefs import Middleware
from aiohttp.web_protocol import RequestHandler
from prometheus_client import Counter, Gauge

from app.log_limit import LogLimit
from app.ops.json_answers import json_response

__all__ = ["PROBES", "PROBE_ROOM", "ConnectionCap", "Place", "place"]

logger = logging.getLogger(__name__)

PROBE_ROOM: Final = 2
"""Connections let in past the cap for probes alone: a liveness and a readiness probe, or
one of them and a scrape, at the same moment."""

PROBES: Final = frozenset({"/livez", "/readyz", "/healthz", "/metrics"})
"""What a connection of the probes' room may ask (GET or HEAD, no body)."""

Place = Literal["served", "probes", "refused"]


def place(served: int, probes: int, limit: int, room: int = PROBE_ROOM) -> Place:
    """Where a new connection goes, `served` connections open of `limit` and `probes` of
    the probes' `room`: served in full, let in for probes alone, or refused."""
    if served < limit:
        return "served"
    if probes < room:
        return "probes"
    return "refused"


@dataclass
class _Slot:
    probes_only: bool
    busy: bool = False  # a request's handler runs


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ConnectionCap:
    """The cap (see the module): `protocol` makes the listening socket's connections,
    `middleware` (the outermost) marks their requests in progress."""

    def __init__(
        self,
        limit: int,
        *,
        open_gauge: Gauge | None = None,
        shed: Counter | None = None,
        room: int = PROBE_ROOM,
    ) -> None:
        self.limit = limit
        self._room = room
        self._gauge = open_gauge
        self._shed = shed
        self._log = LogLimit()
        # Least recently active first (opened, sent bytes, began or ended a request).
        self._open: OrderedDict[RequestHandler, _Slot] = OrderedDict()
        self._probes = 0  # of them, let in on the probes' room

    @property
    def open(self) -> int:
        return len(self._open)

    def protocol(self, make: Callable[[], RequestHandler]) -> Callable[[], asyncio.Protocol]:
        """The protocol factory of the listening socket: aiohttp's handler (`make`, the
        runner's server) for a connection let in."""
        return lambda: _Capped(self, make)

    def admit(self, make: Callable[[], RequestHandler]) -> RequestHandler | None:
        """A new connection's handler, made room for; None: refused."""
        if self._place() != "served":
            # The scan is of the cap's few connections, and only once it is reached.
            idlest = next((h for h, s in self._open.items() if not s.busy), None)
            if idlest is not None:
                self._close(idlest)
        where = self._place()
        if where == "refused":
            self._count("refused")
            return None
        handler = make()
        self._open[handler] = _Slot(probes_only=where == "probes")
        self._probes += where == "probes"
        self._changed()
        return handler

    def _place(self) -> Place:
        return place(self.open - self._probes, self._probes, self.limit, self._room)

    def active(self, handler: RequestHandler) -> None:
        if handler in self._open:
            self._open.move_to_end(handler)

    def closed(self, handler: RequestHandler) -> None:
        if (slot := self._open.pop(handler, None)) is not None:
            self._probes -= slot.probes_only
            self._changed()

    def _close(self, handler: RequestHandler) -> None:
        self.closed(handler)
        handler.force_close()
        self._count("idle")

    def _changed(self) -> None:
        if self._gauge is not None:
            self._gauge.set(self.open)

    def _count(self, why: str) -> None:
        if self._shed is not None:
            self._shed.labels(why).inc()
        if (more := self._log.check(why)) is None:
            return
        said = {
            "idle": "an idle connection closed to let a new one in",
            "refused": "a new connection refused (503), every one in a request",
            "probe_only": "a request that is no probe answered 503 on a probe's connection",
        }[why]
        level = logging.INFO if why == "idle" else logging.WARNING
        logger.log(
            level, "http: %d connections open (cap %d): %s%s", self.open, self.limit, said, more
        )

    def middleware(self) -> Middleware:
        @web.middleware
        async def cap(request: web.Request, handler: Handler) -> web.StreamResponse:
            slot = self._open.get(request.protocol)
            if slot is None:  # let go meanwhile: closed under it
                return await handler(request)
            probe = request.method in ("GET", "HEAD") and request.path in PROBES
            if slot.probes_only and not (probe and not request.body_exists):
                self._count("probe_only")
                reason = "too many connections: this one is for probes only"
                response = json_response({"error": reason, "path": request.path}, 503)
                response.headers["Retry-After"] = "1"
                response.force_close()
                return response
            slot.busy = True
            self.active(request.protocol)
            try:
                return await handler(request)
            finally:
                slot.busy = False
                self.active(request.protocol)

        return cap


_REFUSED: Final = orjson.dumps({"error": "too many connections: try again"})
_REFUSAL: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\nRetry-After: 1\r\nConnection: close\r\n\r\n%s"
) % (len(_REFUSED), _REFUSED)


class _Capped(asyncio.Protocol):
    """One connection: aiohttp's handler once let in, every event passed on to it; or,
    refused, a 503 written and the connection closed (no handler made)."""

    def __init__(self, cap: ConnectionCap, make: Callable[[], RequestHandler]) -> None:
        self._cap = cap
        self._make = make
        self._handler: RequestHandler | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._handler = self._cap.admit(self._make)
        if self._handler is None:
            transport.write(_REFUSAL)
            transport.close()  # what was written is sent first
            return
        self._handler.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._handler is not None:
            self._cap.closed(self._handler)
            self._handler.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._handler is not None:
            self._cap.active(self._handler)
            self._handler.data_received(data)

    def eof_received(self) -> None:
        # aiohttp's ignores it (None: the transport closes, as it would for aiohttp's).
        if self._handler is not None:
            self._handler.eof_received()

    def pause_writing(self) -> None:
        if self._handler is not None:
            self._handler.pause_writing()

    def resume_writing(self) -> None:
        if self._handler is not None:
            self._handler.resume_writing()
