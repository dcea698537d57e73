"""`broker_addresses`: a bootstrap list (`host[:port],…`) read one way everywhere: by the
settings' check, by the broker watch's probe and by the access check at start, as both
client libraries read it (a host without a port is at 9092). May import nothing of app.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import unicodedata
from typing import Final

__all__ = ["DEFAULT_PORT", "broker_addresses", "has_invisible"]

DEFAULT_PORT: Final = 9092
_BRACKETED: Final = re.compile(r"^\[([^\[\]]+)\](?::(.*))?$")
_IPV6: Final = "an IPv6 address is written [address] or [address]:port"
_INVISIBLE: Final = frozenset({"Cc", "Cf", "Cs", "Co", "Zs", "Zl", "Zp"})
"""Control, format (bidi marks), surrogate, private-use and space characters: no host or
name holds one (unassigned ones, Cn, may be newer than this Python's Unicode data)."""


def broker_addresses(value: str) -> list[tuple[str, int]]:
    """Each `host[:port]` of a comma-separated bootstrap list (an IPv6 address in brackets,
    `[::1]:9093`), a port 9092 when none is given; `ValueError` saying which entry is not
    one: none at all, an empty host, a scheme (`PLAINTEXT://`, as a broker's listeners
    are written), whitespace in a host, a bare IPv6 address, a port not from 1 to 65535."""
    entries = [entry.strip() for entry in value.split(",")]
    if not any(entries):
        raise ValueError("no broker address (host:port, comma-separated)")
    found: list[tuple[str, int]] = []
    for entry in entries:
        if not entry:
            raise ValueError(f"{value[:80]!r}: an empty entry between commas")
        if "://" in entry:
            raise ValueError(
                f"{entry[:80]!r}: host:port, without a scheme (the protocol is its own)"
            )
        if any(c.isspace() for c in entry):
            raise ValueError(f"{entry[:80]!r}: a space inside an address")
        if "[" in entry or "]" in entry:
            if (bracketed := _BRACKETED.match(entry)) is None:
                raise ValueError(
                    f"{entry[:80]!r}: an IPv6 address is written [address] or [address]:port"
                )
            host, port = bracketed[1], bracketed[2]
        elif entry.count(":") > 1:
            raise ValueError(f"{entry[:80]!r}: {_IPV6}")
        else:
            host, colon, port_text = entry.partition(":")
            port = port_text if colon else None
        if not host:
            raise ValueError(f"{entry[:80]!r}: no host")
        if (bad := _bad_host(host, bracketed=entry.startswith("["))) is not None:
            raise ValueError(f"{entry[:80]!r}: {bad}")
        found.append((host, DEFAULT_PORT if port is None else _port(entry, port)))
    return found


def _port(entry: str, port: str) -> int:
    # isascii: isdigit() is true of "²", which int() refuses; len: of 4,301 digits.
    if port.isascii() and port.isdigit() and len(port) <= 5 and 0 < int(port) < 65536:
        return int(port)
    raise ValueError(f"{entry[:80]!r}: the port must be a number from 1 to 65535")


def _bad_host(host: str, *, bracketed: bool) -> str | None:
    """Why `host` is no host name or address the clients can resolve, or None. Caught
    here, not as a client library's `UnicodeError` (a label over 63 characters) or
    `ValueError` (a NUL) deep in a connection attempt, with a traceback and no setting
    named."""
    if bracketed:
        with contextlib.suppress(ValueError):
            ipaddress.IPv6Address(host)
            return None
        # else a host name in brackets, which both clients take as one
    if has_invisible(host):
        return "a control or invisible format character in the host"
    try:
        encoded = host.encode("idna")
    except UnicodeError:
        return "not a host name (each dot-separated label 1 to 63 characters, IDNA)"
    if len(encoded.rstrip(b".")) > 253:
        return "a host name longer than 253 characters"
    return None


def has_invisible(text: str) -> bool:
    """Whether `text` holds a control, format, surrogate, private-use or space character
    (`_INVISIBLE`): no host name, group id or web host does."""
    return any(unicodedata.category(c) in _INVISIBLE for c in text)
