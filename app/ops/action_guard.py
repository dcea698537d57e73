"""The guard every action of the HTTP edge (`app.ops.web`) passes, any method but GET, HEAD
and OPTIONS (reads stay open): from this server's own page, or from no browser
(`app.ops.origin`), and with the web token (`TICKWHEEL_WEB_TOKEN`) when the node has one.

A client sends the token as `Authorization: Bearer <token>` (a wrong one: 401); the
operator page's forms, which cannot, are answered with a page asking for it (401) that
posts the form again with the token (the `web_token` field), and once it is right the
browser keeps a cookie (`TOKEN_COOKIE`: HttpOnly, SameSite=Strict) proving it. Tokens are
compared in constant time; the cookie holds a digest of the token, not the token.
May import `aiohttp`, `yarl`, `app.node`'s settings, and `app.ops`'s forms, origin, page,
json_answers and html_answers."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web
from aiohttp.typedefs import Middleware
from yarl import URL

from app.ops.forms import TOKEN_FIELD, posted_form, without_token
from app.ops.html_answers import html_response
from app.ops.json_answers import json_response
from app.ops.origin import browser_write, known_host, same_site
from app.ops.page import OperatorPage

if TYPE_CHECKING:
    from app.node.settings import Settings

__all__ = ["TOKEN_COOKIE", "ActionGuard"]

TOKEN_COOKIE = "tickwheel_web_token"

_READS = frozenset({"GET", "HEAD", "OPTIONS"})

_FORMS = frozenset({"application/x-www-form-urlencoded", "multipart/form-data"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _digest(text: str) -> bytes:
    # aiohttp hands a header's bytes that are not UTF-8 on as lone surrogates: encoded as
    # they came, never a UnicodeEncodeError (a 500 before the token is even compared).
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


class ActionGuard:
    """What the guard of one node's edge knows: the names a browser may reach the node
    under (`names`), and its web token's digest and cookie when it has one."""

    def __init__(self, settings: Settings) -> None:
        # Besides IP addresses and localhost, the names a browser may reach it under: its
        # page's address as the other nodes link to it, and the host it listens on.
        named = [URL(settings.web_url).raw_host or ""] if settings.web_url else []
        self.names = frozenset(n.lower().rstrip(".") for n in [*named, settings.web_host] if n)
        token = settings.web_token
        secret = token.get_secret_value() if token is not None else ""
        self._token = _digest(secret) if secret else None
        # What the browser's cookie holds: derived from the token, useless as a token.
        self._cookie = (
            hmac.new(secret.encode(), b"tickwheel web cookie", hashlib.sha256).hexdigest()
            if secret
            else None
        )

    @property
    def has_token(self) -> bool:
        """Whether the node has a web token: its actions need it."""
        return self._token is not None

    def middleware(self, page_of: Callable[[], OperatorPage | None]) -> Middleware:
        """The middleware every action passes: from this server's own page (or no
        browser), and with the web token when the node has one. `page_of`: the page that
        renders its refusals and the form asking for the token (made once it listens)."""

        @web.middleware
        async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
            if request.method in _READS or request.match_info.http_exception is not None:
                return await handler(request)  # a read, or a 404/405 answered as such
            page = page_of()
            assert page is not None
            if not same_site(request):
                return html_response(page.error(403, "a form posted from another site is refused"))
            if self._token is None:
                if browser_write(request) and not known_host(request, self.names):
                    why = (
                        f"this node is not known as {request.host!r}: set TICKWHEEL_WEB_URL "
                        "to the address its page is reached at, or a web token"
                    )
                    return html_response(page.error(403, why))
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
                    asked = page.token_form(request.path, fields, wrong=given is not None)
                    return html_response(asked)
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


def _unauthorized(reason: str, *, invalid: bool = False) -> web.Response:
    challenge = 'Bearer realm="tickwheel"' + (', error="invalid_token"' if invalid else "")
    response = json_response({"error": reason}, 401)
    response.headers["WWW-Authenticate"] = challenge
    return response
