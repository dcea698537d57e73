"""When a client certificate expires, read from its PEM file, and when to warn that it
soon will (`tls_reload` asks both). Pure: the `ssl` module reads no certificate's dates
but a peer's, so the certificate's DER is read here, as far as its validity."""

from __future__ import annotations

import base64
import binascii
import calendar
import re
from dataclasses import dataclass
from typing import Final

__all__ = [
    "WARN_EVERY_S",
    "WARN_WITHIN_S",
    "Validity",
    "expiry_warning_due",
    "validity_of_der",
    "validity_of_pem",
    "warn_window",
]

WARN_WITHIN_S: Final = 7 * 86400
"""A certificate this close to its end is warned about (a shorter-lived one: `warn_window`)."""

WARN_EVERY_S: Final = 86400
"""The warning repeated at most this often while the certificate is not renewed."""

_SEQUENCE, _INTEGER, _VERSION = 0x30, 0x02, 0xA0  # [0] EXPLICIT: the version
_UTC_TIME, _GENERALIZED_TIME = 0x17, 0x18

_PEM = re.compile(rb"-----BEGIN CERTIFICATE-----(.*?)-----END CERTIFICATE-----", re.S)


@dataclass(frozen=True, slots=True)
class Validity:
    """A certificate's notBefore and notAfter, in Unix seconds (UTC)."""

    not_before: int
    not_after: int


def validity_of_pem(pem: bytes) -> Validity:
    """The validity of the first certificate of a PEM file (the client's own: the chain's
    CAs follow it); `ValueError` when there is none, or it is not one."""
    found = _PEM.search(pem)
    if found is None:
        raise ValueError("no PEM certificate")
    try:
        der = base64.b64decode(b"".join(found.group(1).split()), validate=True)
    except binascii.Error as exc:
        raise ValueError(f"a PEM certificate not in base64: {exc}") from exc
    return validity_of_der(der)


def validity_of_der(der: bytes) -> Validity:
    """The validity of an X.509 certificate (RFC 5280 4.1: Certificate, tbsCertificate,
    its optional version, serialNumber, signature, issuer, then validity)."""
    tag, at, _ = _element(der, 0)
    _expect(tag, _SEQUENCE, "Certificate")
    tag, at, _ = _element(der, at)
    _expect(tag, _SEQUENCE, "tbsCertificate")
    tag, _, after = _element(der, at)
    if tag == _VERSION:
        at = after
    for want, what in ((_INTEGER, "serialNumber"), (_SEQUENCE, "signature"), (_SEQUENCE, "issuer")):
        tag, _, at = _element(der, at)
        _expect(tag, want, what)
    tag, at, _ = _element(der, at)
    _expect(tag, _SEQUENCE, "validity")
    tag, start, end = _element(der, at)
    not_before = _time(tag, der[start:end])
    tag, start, end = _element(der, end)
    return Validity(not_before, _time(tag, der[start:end]))


def warn_window(validity: Validity) -> float:
    """How close to its end a certificate is warned about: `WARN_WITHIN_S`, or a tenth of
    its validity when shorter (a certificate of a day, cert-manager's or Vault's, renewed
    hours before its end, would be warned about every day of its life)."""
    return min(WARN_WITHIN_S, (validity.not_after - validity.not_before) / 10)


def expiry_warning_due(now: float, validity: Validity, warned_at: float | None) -> bool:
    """Whether to warn, at `now`, that the loaded certificate expires (or expired): within
    its `warn_window`, and not warned about in the last `WARN_EVERY_S` (`warned_at`: its
    last warning; None: none since it was loaded). A clock stepped back before the last
    warning warns again."""
    if validity.not_after - now > warn_window(validity):
        return False
    return warned_at is None or not 0 <= now - warned_at < WARN_EVERY_S


def _element(der: bytes, at: int) -> tuple[int, int, int]:
    """The DER element at `at`: its tag, and where its content starts and ends."""
    if at + 2 > len(der):
        raise ValueError("certificate cut short")
    tag, first = der[at], der[at + 1]
    at += 2
    if first < 0x80:
        length = first
    else:
        size = first & 0x7F
        if not 1 <= size <= 4 or at + size > len(der):
            raise ValueError("certificate with a bad length")
        length = int.from_bytes(der[at : at + size], "big")
        at += size
    if at + length > len(der):
        raise ValueError("certificate cut short")
    return tag, at, at + length


def _expect(tag: int, want: int, what: str) -> None:
    if tag != want:
        raise ValueError(f"not a certificate: {what} has tag {tag:#04x}")


def _time(tag: int, raw: bytes) -> int:
    """A UTCTime (`YYMMDDHHMMSSZ`, 1950 to 2049) or GeneralizedTime (`YYYYMMDDHHMMSSZ`),
    as DER has them, in Unix seconds."""
    text = raw.decode("ascii", errors="replace")
    if tag == _UTC_TIME and re.fullmatch(r"[0-9]{12}Z", text):
        year = int(text[:2])
        year += 1900 if year >= 50 else 2000
        rest = text[2:]
    elif tag == _GENERALIZED_TIME and re.fullmatch(r"[0-9]{14}Z", text):
        year, rest = int(text[:4]), text[4:]
    else:
        raise ValueError(f"certificate time {text!r} (tag {tag:#04x}) is not DER's")
    month, day, hour, minute, second = (int(rest[i : i + 2]) for i in range(0, 10, 2))
    if not (1 <= month <= 12 and 1 <= day <= calendar.monthrange(year, month)[1]):
        raise ValueError(f"certificate time {text!r} is no date")
    if hour > 23 or minute > 59 or second > 59:
        raise ValueError(f"certificate time {text!r} is no time of day")
    return calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
