"""When a client certificate expires, read from its PEM file, and when to warn that it
soon will (`tls_reload` asks both). Pure. The `ssl` module reads no certificate's dates
but a peer's: `cryptography` reads the file's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from cryptography import x509

__all__ = [
    "WARN_EVERY_S",
    "WARN_WITHIN_S",
    "Validity",
    "expiry_warning_due",
    "valid_at",
    "validity_of_pem",
    "warn_window",
]

WARN_WITHIN_S: Final = 7 * 86400
"""A certificate this close to its end is warned about (a shorter-lived one: `warn_window`)."""

WARN_EVERY_S: Final = 86400
"""The warning repeated at most this often while the certificate is not renewed."""


@dataclass(frozen=True, slots=True)
class Validity:
    """A certificate's notBefore and notAfter, in Unix seconds (UTC)."""

    not_before: int
    not_after: int


def validity_of_pem(pem: bytes) -> Validity:
    """The validity of the first certificate of a PEM file (the client's own: the chain's
    CAs follow it; text or a key before it is skipped); `ValueError` when there is none,
    or it is not one."""
    try:
        certificate = x509.load_pem_x509_certificate(pem)
        return Validity(
            int(certificate.not_valid_before_utc.timestamp()),
            int(certificate.not_valid_after_utc.timestamp()),
        )
    except Exception as exc:  # cryptography's own (InvalidVersion) are no ValueError
        raise ValueError(f"no readable PEM certificate: {exc}") from exc


def valid_at(now: float, validity: Validity) -> bool:
    """Whether a certificate of `validity` is valid at `now` (what a broker checks of it)."""
    return validity.not_before <= now <= validity.not_after


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
