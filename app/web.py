"""The node's HTTP edge: health, Prometheus metrics and the failure ledger, read-only.

`GET /healthz` (200 while every partition given to the node runs, or it is idle in a
group that gave it none; 503 while one is restored, was let go on a failure and not taken
again yet, or its timer rounds keep failing), `GET /metrics`, `GET /ledger` (open entries as JSON).
Anything else is a JSON 404/405 with the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

if TYPE_CHECKING:
    from app.node import Node

__all__ = ["WebServer"]

logger = logging.getLogger(__name__)


def _json(data: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


@web.middleware
async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        return _json({"error": exc.reason, "path": request.path}, exc.status)


class WebServer:
    def __init__(self, node: Node, port: int, host: str = "127.0.0.1") -> None:
        self._node = node
        self._host = host
        self._port = port
        self._runner: web.AppRunner | None = None
        self.port = port

    async def start(self) -> None:
        app = web.Application(middlewares=[_errors])
        app.router.add_get("/healthz", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/ledger", self._ledger)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        for address in self._runner.addresses:  # the port chosen when asked for port 0
            self.port = int(address[1])
        logger.info("http on %s:%d", self._host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _health(self, request: web.Request) -> web.Response:
        body = self._node.health()
        return _json(body, 200 if body["ready"] else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self._node.metrics.registry),
            headers={"Content-Type": CONTENT_TYPE_LATEST},
        )

    async def _ledger(self, request: web.Request) -> web.Response:
        entries = []
        for ledger in self._node.ledgers:
            entries += [e.model_dump(mode="json") for e in await ledger.entries()]
        return _json({"entries": entries})
