"""OAuth 2.0 client-credentials tokens (RFC 6749 4.4, Kafka's KIP-768 client side), the
pure part: whether a token endpoint's address may be used, how its answer is read
(hostile ones too: no JSON, a body too large, an `expires_in` missing, negative or
huge), which answer is a refusal (an OAuth error alone: anything else may be a proxy's
page or a load balancer's, and passes), when a token is fetched anew (`next_step`: in
the background while the one held lives) and how long a failed fetch waits. No I/O:
`app.kafka.oauth` asks the endpoint. May import aiokafka's errors, yarl and `app.backoff`.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Final
from urllib.parse import urlsplit

import orjson
from aiokafka.errors import AuthenticationFailedError, KafkaConnectionError
from yarl import URL

from app.backoff import capped_backoff

__all__ = [
    "DEFAULT_LIFETIME_S",
    "MAX_ANSWER_BYTES",
    "MAX_FAIL_WAIT_S",
    "MAX_LIFETIME_S",
    "OAUTH_REFUSALS",
    "REFRESH_WINDOW_FACTOR",
    "Step",
    "Token",
    "TokenRefused",
    "TokenUnavailable",
    "backoff_s",
    "endpoint_problem",
    "fail_wait_s",
    "next_step",
    "oauth_refusal",
    "read_token_answer",
    "refresh_due",
]

REFRESH_WINDOW_FACTOR: Final = 0.8
"""A token is fetched anew once this share of its lifetime has passed (Java's
`sasl.login.refresh.window.factor`)."""

DEFAULT_LIFETIME_S: Final = 300.0
"""The lifetime of a token whose answer gives no `expires_in` (RFC 6749 only recommends
it) and whose JWT has no readable `exp`: short, so that a token never outlives its use
by much."""

MAX_LIFETIME_S: Final = 86_400.0
"""A longer `expires_in` is read as a day: a token is fetched anew daily at least."""

MAX_ANSWER_BYTES: Final = 256 * 1024
"""The most a token endpoint's answer may hold (a JWT is a few KiB)."""

INITIAL_BACKOFF_S: Final = 0.1
MAX_BACKOFF_S: Final = 10.0
"""After a failed fetch the endpoint is not asked again for 0.1 s, doubling to 10 s
(Java's `sasl.login.retry.backoff.ms` and `.max.ms`)."""

MAX_FAIL_WAIT_S: Final = 5.0
"""The longest a connection asking for a token within the backoff waits for the endpoint
to be asked again (`fail_wait_s`): an answer soon, no caller's own timeout outrun much."""

OAUTH_REFUSALS: Final = frozenset(
    {
        "invalid_client",
        "invalid_grant",
        "unauthorized_client",
        "unsupported_grant_type",
        "invalid_scope",
        "invalid_request",
    }
)
"""RFC 6749 5.2's error codes: the endpoint refusing these credentials, which asking
again does not change."""

_LOCAL_HOSTS: Final = frozenset({"localhost", "127.0.0.1", "::1"})
_B64TOKEN: Final = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
"""RFC 6750's b64token: what a bearer token is made of (no \\x01, which would end the
SASL message it goes in, no space)."""
_REFUSING_STATUSES: Final = frozenset({400, 401})
"""RFC 6749 5.2: an error answer is a 400, or a 401 for a client not authenticated."""


class TokenRefused(AuthenticationFailedError):  # type: ignore[misc]  # aiokafka is untyped
    """The token endpoint refused the grant with an OAuth error (`oauth_refusal`): a
    setting is wrong (the client id, its secret, the scope). A refusal, never retried
    (`records.refused`), as a wrong password."""


class TokenUnavailable(KafkaConnectionError):  # type: ignore[misc]
    """No token now, for any reason but an OAuth error: the endpoint away, slow, failing
    (5xx), or answering with no token (a proxy's maintenance page, a load balancer's
    401/403/404, a TLS certificate not trusted mid-rotation). Retried with the backoff,
    as a broker away: a setting wrong this way shows as warnings that last."""


@dataclass(frozen=True, slots=True)
class Token:
    """An access token, when it was had (the provider's clock) and how long it lives."""

    value: str = field(repr=False)
    obtained_at: float
    lifetime_s: float

    @property
    def refresh_at(self) -> float:
        return self.obtained_at + REFRESH_WINDOW_FACTOR * self.lifetime_s

    @property
    def expires_at(self) -> float:
        return self.obtained_at + self.lifetime_s


def refresh_due(token: Token | None, now: float) -> bool:
    """Whether a token is to be fetched: none yet, or past its refresh window."""
    return token is None or now >= token.refresh_at


class Step(Enum):
    """What a connection asking for a token gets (`next_step`)."""

    HAND = "the token held"
    HAND_AND_REFRESH = "the token held, a fetch started in the background"
    WAIT = "a wait for a fetch: the one under way, else a new one"
    FAIL = "the last fetch's failure: the endpoint is not asked within the backoff"


def next_step(token: Token | None, now: float, retry_at: float | None, fetching: bool) -> Step:
    """What `token()` does at `now`, holding `token`, the endpoint not to be asked before
    `retry_at` (None: the last fetch did not fail), a fetch under way or not. A token that
    still lives is handed at once, whatever the endpoint does: a connection never waits
    on a refresh (one at a time, in the background, not within the backoff). Only with
    no token that lives does a connection wait for a fetch."""
    backing_off = retry_at is not None and now < retry_at
    if token is not None and now < token.expires_at:
        if refresh_due(token, now) and not fetching and not backing_off:
            return Step.HAND_AND_REFRESH
        return Step.HAND
    if backing_off and not fetching:
        return Step.FAIL
    return Step.WAIT


def fail_wait_s(now: float, retry_at: float) -> float:
    """How long a connection asking at `now`, with no token that lives and the endpoint
    not to be asked before `retry_at`, waits before asking (aiokafka reconnects at once
    on a failure: raised at once, it would ask every few ms); `MAX_FAIL_WAIT_S` at most."""
    return min(MAX_FAIL_WAIT_S, max(0.0, retry_at - now))


def backoff_s(failures: int) -> float:
    """How long after the `failures`-th fetch failed in a row the endpoint is asked again."""
    if failures <= 0:
        return 0.0
    return capped_backoff(INITIAL_BACKOFF_S, MAX_BACKOFF_S, failures - 1)


def endpoint_problem(url: str) -> str | None:
    """Why `url` cannot be a token endpoint (None: it can): https, or http to this machine
    alone (the client secret goes in the request); a host; no user or password in it (it
    would be logged); no fragment."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        port = parts.port  # a port out of range, or not in digits, raises here
        URL(url)  # as aiohttp reads it for the request, which would raise otherwise
    except ValueError as exc:
        return f"not a URL ({exc})"
    if any(c.isspace() or not c.isprintable() for c in url):
        return "a space or control character in the URL"
    if parts.scheme not in ("https", "http") or not host:
        return "an https:// URL with a host"
    if port == 0:
        return "a port from 1 to 65535 (0 is none a server listens on)"
    if parts.username is not None or parts.password is not None:
        return "no user or password in the URL (the client id and secret have settings)"
    if parts.fragment:
        return "no #fragment in the URL"
    if parts.scheme == "http" and host not in _LOCAL_HOSTS:
        return (
            f"https:// for {host} (http:// sends the client secret in clear: only to "
            "localhost, 127.0.0.1 or ::1)"
        )
    return None


def read_token_answer(endpoint: str, status: int, body: bytes, now: float, wall: float) -> Token:
    """The token in the token endpoint's answer (its HTTP `status` and `body`, read up to
    `MAX_ANSWER_BYTES` + 1 bytes), had at `now` (the provider's clock; `wall`: the time
    of day, for a JWT's `exp`). `TokenRefused` for an OAuth error (`oauth_refusal`),
    `TokenUnavailable` for any other answer with no usable token; each names the
    endpoint, never a secret nor the token."""
    if len(body) > MAX_ANSWER_BYTES:
        raise TokenUnavailable(
            f"the token endpoint {endpoint} answered more than {MAX_ANSWER_BYTES} bytes "
            f"(HTTP {status}): is KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL its token endpoint?"
        )
    answer = _json_object(body)
    if (code := oauth_refusal(status, answer)) is not None:
        raise TokenRefused(_refusal(endpoint, status, code, answer))
    if status != 200:
        # A 5xx says it cannot now; another, with no OAuth error, is likely not the
        # endpoint's own (a proxy's, a load balancer's in front).
        said = "" if status >= 500 else " with no OAuth error"
        raise TokenUnavailable(f"the token endpoint {endpoint} answered HTTP {status}{said}")
    if answer is None:
        raise TokenUnavailable(
            f"the token endpoint {endpoint} answered with no JSON object (a proxy's page?): "
            "is KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL its token endpoint?"
        )
    value = answer.get("access_token")
    if not isinstance(value, str) or not _B64TOKEN.fullmatch(value):
        raise TokenUnavailable(
            f"the token endpoint {endpoint} answered with no usable access_token"
        )
    lifetime = _lifetime(answer.get("expires_in"), value, wall)
    if lifetime is None:
        raise TokenUnavailable(
            f"the token endpoint {endpoint} answered with an expires_in that is not a "
            "positive number of seconds"
        )
    return Token(value, now, lifetime)


def oauth_refusal(status: int, answer: dict[str, object] | None) -> str | None:
    """The OAuth error code when an answer (its status, its body read as a JSON object) is
    the endpoint refusing the grant as RFC 6749 5.2 says: HTTP 400 or 401 with an `error`
    of `OAUTH_REFUSALS`. None for any other: a proxy or load balancer in front answers
    401, 403 or 404 with a page of its own, which passes."""
    code = answer.get("error") if answer is not None else None
    if status in _REFUSING_STATUSES and isinstance(code, str) and code in OAUTH_REFUSALS:
        return code
    return None


def _json_object(body: bytes) -> dict[str, object] | None:
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return answer if isinstance(answer, dict) else None


def _refusal(endpoint: str, status: int, code: str, answer: dict[str, object] | None) -> str:
    said = f"HTTP {status}, error {code!r}"
    described = answer.get("error_description") if answer is not None else None
    if isinstance(described, str) and (text := _shown(described)):
        said += f": {text}"
    return (
        f"the token endpoint {endpoint} refused the client credentials grant ({said}); "
        "check KAFKA_SASL_OAUTHBEARER_CLIENT_ID, KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET and "
        "KAFKA_SASL_OAUTHBEARER_SCOPE"
    )


def _shown(text: str) -> str:
    """An endpoint's own words, printable and short (they go in a log line)."""
    kept = "".join(c for c in text if c.isprintable())[:200]
    return kept.strip()


def _lifetime(expires_in: object, value: str, wall: float) -> float | None:
    """The token's lifetime in seconds, at most `MAX_LIFETIME_S`; None for an
    `expires_in` given that is no positive number."""
    seconds: float | None
    if expires_in is None:
        exp = _jwt_exp(value)
        left = None if exp is None else exp - wall
        seconds = left if left is not None and left > 0 else DEFAULT_LIFETIME_S
    elif isinstance(expires_in, bool):
        seconds = None
    elif isinstance(expires_in, int | float):
        seconds = float(expires_in)
    elif isinstance(expires_in, str) and expires_in.isascii() and expires_in.isdigit():
        # Some endpoints send a string of digits; past 12 of them, more than a day.
        digits = expires_in.lstrip("0") or "0"
        seconds = MAX_LIFETIME_S if len(digits) > 12 else float(int(digits))
    else:
        seconds = None
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        return None
    return min(seconds, MAX_LIFETIME_S)


def _jwt_exp(value: str) -> float | None:
    """The `exp` claim of `value` read as a JWT (its signature unchecked: the broker
    checks it; this only says when to fetch a new one), None when it is none."""
    parts = value.split(".")
    if len(parts) != 3 or len(parts[1]) > MAX_ANSWER_BYTES:
        return None
    try:
        claims = orjson.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (binascii.Error, ValueError):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    if isinstance(exp, bool) or not isinstance(exp, int | float) or not math.isfinite(exp):
        return None
    return float(exp)
