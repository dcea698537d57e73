"""Whether a write comes from this server's own page: the checks every action of the HTTP
edge passes before its token (`app.ops.action_guard`).

A browser names the page's origin and says whether a request is cross-site: a form
another site posts is refused (`same_site`). A name of the attacker's own that resolves
to this node's address (DNS rebinding) makes the browser's origin and the request's
`Host` agree, so without a web token a browser's write must also come to a name this
node knows (`known_host`): an IP address, `localhost`, `TICKWHEEL_WEB_HOST` or the host
of `TICKWHEEL_WEB_URL`. A client that is no browser (curl) says neither and is let through:
only the token guards against it."""

from __future__ import annotations

import ipaddress

from aiohttp import web
from yarl import URL

__all__ = ["browser_write", "known_host", "same_site"]


def same_site(request: web.Request) -> bool:
    """Whether a POST comes from this server's own page: a browser names the page's origin
    (and says whether it is cross-site); a client that says neither (curl) is let through."""
    if request.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
        return False
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    try:
        return URL(origin).raw_authority == request.host
    except ValueError:  # `http://[`, a port past 65535: no page of this server sent it
        return False


def browser_write(request: web.Request) -> bool:
    """Whether a browser sent it: it says where from (`Origin`, `Sec-Fetch-Site`)."""
    return "Origin" in request.headers or "Sec-Fetch-Site" in request.headers


def known_host(request: web.Request, names: frozenset[str]) -> bool:
    """Whether the request's `Host` names this node as it knows itself: an IP address,
    `localhost` (or a name under it), or one of `names` (lowercase)."""
    try:
        host = URL(f"http://{request.host}").raw_host or ""
    except ValueError:
        return False
    host = host.lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost") or host in names:
        return True
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True
