"""SASL/OAUTHBEARER for aiokafka: a token provider (`aiokafka.abc.AbstractTokenProvider`)
that asks an OIDC token endpoint for a token with the client-credentials grant, keeps it,
and asks again once 80 % of its lifetime has passed (`oauth_token` decides; this module
is its one HTTP edge, aiohttp's).

Every aiokafka client of a connection holds the one provider `token_provider` gives, so
one token serves them all. A fetch that fails keeps the token held while it lives (an
endpoint away for a while is not an outage) and waits 0.1 s doubling to 10 s before the
endpoint is asked again; a refused grant (`TokenRefused`) names the endpoint and the
OAuth error, never the secret. May import `app.kafka.oauth_token`.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import logging
import ssl
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote_plus, urlsplit

import aiohttp
from aiokafka.abc import AbstractTokenProvider

from app.kafka.oauth_token import (
    MAX_ANSWER_BYTES,
    Token,
    TokenRefused,
    TokenUnavailable,
    backoff_s,
    read_token_answer,
    refresh_due,
)

__all__ = ["DEFAULT_TIMEOUT_S", "ClientCredentials", "endpoint_context", "token_provider"]

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
"""The most one ask of the token endpoint may take, connection and answer together."""


class ClientCredentials(AbstractTokenProvider):  # type: ignore[misc]  # aiokafka is untyped
    """Tokens of the client-credentials grant from `endpoint`, for `client_id`.

    `clock` (monotonic seconds) times the tokens' lifetimes and the backoff; `wall` (the
    time of day) reads a JWT's `exp` when the answer gives no `expires_in`: both
    injectable for tests. Safe to share between event loops (a lock per loop)."""

    def __init__(
        self,
        endpoint: str,
        client_id: str,
        client_secret: str,
        scope: str | None = None,
        *,
        ssl_context: ssl.SSLContext | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.endpoint = endpoint
        self.client_id = client_id
        self._secret = client_secret
        self._scope = scope
        self._ssl: ssl.SSLContext | bool = (
            ssl_context if ssl_context is not None else urlsplit(endpoint).scheme == "https"
        )
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._clock = clock
        self._wall = wall
        self._token: Token | None = None
        self._failures = 0
        self._retry_at = 0.0
        self._last_error: Exception | None = None
        self._locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )
        self.fetches = 0
        """How many times the endpoint was asked (for tests and logs)."""

    def __repr__(self) -> str:
        return f"ClientCredentials({self.endpoint!r}, client {self.client_id!r})"

    async def token(self) -> str:
        """A token that lives: the one held until its refresh window, else a new one."""
        held = self._token
        if held is not None and not refresh_due(held, self._clock()):
            return held.value
        lock = self._locks.setdefault(asyncio.get_running_loop(), asyncio.Lock())
        async with lock:  # the clients connecting at once ask the endpoint once
            held = self._token
            now = self._clock()
            if held is not None and not refresh_due(held, now):
                return held.value
            try:
                fresh = await self._fetch_unless_backing_off(now)
            except (TokenUnavailable, TokenRefused) as exc:
                if held is not None and now < held.expires_at:
                    logger.warning("keeping the token held until it expires: %s", exc)
                    return held.value
                raise
            self._token = fresh
            return fresh.value

    async def _fetch_unless_backing_off(self, now: float) -> Token:
        if self._last_error is not None and now < self._retry_at:
            raise self._last_error  # the endpoint is not asked more often than the backoff
        try:
            fresh = await self._fetch()
        except (TokenUnavailable, TokenRefused) as exc:
            self._failures += 1
            self._retry_at = self._clock() + backoff_s(self._failures)
            self._last_error = exc
            raise
        self._failures = 0
        self._last_error = None
        return fresh

    async def _fetch(self) -> Token:
        self.fetches += 1
        form = {"grant_type": "client_credentials"}
        if self._scope:
            form["scope"] = self._scope
        # RFC 6749 2.3.1: the id and secret form-encoded, then as HTTP Basic (as Java's).
        pair = f"{quote_plus(self.client_id)}:{quote_plus(self._secret)}"
        basic = "Basic " + base64.b64encode(pair.encode()).decode()
        try:
            async with (
                aiohttp.ClientSession(timeout=self._timeout) as session,
                session.post(
                    self.endpoint,
                    data=form,
                    ssl=self._ssl,
                    allow_redirects=False,  # the secret goes to the URL configured alone
                    headers={"Accept": "application/json", "Authorization": basic},
                ) as answer,
            ):
                body = await _read_capped(answer.content)
                status = answer.status
        except TimeoutError as exc:
            raise TokenUnavailable(
                f"the token endpoint {self.endpoint} did not answer within "
                f"{self._timeout.total:g} s"
            ) from exc
        except aiohttp.ClientConnectorCertificateError as exc:
            raise TokenRefused(
                f"the token endpoint {self.endpoint}: its TLS certificate is not trusted "
                f"({exc.certificate_error}); check KAFKA_SSL_CAFILE (the CA the token "
                "endpoint's certificate is checked against; the system's CAs when unset)"
            ) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise TokenUnavailable(
                f"the token endpoint {self.endpoint} cannot be reached: {exc}"
            ) from exc
        return read_token_answer(self.endpoint, status, body, self._clock(), self._wall())


async def _read_capped(content: aiohttp.StreamReader) -> bytes:
    """The whole body, or its first `MAX_ANSWER_BYTES` + 1 bytes when it is larger (so
    that `read_token_answer` refuses it without the rest being waited for): `read(n)`
    gives what has come so far, not n bytes, and an answer may come in several writes."""
    body = bytearray()
    while len(body) <= MAX_ANSWER_BYTES:
        chunk = await content.read(MAX_ANSWER_BYTES + 1 - len(body))
        if not chunk:  # the end of the body
            break
        body += chunk
    return bytes(body)


def endpoint_context(endpoint: str, cafile: Path | None) -> ssl.SSLContext | None:
    """The TLS context the token endpoint is checked with: `cafile` (KAFKA_SSL_CAFILE,
    the brokers' CA) when given, else the system's CAs; None for http://."""
    if urlsplit(endpoint).scheme != "https":
        return None
    return ssl.create_default_context(cafile=None if cafile is None else str(cafile))


@functools.cache
def token_provider(
    endpoint: str,
    client_id: str,
    client_secret: str,
    scope: str | None,
    cafile: Path | None,
) -> ClientCredentials:
    """The one provider of these settings: every client of a connection shares its token
    (`KafkaConnection.options` is called once per client)."""
    return ClientCredentials(
        endpoint,
        client_id,
        client_secret,
        scope,
        ssl_context=endpoint_context(endpoint, cafile),
    )
