"""A client's malformed request, logged as such and not as the node's error.

aiohttp's server logs a request it cannot parse (a bad request line, header or URL, no
`Host`, a line too long) and a body it cannot read once the route has answered
(`Content-Encoding: gzip` on bytes that are not) at ERROR with a traceback, though it
answered 400 and nothing of the node failed: anyone who reaches the port could fill the
log with tracebacks. The HTTP edge gives aiohttp `SERVER_LOG`, whose filter turns each
into one INFO line naming what was wrong, at most one a minute of each kind (`LogLimit`,
the next saying how many were not logged); any other record (a route's 500) passes as
it is.
"""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from app.log_limit import LogLimit

__all__ = ["SERVER_LOG", "ClientFaults", "client_fault"]

logger = logging.getLogger(__name__)


def client_fault(exc: BaseException | None) -> str | None:
    """What the client got wrong, when `exc` (of a record aiohttp's server logged) is a
    request or a body it could not read; None for anything else."""
    if isinstance(exc, web.RequestPayloadError):
        cause = exc.__cause__
        why = cause.message if isinstance(cause, HttpProcessingError) else str(exc)
        return f"its body cannot be read: {_said(why)}"
    if isinstance(exc, HttpProcessingError) and 400 <= exc.code < 500:
        return _said(exc.message) or type(exc).__name__
    return None


def _said(text: str) -> str:
    """An aiohttp error's message on one line: a parser's adds the line as it came (its
    bytes' repr) under the reason, and a caret under the fault, which is left out."""
    lines = [line.strip() for line in text.splitlines() if line.strip().strip("^")]
    return " ".join(lines[:2])[:300]


class ClientFaults(logging.Filter):
    """Drops a record of a client's fault (`client_fault`), logging one INFO line in its
    place at most once a minute per kind (`limit`'s interval)."""

    def __init__(self, limit: LogLimit | None = None) -> None:
        super().__init__()
        self._limit = limit or LogLimit()

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        why = client_fault(exc)
        if why is None:
            return True
        if (more := self._limit.check(type(exc))) is not None:
            what = record.getMessage()
            logger.info("%s: %s (the client's fault, not this node's)%s", what, why, more)
        return False


SERVER_LOG = logging.getLogger("app.ops.web.server")
"""The logger of the HTTP edge's aiohttp server (`aiohttp.server`'s records)."""
SERVER_LOG.addFilter(ClientFaults())
