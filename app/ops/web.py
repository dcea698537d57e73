"""The node's HTTP edge: health, Prometheus metrics, the failure ledger and the operator page.

`GET /healthz` (200 while every partition given to the node runs, or it is idle in a
group that gave it none; 503 while one is restored, was let go on a failure and not taken
again yet, or its timer rounds keep failing), `GET /metrics`, `GET /ledger` (open entries as JSON).
`GET /` is the operator page (`app.ops.page`: partitions, timers, parked timers, the ledger, an
owner search with `?owner=<id>&tenant=<tenant>`, the lateness chart); its Retry and Skip
forms are `POST /timers/retry` and `POST /timers/skip` (303 back to the page, 400 for a
bad form, 403 for a form posted from another site). Anything else is a JSON 404/405 with
the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from yarl import URL

from app.ops.page import OperatorPage, Rendered, default_node_id

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
        self.page: OperatorPage | None = None

    async def start(self) -> None:
        app = web.Application(middlewares=[_errors])
        app.router.add_get("/healthz", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/ledger", self._ledger)
        app.router.add_get("/", self._page)
        app.router.add_post("/timers/retry", self._retry)
        app.router.add_post("/timers/skip", self._skip)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        for address in self._runner.addresses:  # the port chosen when asked for port 0
            self.port = int(address[1])
        self.page = OperatorPage(self._node, default_node_id(self.port))
        logger.info("http on %s:%d", self._host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _health(self, request: web.Request) -> web.Response:
        body = self._node.health()
        return _json(body, 200 if body["ready"] else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        await self._node.refresh_metrics()
        return web.Response(
            body=generate_latest(self._node.metrics.registry),
            headers={"Content-Type": CONTENT_TYPE_LATEST},
        )

    async def _ledger(self, request: web.Request) -> web.Response:
        entries = []
        for ledger in self._node.ledgers:
            entries += [e.model_dump(mode="json") for e in await ledger.entries()]
        return _json({"entries": entries})

    async def _page(self, request: web.Request) -> web.Response:
        assert self.page is not None
        return _html(await self.page.render(request.query, request.path_qs))

    async def _retry(self, request: web.Request) -> web.Response:
        return await self._act(request, "retry")

    async def _skip(self, request: web.Request) -> web.Response:
        return await self._act(request, "skip")

    async def _act(self, request: web.Request, action: str) -> web.Response:
        assert self.page is not None
        if not _same_site(request):
            return _html(self.page.error(403, "a form posted from another site is refused"))
        acted = await self.page.act(action, await request.post())
        if acted.location is not None:
            # Returned, not raised: the error middleware answers raised ones in JSON.
            return web.Response(status=303, headers={"Location": acted.location})
        assert acted.rendered is not None
        return _html(acted.rendered)


def _html(page: Rendered) -> web.Response:
    return web.Response(text=page.html, status=page.status, content_type="text/html")


def _same_site(request: web.Request) -> bool:
    """Whether a POST comes from this server's own page: a browser names the page's origin
    (and says whether it is cross-site); a client that says neither (curl) is let through."""
    if request.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
        return False
    origin = request.headers.get("Origin")
    return origin is None or URL(origin).raw_authority == request.host
