"""One look at the broker: an ApiVersions request to each bootstrap address, answered in
time or not (a refused connection, or one accepted and never answered: a frozen broker).

And one connection made as the clients make theirs (`check_access`), before they start:
the client library retries a refused TLS handshake or SASL login like a broker away and
ends with "Unable to bootstrap"; a single connection raises what the broker said.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
import struct
from collections.abc import Awaitable, Callable

from aiokafka.conn import create_conn
from aiokafka.errors import (
    AuthenticationFailedError,
    KafkaError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)

from app.errors import KafkaUnavailable
from app.kafka.addresses import broker_addresses
from app.kafka.connection import Connectable, KafkaConnection, connection
from app.kafka.oauth_token import TokenRefused, TokenUnavailable

__all__ = ["Probe", "api_versions_probe", "check_access"]

Probe = Callable[[], Awaitable[str | None]]
"""One look at the broker: None when it answered, else why not."""


def _api_versions_request(correlation: int) -> bytes:
    client_id = b"tickwheel-broker-watch"
    # ApiVersions (key 18) v0: a request header and an empty body; every broker answers it.
    payload = struct.pack(">hhih", 18, 0, correlation, len(client_id)) + client_id
    return struct.pack(">i", len(payload)) + payload


_correlations = itertools.count(1)


async def api_versions_probe(bootstrap: Connectable, within: float = 2.0) -> str | None:
    """Asks each bootstrap address for its API versions; None as soon as one answers
    within `within` s each, else why none did. A broker that accepts the connection but does
    not answer (frozen: the kernel accepts for it) is a failure, like a refused one."""
    kafka = connection(bootstrap)
    context = kafka.ssl_context()  # an SSL listener answers only after a TLS handshake
    try:
        addresses = broker_addresses(kafka.bootstrap_servers)
    except ValueError as exc:
        return str(exc)  # the settings refuse it at start; a probe says why all the same
    reasons: list[tuple[str, str]] = []
    for host, port in addresses:
        why = await _probe_one(host, port, within, context)
        if why is None:
            return None
        reasons.append((f"{host}:{port}", why))
    if len(reasons) == 1:
        return reasons[0][1]
    return "; ".join(f"{a}: {why}" for a, why in reasons) or "no bootstrap address"


async def _probe_one(
    host: str, port: int, within: float, context: ssl.SSLContext | None = None
) -> str | None:
    correlation = next(_correlations) % 2**31
    writer: asyncio.StreamWriter | None = None
    connected = False
    try:
        async with asyncio.timeout(within):
            reader, writer = await asyncio.open_connection(host, port, ssl=context)
            connected = True
            writer.write(_api_versions_request(correlation))
            await writer.drain()
            (size,) = struct.unpack(">i", await reader.readexactly(4))
            if size < 6:
                return f"a malformed ApiVersions answer ({size} bytes)"
            body = await reader.readexactly(size)
    except TimeoutError:
        if connected:
            return f"connected, but no answer to ApiVersions within {within:g} s"
        return f"no connection within {within:g} s"
    except ConnectionRefusedError:
        return "connection refused"
    except (asyncio.IncompleteReadError, ConnectionResetError):
        return "connection closed before an answer"
    except ssl.SSLError as exc:
        return f"TLS handshake failed: {exc.reason or exc}"
    except OSError as exc:
        return exc.strerror or repr(exc)
    finally:
        if writer is not None:
            writer.transport.abort()
    (got,) = struct.unpack_from(">i", body, 0)
    if got != correlation:
        return f"an ApiVersions answer with correlation id {got}, not {correlation}"
    return None  # any error code in it is still an answer: the broker runs


async def check_access(where: Connectable, within: float = 10.0) -> None:
    """Connects to the bootstrap addresses in turn, as every client does (TLS, SASL), until
    one lets this client in. `KafkaUnavailable` at once when one refuses it: the TLS
    handshake fails (a CA that did not sign the broker's certificate, a client
    certificate refused) or the SASL login does (wrong credentials, a mechanism the broker
    does not offer), or the OAUTHBEARER token endpoint refuses the grant with an OAuth
    error: retrying would not help. An address that does not answer is passed over, as
    is one with no token now (`TokenUnavailable`: the identity provider away); none
    answering is left to the clients (they wait for a broker away)."""
    kafka = connection(where)
    if kafka.security_protocol == "PLAINTEXT":
        return  # nothing to refuse: a broker that answers serves this client
    options = kafka.options()
    del options["bootstrap_servers"]
    try:
        addresses = broker_addresses(kafka.bootstrap_servers)
    except ValueError:
        return  # the settings refuse it at start: the clients say so
    for host, port in addresses:
        try:
            conn = await create_conn(
                host,
                port,
                client_id="tickwheel-check",
                request_timeout_ms=int(within * 1000),
                **options,
            )
        except (OSError, KafkaError, TimeoutError) as exc:
            if (why := refusal(kafka, exc)) is not None:
                raise KafkaUnavailable(f"{kafka.describe(f'{host}:{port}')}: {why}") from exc
            continue
        conn.close()
        return


def refusal(kafka: KafkaConnection, exc: BaseException) -> str | None:
    """Why the broker refused this client (in a user's terms, naming the settings to
    check), or None when `exc` is not a refusal (the broker away, slow)."""
    for cause in _chain(exc):
        if isinstance(cause, TokenUnavailable):
            # No token now (the identity provider away, a proxy's page, its certificate
            # mid-rotation): retried as a broker away. What it came from (an ssl error of
            # the token endpoint's) is not the broker refusing this client.
            return None
        if isinstance(cause, TokenRefused):
            return f"no OAUTHBEARER token: {cause.args[0] if cause.args else cause}"
        if isinstance(cause, SaslAuthenticationFailed | AuthenticationFailedError):
            said = cause.args[0] if cause.args and isinstance(cause.args[0], str) else cause
            if kafka.sasl_mechanism == "OAUTHBEARER":
                return (
                    f"authentication failed ({said}); the broker refused the token of "
                    f"{kafka.sasl_oauthbearer_token_endpoint_url}: check that it trusts this "
                    "endpoint's keys (its JWKS), audience and issuer, and "
                    "KAFKA_SASL_OAUTHBEARER_SCOPE"
                )
            return (
                f"authentication failed ({said}); check KAFKA_SASL_USERNAME, "
                "KAFKA_SASL_PASSWORD (or KAFKA_SASL_PASSWORD_FILE) and KAFKA_SASL_MECHANISM"
            )
        if isinstance(cause, UnsupportedSaslMechanismError):
            return f"{cause}; check KAFKA_SASL_MECHANISM"
        if isinstance(cause, ssl.SSLCertVerificationError):
            if (advice := _certificate_advice(cause)) is not None:
                return (
                    f"TLS: the broker's certificate was refused ({cause.verify_message}); {advice}"
                )
            return (
                f"TLS: the broker's certificate is not trusted ({cause.verify_message}); "
                "check KAFKA_SSL_CAFILE (the CA that signed the brokers' certificates; "
                f"now {kafka.ssl_cafile or 'the system CAs'})"
            )
        if isinstance(cause, ssl.SSLEOFError | ssl.SSLZeroReturnError):
            return None  # closed mid-handshake: a broker going away looks the same
        if isinstance(cause, ssl.SSLError):
            return (
                f"TLS handshake refused ({cause.reason or cause}); check "
                "KAFKA_SECURITY_PROTOCOL (is the listener TLS?), KAFKA_SSL_CERTFILE and "
                "KAFKA_SSL_KEYFILE (a client certificate the broker trusts)"
            )
    return None


_EXPIRED, _NOT_YET_VALID, _HOSTNAME_MISMATCH = 10, 9, 62  # OpenSSL's X509_V_ERR_* codes


def _certificate_advice(cause: ssl.SSLCertVerificationError) -> str | None:
    """What to check for a certificate a trusted CA signed but which is refused all the
    same (None: the CA is not trusted, KAFKA_SSL_CAFILE is the setting to check)."""
    code = getattr(cause, "verify_code", None)  # set by OpenSSL's handshake alone
    if code in (_EXPIRED, _NOT_YET_VALID):
        return (
            "renew the certificate out of its dates (the brokers', or their CA's), or "
            "check this machine's clock"
        )
    if code == _HOSTNAME_MISMATCH:
        return (
            "the certificate does not name the address connected to: use a name it holds "
            "in KAFKA_BOOTSTRAP_SERVERS (and the brokers' advertised listeners)"
        )
    return None


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen
