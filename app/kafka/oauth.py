"""SASL/OAUTHBEARER for aiokafka: a token provider (`aiokafka.abc.AbstractTokenProvider`)
that asks an OIDC token endpoint for a token with the client-credentials grant, keeps it,
and asks again once 80 % of its lifetime has passed (`oauth_token` decides; this module
is its one HTTP edge, aiohttp's).

Every aiokafka client of a connection holds the one provider `token_provider` gives, so
one token serves them all. A connection is handed the token held while it lives, at
once: its refresh runs in the background. A fetch that fails keeps the token held while
it lives (an endpoint away for a while is not an outage) and waits 0.1 s doubling to
10 s before the endpoint is asked again; only an OAuth error is a refused grant
(`TokenRefused`, naming the endpoint and the error, never the secret), any other
failure is `TokenUnavailable`, retried. May import `app.kafka.oauth_token`.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import logging
import ssl
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote_plus, urlsplit

import aiohttp
from aiokafka.abc import AbstractTokenProvider

from app.kafka.oauth_token import (
    MAX_ANSWER_BYTES,
    Step,
    Token,
    TokenRefused,
    TokenUnavailable,
    backoff_s,
    fail_wait_s,
    next_step,
    read_token_answer,
)

__all__ = ["DEFAULT_TIMEOUT_S", "ClientCredentials", "endpoint_context", "token_provider"]

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
"""The most one ask of the token endpoint may take, connection and answer together."""


@dataclass(frozen=True, slots=True)
class _Failed:
    """The last fetch's failure and when the endpoint may be asked again: one value, so
    that a reader sees both or neither."""

    retry_at: float
    error: TokenUnavailable | TokenRefused


class ClientCredentials(AbstractTokenProvider):  # type: ignore[misc]  # aiokafka is untyped
    """Tokens of the client-credentials grant from `endpoint`, for `client_id`.

    A token that lives is handed at once; past its refresh window one fetch runs in the
    background (a task of the asking loop, held here, ended by its own timeout), so a
    connection never waits on the endpoint while a token lives. With none that lives,
    `token()` waits for the fetch under way (shielded: a caller's cancellation, aiokafka's
    connect timeout, does not end it, and the next caller joins it); within the backoff
    of a failed one, it waits for the backoff's end (`fail_wait_s`) and then asks. A
    fetch that fails or times out counts for the backoff; one cancelled (its loop ending,
    `aclose`) does not: it said nothing of the endpoint.

    `clock` (monotonic seconds) times the tokens' lifetimes and the backoff, `sleep` the
    waits for it; `wall` (the time of day) reads a JWT's `exp` when the answer gives no
    `expires_in`: all injectable for tests. Shared by event loops in other threads (the
    producers' own, TICKWHEEL_PRODUCER_THREAD; each waits on its own loop's fetch): the
    state they share is read and written under `_lock`, never held across an await. The
    provider lives as long as the settings it is cached for (`token_provider`), and
    `aclose` ends the asking loop's fetch under way."""

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
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
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
        self._sleep = sleep
        # Re-entrant: a task factory that runs a task at once (eager) would run the
        # fetch's first steps inside `token()`'s hold of it, on the same thread.
        self._lock = threading.RLock()
        self._token: Token | None = None
        self._failures = 0
        self._failed_last: _Failed | None = None
        self._logged: str | None = None
        # Each loop's fetch under way; removed when it ends (no closed loop is kept).
        self._fetching: dict[asyncio.AbstractEventLoop, asyncio.Task[Token]] = {}
        self.fetches = 0
        """How many times the endpoint was asked (for tests and logs)."""

    def __repr__(self) -> str:
        return f"ClientCredentials({self.endpoint!r}, client {self.client_id!r})"

    async def token(self) -> str:
        """A token that lives: the one held (refreshed in the background past its refresh
        window), else the one the fetch under way (or a new one) brings; within the
        backoff of a failed fetch, after its end (`MAX_FAIL_WAIT_S` at most: then the
        failure, raised afresh)."""
        loop = asyncio.get_running_loop()
        waited = False
        while True:
            now = self._clock()
            with self._lock:  # one view of the state; a fetch started under it is the one
                held, failed = self._token, self._failed_last
                retry_at = None if failed is None else failed.retry_at
                step = next_step(held, now, retry_at, self._under_way())
                here = self._fetching.get(loop)
                if step is Step.HAND_AND_REFRESH or (
                    step is Step.WAIT and (here is None or here.done())
                ):
                    here = self._start(loop)
            if step in (Step.HAND, Step.HAND_AND_REFRESH) and held is not None:
                return held.value
            if step is Step.FAIL and failed is not None:
                if waited:  # the backoff outlasted the longest wait: its failure
                    raise _afresh(failed.error) from failed.error.__cause__
                # Not asked more often than the backoff, nor raised at once: aiokafka
                # would reconnect and ask again every few ms, logging each.
                waited = True
                await self._sleep(fail_wait_s(now, failed.retry_at))
                continue
            if step is Step.WAIT and here is not None:
                return (await self._joined(here)).value
            # Never: `next_step` hands a token held alone, fails after a failure alone,
            # and a wait starts or finds this loop's fetch. No assert: no KafkaError.
            raise TokenUnavailable(f"no token from the token endpoint {self.endpoint}")

    async def _joined(self, fetch: asyncio.Task[Token]) -> Token:
        """`fetch`'s token, waited for shielded; its failure raised afresh (its callers,
        on this loop or raised again later, each get their own exception, traceback)."""
        try:
            return await asyncio.shield(fetch)
        except (TokenUnavailable, TokenRefused) as exc:
            raise _afresh(exc) from exc.__cause__
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if fetch.cancelled() and (current is None or not current.cancelling()):
                # The fetch was ended (`aclose`), not this caller: no token, for now.
                raise TokenUnavailable(
                    f"the ask of the token endpoint {self.endpoint} was cancelled"
                ) from None
            raise

    def fetch_under_way(self) -> asyncio.Task[Token] | None:
        """The running loop's fetch under way, if any (to wait for it: tests)."""
        with self._lock:
            task = self._fetching.get(asyncio.get_running_loop())
        return None if task is None or task.done() else task

    async def aclose(self) -> None:
        """Ends the running loop's fetch under way (no failure: the endpoint is asked
        again at once) and waits for it; the provider stays usable."""
        if (task := self.fetch_under_way()) is not None:
            task.cancel()
            await asyncio.wait([task])

    def _under_way(self) -> bool:
        # Under `_lock`. Any loop's: one fetch at a time while a token lives. A loop
        # closed with its task pending (never ended by a runner) is not waited for.
        return any(not t.done() and not t.get_loop().is_closed() for t in self._fetching.values())

    def _start(self, loop: asyncio.AbstractEventLoop) -> asyncio.Task[Token]:
        # Under `_lock`, on `loop`'s own thread.
        task = loop.create_task(self._fetch_and_keep(), name=f"token fetch {self.endpoint}")
        self._fetching[loop] = task
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Token]) -> None:
        with self._lock:
            if self._fetching.get(task.get_loop()) is task:
                del self._fetching[task.get_loop()]
        if not task.cancelled():
            task.exception()  # recorded by `_failed`, raised to the waiters if any

    async def _fetch_and_keep(self) -> Token:
        try:
            fresh = await self._fetch()
        except (TokenUnavailable, TokenRefused) as exc:
            self._failed(exc)
            raise
        except asyncio.CancelledError:
            # `aclose`, or its loop's end (its callers join it shielded: their timeouts
            # do not end it): nothing said of the endpoint, no backoff. A second
            # `asyncio.run` of the process asks at once.
            raise
        except Exception as exc:  # never a quiet end, nor one that skips the backoff
            failure = TokenUnavailable(
                f"the ask of the token endpoint {self.endpoint} failed: {exc!r}"
            )
            self._failed(failure)
            raise failure from exc
        with self._lock:
            self._token = fresh
            self._failures = 0
            self._failed_last = None
            answers_again, self._logged = self._logged is not None, None
        if answers_again:
            logger.info("the token endpoint %s answers again", self.endpoint)
        return fresh

    def _failed(self, exc: TokenUnavailable | TokenRefused) -> None:
        now = self._clock()
        with self._lock:
            self._failures += 1
            self._failed_last = _Failed(now + backoff_s(self._failures), exc)
            held = self._token
            # Said once per distinct failure while a token lives (the connections go on
            # with it); without one, the waiters raise it.
            said = held is not None and now < held.expires_at and str(exc) != self._logged
            if said:
                self._logged = str(exc)
        if said:
            logger.warning("keeping the token held until it expires: %s", exc)

    async def _fetch(self) -> Token:
        with self._lock:
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
            # Unavailable, not refused: a certificate mid-rotation (a new CA not yet
            # everywhere) passes, and a running node keeps its token meanwhile.
            raise TokenUnavailable(
                f"the token endpoint {self.endpoint}: its TLS certificate is not trusted "
                f"({exc.certificate_error}); check KAFKA_SASL_OAUTHBEARER_CAFILE (the CA "
                "the token endpoint's certificate is checked against; the system's CAs "
                "when unset)"
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


def _afresh(failure: TokenUnavailable | TokenRefused) -> TokenUnavailable | TokenRefused:
    """A new exception as `failure` (its type, its message): one raised again by every
    caller, in two threads too, would gather their tracebacks."""
    return type(failure)(*failure.args)


def endpoint_context(endpoint: str, cafile: Path | None) -> ssl.SSLContext | None:
    """The TLS context the token endpoint is checked with: `cafile`
    (KAFKA_SASL_OAUTHBEARER_CAFILE) when given, else the system's CAs; None for http://."""
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
