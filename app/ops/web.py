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
`cursor` (a page's `next_cursor`); a bad one is a 400 naming it. It reads at most
`UPCOMING_SCAN` timers per type and partition, earliest first (`scanned_all` false when a
scan stopped there: the page then ends where the scan did; or when a partition's store
failed, named in `unread`). `GET /` is the operator page
(`app.ops.page`: partitions, timers, parked timers, the ledger, an owner search with
`?owner=<id>&tenant=<tenant>`, the lateness chart); its Retry and Skip forms are
`POST /timers/retry` and `POST /timers/skip`, its timers' and jobs' buttons
`POST /page/timer` and `POST /page/job` (`app.ops.page_actions`) (303 back to the page,
400 for a bad form, 403 for a form posted from another site). `PUT`, `DELETE` and
`GET /timers/{type}/{owner}/{key}` set, cancel and show a timer of a timer book
(`app.ops.timer_routes`); `GET /jobs` and
`POST /jobs/{context}/{job}/trigger|enable|disable|reschedule|backfill` list and act on
the service's jobs (`app.ops.job_routes`); and
`GET /openapi.json` describes every JSON route (`app.ops.openapi`). Anything else is a JSON
404/405 with the reason.

The web token (`TICKWHEEL_WEB_TOKEN`): when the node has one, every action (any method
but GET, HEAD and OPTIONS) needs it; reads stay open. A client sends it as
`Authorization: Bearer <token>` (a wrong one: 401); the operator page's forms, which
cannot, are answered with a page asking for it (401) that posts the form again with the
token (the `web_token` field), and once it is right the browser keeps a cookie
(HttpOnly, SameSite=Strict) proving it. Tokens are compared in constant time; the cookie
holds a digest of the token, not the token.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from yarl import URL

from app.errors import TickwheelError
from app.ops.client_faults import SERVER_LOG
from app.ops.forms import TOKEN_FIELD, posted_form, without_token
from app.ops.job_routes import JobRoutes
from app.ops.json_answers import errors_middleware, json_response, store_failed
from app.ops.openapi import openapi_document
from app.ops.origin import browser_write, known_host, same_site
from app.ops.page import Acted, OperatorPage, Rendered, default_node_id
from app.ops.page_actions import JOB_FORM, TIMER_FORM, PageActions
from app.ops.page_ledger import ledger_json
from app.ops.slow_body import BODY_TIMEOUT_S, KEEPALIVE_S, body_deadline
from app.ops.timer_api import DEFAULT_WAIT_S
from app.ops.timer_routes import TimerRoutes
from app.ops.upcoming import (
    BadQuery,
    SortKey,
    UpcomingAnswer,
    page_share,
    query_of,
    sort_key,
    upcoming_page,
)
from app.protocol.topics import parse_aggregate_type
from tables import StoreClosed, StoreError, Timer
from tables.bounds import MAX_INT64

if TYPE_CHECKING:
    from app.node import Node

__all__ = [
    "CONTENT_SECURITY_POLICY",
    "TOKEN_COOKIE",
    "UPCOMING_SCAN",
    "WebServer",
]

logger = logging.getLogger(__name__)

STOP_GRACE_S = 2.0
"""How long a stop lets requests in flight end (aiohttp's own is 60 s). A request cut short
may still have sent its command: sent again with its request id, it is applied once."""


TOKEN_COOKIE = "tickwheel_web_token"

UPCOMING_SCAN = 10_000
"""`GET /timers/upcoming` reads at most this many timers per type and partition: a
request costs a bounded scan however large a partition grows, and holds one scan at a
time (of each, what its page may take: `page_share`), however many partitions."""

_READS = frozenset({"GET", "HEAD", "OPTIONS"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _digest(text: str) -> bytes:
    # aiohttp hands a header's bytes that are not UTF-8 on as lone surrogates: encoded as
    # they came, never a UnicodeEncodeError (a 500 before the token is even compared).
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


class WebServer:
    def __init__(
        self,
        node: Node,
        port: int,
        host: str = "127.0.0.1",
        *,
        timer_wait_s: float = DEFAULT_WAIT_S,
        body_timeout_s: float = BODY_TIMEOUT_S,
        keepalive_s: float = KEEPALIVE_S,
    ) -> None:
        self._node = node
        self._timers = TimerRoutes(node, timer_wait_s)
        self._jobs = JobRoutes(node, timer_wait_s)
        self._host = host
        self._port = port
        self._timer_wait_s = timer_wait_s
        self._body_timeout_s = body_timeout_s
        self._keepalive_s = keepalive_s
        self._runner: web.AppRunner | None = None
        self._started = time.monotonic()
        self.port = port
        self.page: OperatorPage | None = None
        # Besides IP addresses and localhost, the names a browser may reach it under: its
        # page's address as the other nodes link to it, and the host it listens on.
        settings = node.settings
        named = [URL(settings.web_url).raw_host or ""] if settings.web_url else []
        self._names = frozenset(n.lower().rstrip(".") for n in [*named, settings.web_host] if n)
        token = settings.web_token
        secret = token.get_secret_value() if token is not None else ""
        self._token = _digest(secret) if secret else None
        # What the browser's cookie holds: derived from the token, useless as a token.
        self._cookie = (
            hmac.new(secret.encode(), b"tickwheel web cookie", hashlib.sha256).hexdigest()
            if secret
            else None
        )

    async def start(self) -> None:
        # The body's bound first: it covers the guard's read of a form too.
        bounded = [body_deadline(self._body_timeout_s), errors_middleware, self._guard()]
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
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        for address in self._runner.addresses:  # the port chosen when asked for port 0
            self.port = int(address[1])
        self.page = OperatorPage(self._node, default_node_id(self.port))
        self.page.actions = PageActions(self._node, self.page, self._timer_wait_s)
        logger.info(
            "http on %s:%d (actions %s)",
            self._host,
            self.port,
            "need the web token" if self._token is not None else "open: no web token set",
        )

    async def stop(self) -> None:
        """Stops listening; requests in flight have `STOP_GRACE_S` to end, then are cut
        (the node's run is stopped first: a request waiting for its command's answer would
        wait its whole wait, the node's partitions held unworked meanwhile)."""
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
        owned = sorted(self._node.health()["owned"])
        until = MAX_INT64 if query.due_until is None else query.due_until
        rows: list[Timer] = []
        horizon: SortKey | None = None
        # A partition whose store failed (a damaged block: its task restores it): the
        # others answered, this one named.
        unread: dict[str, str] = {}
        for name, kept in sorted(types.items()):
            if query.type not in (None, name):
                continue
            for p in sorted(self._node.owned_of(name)):
                try:
                    got = await kept.store.due({p}, until, UPCOMING_SCAN)
                except StoreClosed:
                    continue  # let go while this was read: no longer this node's
                except StoreError as exc:
                    store_failed(exc)
                    unread[f"{name}[{p}]"] = str(exc)[:500]
                    continue
                rows += page_share(got, query)  # the scan is let go: one at a time
                if len(got) == UPCOMING_SCAN:
                    last = sort_key(got[-1])
                    horizon = last if horizon is None else min(horizon, last)
        try:
            page = upcoming_page(rows, query, horizon)
        except BadQuery as exc:
            return json_response({"error": str(exc)}, 400)
        answer = UpcomingAnswer(
            timers=page.timers,
            next_cursor=page.next_cursor,
            partitions=owned,
            scanned_all=horizon is None and not unread,
            unread=unread,
        )
        return json_response(answer.model_dump(mode="json"))

    async def _openapi(self, request: web.Request) -> web.Response:
        from app import __version__  # the package root imports this module's package

        return json_response(openapi_document(__version__))

    async def _page(self, request: web.Request) -> web.Response:
        assert self.page is not None
        return _html(await self.page.render(request.query, request.path_qs))

    # --- actions -----------------------------------------------------------------------

    async def _retry(self, request: web.Request) -> web.Response:
        return await self._act(request, "retry")

    async def _skip(self, request: web.Request) -> web.Response:
        return await self._act(request, "skip")

    async def _timer_form(self, request: web.Request) -> web.Response:
        assert self.page is not None and self.page.actions is not None
        return _acted(await self.page.actions.timer(without_token(await posted_form(request))))

    async def _job_form(self, request: web.Request) -> web.Response:
        assert self.page is not None and self.page.actions is not None
        return _acted(await self.page.actions.job(without_token(await posted_form(request))))

    async def _act(self, request: web.Request, action: str) -> web.Response:
        assert self.page is not None
        return _acted(await self.page.act(action, without_token(await posted_form(request))))

    def _guard(self) -> Middleware:
        """The middleware every action passes: from this server's own page (or no
        browser), and with the web token when the node has one."""

        @web.middleware
        async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
            if request.method in _READS or request.match_info.http_exception is not None:
                return await handler(request)  # a read, or a 404/405 answered as such
            assert self.page is not None
            if not same_site(request):
                return _html(self.page.error(403, "a form posted from another site is refused"))
            if self._token is None:
                if browser_write(request) and not known_host(request, self._names):
                    why = (
                        f"this node is not known as {request.host!r}: set TICKWHEEL_WEB_URL "
                        "to the address its page is reached at, or a web token"
                    )
                    return _html(self.page.error(403, why))
                return await handler(request)
            # Another scheme (a proxy's Basic credentials, say) is not this node's to judge.
            scheme, _, bearer = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() == "bearer":
                if self._is_token(bearer.strip()):
                    return await handler(request)
                return _unauthorized("not this node's web token", invalid=True)
            if self._is_cookie(request.cookies.get(TOKEN_COOKIE)):
                return await handler(request)
            if request.content_type in _FORMS:
                form = await posted_form(request)
                given = form.get(TOKEN_FIELD)
                if isinstance(given, str) and self._is_token(given.strip()):
                    response = await handler(request)
                    assert self._cookie is not None
                    response.set_cookie(
                        TOKEN_COOKIE,
                        self._cookie,
                        path="/",
                        httponly=True,
                        samesite="Strict",
                        secure=request.secure,
                    )
                    return response
                if "text/html" in request.headers.get("Accept", ""):  # a browser's form
                    fields = [(k, v) for k, v in without_token(form).items() if isinstance(v, str)]
                    asked = self.page.token_form(request.path, fields, wrong=given is not None)
                    return _html(asked)
                if given is not None:
                    return _unauthorized("not this node's web token", invalid=True)
            return _unauthorized(
                "this node's actions need its web token: "
                "send it as the header 'Authorization: Bearer <token>'"
            )

        return guard

    def _is_token(self, given: str) -> bool:
        assert self._token is not None
        return hmac.compare_digest(_digest(given), self._token)

    def _is_cookie(self, given: str | None) -> bool:
        if given is None or self._cookie is None:
            return False
        return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), self._cookie.encode())


_FORMS = frozenset({"application/x-www-form-urlencoded", "multipart/form-data"})


def _unauthorized(reason: str, *, invalid: bool = False) -> web.Response:
    challenge = 'Bearer realm="tickwheel"' + (', error="invalid_token"' if invalid else "")
    response = json_response({"error": reason}, 401)
    response.headers["WWW-Authenticate"] = challenge
    return response


CONTENT_SECURITY_POLICY: Final = (
    "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
    "base-uri 'none'; frame-ancestors 'none'"
)
"""The pages' policy: no script at all (they have none), their inline style and SVG, forms
posted only to this server, never framed (a link a report smuggled in runs nothing)."""


def _html(page: Rendered) -> web.Response:
    return web.Response(
        text=page.html,
        status=page.status,
        content_type="text/html",
        headers={"Content-Security-Policy": CONTENT_SECURITY_POLICY},
    )


def _acted(acted: Acted) -> web.Response:
    if acted.location is not None:
        # Returned, not raised: the error middleware answers raised ones in JSON.
        return web.Response(status=303, headers={"Location": acted.location})
    assert acted.rendered is not None
    return _html(acted.rendered)
