"""The node's HTTP edge: health, Prometheus metrics, the failure ledger and the operator page.

Health, for an orchestrator's two questions:

- `GET /livez`, liveness: 200 whenever the process's event loop answers (`{"live": true}`,
  with the uptime), whatever the broker and the partitions do, so that a probe restarts
  no pod during a broker outage; 503 only once the node failed for good (`failed`),
  which a restart is for;
- `GET /readyz`, readiness: 200 while every partition given to the node runs, or it is
  idle in a group that gave it none, and the broker answers; 503 while one is restored,
  was let go on a failure and not taken again yet, or its timer rounds keep failing, while
  the broker is away, or when the oldest write waiting to commit is older than a bound
  (when the node reports it: `commit_lag_s`). The body is the node's `health()`.
  `GET /healthz` is the same readiness (kept for what probes it already).

`GET /metrics`, `GET /ledger` (the newest open entries as JSON, `limit` of them: 1 to
10,000, default 1,000; `more` counts the older ones; `app.ops.page_ledger`).
`GET /timers/upcoming` lists the PENDING and FIRING timers of the node's own partitions
by due time (`app.ops.upcoming`):
query parameters `type`, `owner`, `tenant`, `target`, `target_type`, `due_from`,
`due_until` (ISO 8601 with offset, or epoch ms), `limit` (1 to 1000, default 50) and
`cursor` (a page's `next_cursor`); a bad one is a 400 naming it. Each partition is read
from where the page starts, `UPCOMING_CHUNK` timers a store call with a turn of the event
loop after each (`app.ops.upcoming_reads`), until no timer left in it can be on the page,
or `UPCOMING_SCAN` were read (`scanned_all` false when a scan stopped there: the page then
ends where the scan did; or when a partition's store failed, named in `unread`). A node
reads for one such request at a time: another waits up to `UPCOMING_WAIT_S` for its turn,
then is a 503 with `Retry-After`. `GET /` is the operator page
(`app.ops.page`: partitions, timers, parked timers, the ledger, an owner search with
`?owner=<id>&tenant=<tenant>`, the lateness chart); its Retry and Skip forms are
`POST /timers/retry` and `POST /timers/skip`, its timers' and jobs' buttons
`POST /page/timer` and `POST /page/job` (`app.ops.page_actions`) (303 back to the page,
400 for a bad form, 403 for a form posted from another site; a Retry or Skip waits for
every partition's answer: a 422 page when one FAILED, 504 when one did not answer in
time, `app.ops.page_timer_ops`). `PUT`, `DELETE` and
`GET /timers/{type}/{owner}/{key}` set, cancel and show a timer of a timer book
(`app.ops.timer_routes`); `GET /jobs` and
`POST /jobs/{context}/{job}/trigger|enable|disable|reschedule|backfill` list and act on
the service's jobs (`app.ops.job_routes`); and
`GET /openapi.json` describes every JSON route (`app.ops.openapi`). Anything else is a JSON
404/405 with the reason.

The web token (`TICKWHEEL_WEB_TOKEN`): when the node has one, every action (any method
but GET, HEAD and OPTIONS) needs it, sent as `Authorization: Bearer <token>` or, by the
operator page's forms, in a field and then a cookie (`app.ops.action_guard`, which every
action passes); reads stay open.

Connections: at most `TICKWHEEL_WEB_MAX_CONNECTIONS`, with room kept for the probes
(`app.ops.connection_cap`); one idle `TICKWHEEL_WEB_IDLE_TIMEOUT_MS` between requests, or
that long sending a head, is closed (aiohttp's keep-alive timeout); a body must arrive
within `BODY_TIMEOUT_S` (`app.ops.slow_body`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.errors import TickwheelError
from app.ops.action_guard import TOKEN_COOKIE, ActionGuard
from app.ops.client_faults import SERVER_LOG
from app.ops.connection_cap import ConnectionCap
from app.ops.forms import posted_form, without_token
from app.ops.html_answers import CONTENT_SECURITY_POLICY, acted_response, html_response
from app.ops.job_routes import JobRoutes
from app.ops.json_answers import errors_middleware, json_response
from app.ops.openapi import openapi_document
from app.ops.page import OperatorPage, default_node_id
from app.ops.page_actions import JOB_FORM, TIMER_FORM, PageActions
from app.ops.page_ledger import ledger_json
from app.ops.slow_body import BODY_TIMEOUT_S, body_deadline
from app.ops.timer_api import DEFAULT_WAIT_S
from app.ops.timer_routes import TimerRoutes
from app.ops.upcoming import BadQuery, UpcomingQuery, query_of
from app.ops.upcoming_reads import UPCOMING_SCAN, upcoming_answer
from app.protocol.topics import parse_aggregate_type

if TYPE_CHECKING:
    from app.node import Node

__all__ = [
    "CONTENT_SECURITY_POLICY",
    "TOKEN_COOKIE",
    "UPCOMING_SCAN",
    "UPCOMING_WAIT_S",
    "WebServer",
]

logger = logging.getLogger(__name__)

BACKLOG = 128
"""Connections the OS queues for the edge to accept (aiohttp's own)."""

STOP_GRACE_S = 2.0
"""How long a stop lets requests in flight end (aiohttp's own is 60 s). A request cut short
may still have sent its command: sent again with its request id, it is applied once."""

UPCOMING_WAIT_S = 5.0
"""The node reads for one `GET /timers/upcoming` at a time: the route is open without the
web token, and requests at once had taken the loop's turns for all their partitions'
scans together. Another request waits this long for its turn, then is answered busy (503)."""


class WebServer:
    def __init__(
        self,
        node: Node,
        port: int,
        host: str = "127.0.0.1",
        *,
        timer_wait_s: float = DEFAULT_WAIT_S,
        body_timeout_s: float = BODY_TIMEOUT_S,
        keepalive_s: float | None = None,
        max_connections: int | None = None,
    ) -> None:
        """`keepalive_s` (how long a connection may idle or take to send a request's head)
        and `max_connections` (`app.ops.connection_cap`): the node's settings' when None."""
        settings = node.settings
        self._node = node
        self._timers = TimerRoutes(node, timer_wait_s)
        self._jobs = JobRoutes(node, timer_wait_s)
        self._host = host
        self._port = port
        self._timer_wait_s = timer_wait_s
        self._body_timeout_s = body_timeout_s
        idle_s = settings.web_idle_timeout_ms / 1000
        self._keepalive_s = idle_s if keepalive_s is None else keepalive_s
        self._max_connections = (
            settings.web_max_connections if max_connections is None else max_connections
        )
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        self._started = time.monotonic()
        self.port = port
        self.page: OperatorPage | None = None
        self._guard = ActionGuard(settings)
        self._upcoming_reads = asyncio.Lock()
        self.upcoming_wait_s = UPCOMING_WAIT_S

    async def start(self) -> None:
        metrics = self._node.metrics
        self._cap = ConnectionCap(
            self._max_connections,
            open_gauge=metrics.http_connections,
            shed=metrics.http_connections_shed,
        )
        # The cap's first: a request is in progress from its start. The body's bound next:
        # it covers the guard's read of a form too.
        guard = self._guard.middleware(lambda: self.page)
        deadline = body_deadline(self._body_timeout_s)
        bounded = [self._cap.middleware(), deadline, errors_middleware, guard]
        app = web.Application(middlewares=bounded)
        app.router.add_get("/livez", self._live)
        app.router.add_get("/readyz", self._ready)
        app.router.add_get("/healthz", self._ready)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/ledger", self._ledger)
        app.router.add_get("/timers/upcoming", self._upcoming)
        app.router.add_get("/openapi.json", self._openapi)
        self._timers.add_to(app)
        self._jobs.add_to(app)
        app.router.add_get("/", self._page)
        app.router.add_post("/timers/retry", self._retry)
        app.router.add_post("/timers/skip", self._skip)
        app.router.add_post(TIMER_FORM, self._timer_form)
        app.router.add_post(JOB_FORM, self._job_form)
        self._runner = web.AppRunner(
            app,
            access_log=None,
            shutdown_timeout=STOP_GRACE_S,
            logger=SERVER_LOG,
            keepalive_timeout=self._keepalive_s,
        )
        await self._runner.setup()
        server = self._runner.server
        assert server is not None
        # Listened on as aiohttp's `TCPSite` would, each connection through the cap.
        self._listener = await asyncio.get_running_loop().create_server(
            self._cap.protocol(server), self._host, self._port, backlog=BACKLOG
        )
        for sock in self._listener.sockets:  # the port chosen when asked for port 0
            self.port = int(sock.getsockname()[1])
        self.page = OperatorPage(self._node, default_node_id(self.port), wait_s=self._timer_wait_s)
        self.page.actions = PageActions(self._node, self.page, self._timer_wait_s)
        logger.info(
            "http on %s:%d (actions %s)",
            self._host,
            self.port,
            "need the web token" if self._guard.has_token else "open: no web token set",
        )

    async def stop(self) -> None:
        """Stops listening; requests in flight have `STOP_GRACE_S` to end, then are cut
        (the node's run is stopped first: a request waiting for its command's answer would
        wait its whole wait, the node's partitions held unworked meanwhile)."""
        if self._listener is not None:
            self._listener.close()  # its connections are the runner's to close
        if self._runner is not None:
            await self._runner.cleanup()

    # --- health ------------------------------------------------------------------------

    async def _live(self, request: web.Request) -> web.Response:
        uptime = round(time.monotonic() - self._started, 3)
        failed = self._node.health().get("failed")
        if failed is not None:
            return json_response({"live": False, "failed": failed, "uptime_s": uptime}, 503)
        return json_response({"live": True, "uptime_s": uptime})

    async def _ready(self, request: web.Request) -> web.Response:
        # The node's own verdict (`node_health`): the page, the node report and the
        # cluster's status read the same.
        body = self._node.health()
        return json_response(body, 200 if body["ready"] else 503)

    # --- reads -------------------------------------------------------------------------

    async def _metrics(self, request: web.Request) -> web.Response:
        await self._node.refresh_metrics()
        return web.Response(
            body=generate_latest(self._node.metrics.registry),
            headers={"Content-Type": CONTENT_TYPE_LATEST},
        )

    async def _ledger(self, request: web.Request) -> web.Response:
        query = {k: request.query.getone(k) for k in request.query}
        status, body = await ledger_json(self._node.ledgers, query)
        return json_response(body, status)

    async def _upcoming(self, request: web.Request) -> web.Response:
        types = self._node.types
        try:
            query = query_of({k: request.query.getone(k) for k in request.query})
            if query.type is not None:
                parse_aggregate_type(query.type)
                if query.type not in types:
                    known = ", ".join(sorted(types)) or "none"
                    raise BadQuery(f"type: this node keeps no timers of {query.type} ({known})")
        except (BadQuery, TickwheelError) as exc:
            return json_response({"error": str(exc)}, 400)
        try:
            async with asyncio.timeout(self.upcoming_wait_s):
                await self._upcoming_reads.acquire()
        except TimeoutError:
            busy = (
                f"another request is reading upcoming timers on this node (waited "
                f"{self.upcoming_wait_s:g} s): try again shortly"
            )
            return json_response({"error": busy}, 503, {"Retry-After": "1"})
        try:
            return await self._upcoming_read(query)
        finally:
            self._upcoming_reads.release()

    async def _upcoming_read(self, query: UpcomingQuery) -> web.Response:
        types = self._node.types
        parts = [
            (name, kept.store, self._node.owned_of(name))
            for name, kept in sorted(types.items())
            if query.type in (None, name)
        ]
        try:
            answer = await upcoming_answer(parts, query, sorted(self._node.health()["owned"]))
        except BadQuery as exc:
            return json_response({"error": str(exc)}, 400)
        return json_response(answer.model_dump(mode="json"))

    async def _openapi(self, request: web.Request) -> web.Response:
        from app import __version__  # the package root imports this module's package

        return json_response(openapi_document(__version__))

    async def _page(self, request: web.Request) -> web.Response:
        assert self.page is not None
        return html_response(await self.page.render(request.query, request.path_qs))

    # --- actions -----------------------------------------------------------------------

    async def _retry(self, request: web.Request) -> web.Response:
        return await self._act(request, "retry")

    async def _skip(self, request: web.Request) -> web.Response:
        return await self._act(request, "skip")

    async def _timer_form(self, request: web.Request) -> web.Response:
        assert self.page is not None and self.page.actions is not None
        return acted_response(
            await self.page.actions.timer(without_token(await posted_form(request)))
        )

    async def _job_form(self, request: web.Request) -> web.Response:
        assert self.page is not None and self.page.actions is not None
        return acted_response(
            await self.page.actions.job(without_token(await posted_form(request)))
        )

    async def _act(self, request: web.Request, action: str) -> web.Response:
        assert self.page is not None
        return acted_response(
            await self.page.act(action, without_token(await posted_form(request)))
        )
