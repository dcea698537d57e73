"""Whether the web edge can listen where it is told (`check_listenable`): asked before the
node starts, so that a port in use (a second worker on the host given the same
`TICKWHEEL_WEB_PORT`) or a host no interface has stops the worker at once, not after it
joined its group, took partitions and made the group rebalance twice. May import
`app.errors` alone."""

from __future__ import annotations

import errno
import socket

from app.errors import ConfigError

__all__ = ["check_listenable"]


def check_listenable(host: str, port: int) -> None:
    """Binds (and lets go) every address `host` resolves to, as the server's listen will,
    on `port`: `ConfigError` naming the address and the OS's reason when one cannot be.
    Another process may still take the port before the server listens: then the server's
    own start fails, as it did before."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise ConfigError(
            f"TICKWHEEL_WEB_HOST {host!r}: cannot listen there ({exc.strerror or exc})"
        ) from None
    bound, unavailable = 0, None
    for family, kind, proto, _, address in found:
        # As asyncio's create_server binds: the address reusable (a socket of the worker
        # before, in TIME_WAIT, does not count as in use), IPv6 for IPv6 alone; a family
        # the machine lacks (a socket it cannot make, an address not available: IPv6 off
        # and localhost's ::1) passed over while another address binds.
        try:
            probe = socket.socket(family, kind, proto)
        except OSError:
            continue
        with probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRNOTAVAIL:
                    unavailable = exc
                    continue
                raise _cannot(host, port, exc) from None
            bound += 1
    if not bound:
        raise _cannot(host, port, unavailable)


def _cannot(host: str, port: int, exc: OSError | None) -> ConfigError:
    why = "no address to bind" if exc is None else exc.strerror or str(exc)
    return ConfigError(f"TICKWHEEL_WEB_PORT {port}: cannot listen on {host}:{port} ({why})")
