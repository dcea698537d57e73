"""The HTTP edge's HTML answers, as `app.ops.json_answers` holds its JSON ones: a page the
operator page rendered (`html_response`), under the pages' content security policy
(`CONTENT_SECURITY_POLICY`), and what a form posted to it did (`acted_response`: 303 back
to the page, or a page). May import `aiohttp` and `app.ops.page`."""

from __future__ import annotations

from typing import Final

from aiohttp import web

from app.ops.page import Acted, Rendered

__all__ = ["CONTENT_SECURITY_POLICY", "acted_response", "html_response"]

CONTENT_SECURITY_POLICY: Final = (
    "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
    "base-uri 'none'; frame-ancestors 'none'"
)
"""The pages' policy: no script at all (they have none), their inline style and SVG, forms
posted only to this server, never framed (a link a report smuggled in runs nothing)."""


def html_response(page: Rendered) -> web.Response:
    return web.Response(
        text=page.html,
        status=page.status,
        content_type="text/html",
        headers={"Content-Security-Policy": CONTENT_SECURITY_POLICY},
    )


def acted_response(acted: Acted) -> web.Response:
    if acted.location is not None:
        # Returned, not raised: the error middleware answers raised ones in JSON.
        return web.Response(status=303, headers={"Location": acted.location})
    assert acted.rendered is not None
    return html_response(acted.rendered)
