"""The HTTP edge's JSON answers: one response maker for every route, and the middleware
that answers what no route did (a bad query, an HTTP error raised, a body that cannot be
read, the broker away or a partition handed over, a client gone) with JSON instead of
aiohttp's plain-text 500."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from app.errors import KafkaUnavailable
from app.log_limit import LogLimit
from app.ops.forms import path_problem, query_problem
from tables import StoreClosed, StoreError

__all__ = ["errors_middleware", "json_response", "store_failed"]

logger = logging.getLogger(__name__)

_STORE_FAILURES = LogLimit()


def store_failed(exc: StoreError) -> None:
    """Logs a store failure a read of the HTTP edge met (a damaged block of a partition):
    a read no timer round makes (far-future timers) is told nowhere else. At most a line
    a minute per partition."""
    if (more := _STORE_FAILURES.check(exc.partition)) is not None:
        logger.error(
            "a read of partition %s's store failed: %s; its copy is restored from its"
            " changelog when its task meets it, or the worker restarts%s",
            exc.partition,
            exc,
            more,
        )


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_response(
    data: object, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=orjson.dumps(data), status=status, content_type="application/json", headers=headers
    )


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    # The page ("/") says what is wrong with its own search, on a page.
    raw = request.rel_url.raw_query_string
    if request.path != "/" and (why := query_problem(request.query, raw)):
        return json_response({"error": why, "path": request.path}, 400)
    if why := path_problem(request.rel_url.raw_path):
        return json_response({"error": why, "path": request.rel_url.raw_path}, 400)
    try:
        return await handler(request)
    except web.HTTPException as exc:
        return json_response({"error": exc.reason, "path": request.path}, exc.status)
    except web.RequestPayloadError as exc:
        # A body its own encoding does not give (`Content-Encoding: gzip` on bytes that are
        # not): the client's mistake, as a body that is no JSON is.
        cause = exc.__cause__
        reason = cause.message if isinstance(cause, HttpProcessingError) else str(exc)
        body = {"error": f"the body cannot be read: {reason}", "path": request.path}
        return json_response(body, 400)
    except (KafkaUnavailable, StoreError) as exc:
        if not isinstance(exc, KafkaUnavailable | StoreClosed):
            store_failed(exc)
        # The broker away, a partition handed over while it was read, or its store failed
        # (its task restores it from the changelog): the request may be sent again (routes
        # that say more answer it themselves), never a 500.
        retry = "1" if isinstance(exc, StoreClosed) else "5"
        return json_response(
            {"error": f"unavailable: {str(exc)[:500]}", "path": request.path},
            503,
            {"Retry-After": retry},
        )
    except ConnectionError:
        if request.transport is not None:
            raise
        # The client went away while its body was read: no one to answer, and nothing of
        # the node failed (aiohttp would log a 500 with a traceback). Never sent.
        logger.debug("%s %s: the client went away unanswered", request.method, request.path)
        return json_response({"error": "the client went away", "path": request.path}, 400)
