"""One look at the broker: an ApiVersions request to each bootstrap address, answered in
time or not (a refused connection, or one accepted and never answered: a frozen broker)."""

from __future__ import annotations

import asyncio
import itertools
import ssl
import struct
from collections.abc import Awaitable, Callable

from app.kafka.connection import Connectable, connection

__all__ = ["Probe", "api_versions_probe"]

Probe = Callable[[], Awaitable[str | None]]
"""One look at the broker: None when it answered, else why not."""


def _api_versions_request(correlation: int) -> bytes:
    client_id = b"tickwheel-broker-watch"
    # ApiVersions (key 18) v0: a request header and an empty body; every broker answers it.
    payload = struct.pack(">hhih", 18, 0, correlation, len(client_id)) + client_id
    return struct.pack(">i", len(payload)) + payload


def _address(hostport: str) -> tuple[str, int]:
    host, _, port = hostport.strip().rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


_correlations = itertools.count(1)


async def api_versions_probe(bootstrap: Connectable, within: float = 2.0) -> str | None:
    """Asks each bootstrap address for its API versions; None as soon as one answers
    within `within` s each, else why none did. A broker that accepts the connection but does
    not answer (frozen: the kernel accepts for it) is a failure, like a refused one."""
    kafka = connection(bootstrap)
    context = kafka.ssl_context()  # an SSL listener answers only after a TLS handshake
    addresses = [a.strip() for a in kafka.bootstrap_servers.split(",") if a.strip()]
    reasons: list[tuple[str, str]] = []
    for hostport in addresses:
        try:
            host, port = _address(hostport)
        except ValueError:
            reasons.append((hostport, "not host:port"))
            continue
        why = await _probe_one(host, port, within, context)
        if why is None:
            return None
        reasons.append((hostport, why))
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


# --------------------------------------------------------------------------- the watch
