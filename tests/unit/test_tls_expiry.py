"""The decisions of the TLS reload, pure: a certificate's validity read from its PEM file
(what OpenSSL's own reading says, the leaf's of a chain), which files changed, and
when a certificate near its end is warned about (in its last 7 days, or its last tenth
when shorter-lived; once a day)."""

from __future__ import annotations

import base64
import contextlib
import ssl
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from tls_certs import Certs

from app.kafka.tls_expiry import (
    WARN_EVERY_S,
    WARN_WITHIN_S,
    Validity,
    expiry_warning_due,
    validity_of_pem,
    warn_window,
)
from app.kafka.tls_reload import changed_files

DAY = 86400


def test_what_is_no_certificate_is_said() -> None:
    key_only = b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"
    for unreadable in (
        b"",
        key_only,
        b"-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",  # no base64
        b"-----BEGIN CERTIFICATE-----\nMAMCAQE=\n-----END CERTIFICATE-----\n",  # no X.509
    ):
        with pytest.raises(ValueError, match=r"^no readable PEM certificate: "):
            validity_of_pem(unreadable)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=300))
def test_anything_in_a_certificates_framing_is_a_value_error(der: bytes) -> None:
    pem = (
        b"-----BEGIN CERTIFICATE-----\n" + base64.encodebytes(der) + b"-----END CERTIFICATE-----\n"
    )
    with contextlib.suppress(ValueError):
        validity_of_pem(pem)


def test_certificates_read_as_openssl_reads_them(tmp_path: Path) -> None:
    certs = Certs(tmp_path)
    ca = certs.ca("ca")
    leaf = certs.leaf("client", ca, days=2)
    for made in (ca, leaf):
        said = subprocess.run(
            ["openssl", "x509", "-in", str(made.cert), "-noout", "-startdate", "-enddate"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.splitlines()
        dates = dict(line.split("=", 1) for line in said)
        # the client's chain file: its own certificate first, then its CA's
        pem = made.cert.read_bytes() + ca.cert.read_bytes()
        assert validity_of_pem(pem) == Validity(
            ssl.cert_time_to_seconds(dates["notBefore"]),
            ssl.cert_time_to_seconds(dates["notAfter"]),
        )
    # the leaf's, not its CA's: the first certificate, after any text (openssl's
    # `subject=` lines, a key in the same file)
    chain = b"subject=CN=client\n" + leaf.key.read_bytes() + leaf.cert.read_bytes()
    days = validity_of_pem(chain + ca.cert.read_bytes())
    assert timedelta(seconds=days.not_after - days.not_before) == timedelta(days=2)


digests = st.dictionaries(st.sampled_from(["ca", "cert", "key"]), st.sampled_from("abc"))


@given(loaded=digests, read=digests)
def test_the_files_changed_are_those_whose_digest_differs(
    loaded: dict[str, str], read: dict[str, str]
) -> None:
    changed = changed_files(loaded, read)
    assert set(changed) == {name for name in read if loaded.get(name) != read[name]}
    assert changed_files({}, read) == list(read), "before the first load: every file"
    assert changed_files(read, read) == []


lifetimes = st.integers(min_value=60, max_value=3650 * DAY)


@given(lifetime=lifetimes, left=st.integers(-30 * DAY, 3650 * DAY))
def test_the_first_warning_comes_within_the_window(lifetime: int, left: int) -> None:
    """In the last 7 days of a long-lived certificate, the last tenth of a short-lived
    one (a day's certificate, renewed hours before its end, is not warned about daily)."""
    validity = Validity(1_000_000, 1_000_000 + lifetime)
    now = validity.not_after - left
    window = warn_window(validity)
    assert window == min(WARN_WITHIN_S, lifetime / 10)
    assert expiry_warning_due(now, validity, None) == (left <= window)


@given(
    lifetime=lifetimes,
    left=st.integers(-30 * DAY, 7 * DAY),
    since=st.integers(-2 * DAY, 3 * DAY),
)
def test_a_warning_repeats_once_a_day(lifetime: int, left: int, since: int) -> None:
    validity = Validity(1_000_000, 1_000_000 + lifetime)
    now = validity.not_after - left
    assume(left <= warn_window(validity))
    due = expiry_warning_due(now, validity, now - since)
    # a clock stepped back before the last warning: warned again
    assert due == (since >= WARN_EVERY_S or since < 0)


def test_a_certificate_cryptography_refuses_otherwise_is_a_value_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # cryptography's InvalidVersion is no ValueError: raised on, it ended the reload's
    # watch, and the node with it.
    from cryptography import x509

    certs = Certs(tmp_path)
    pem = certs.leaf("client", certs.ca("ca")).cert.read_bytes()

    def invalid(data: bytes) -> object:
        raise x509.InvalidVersion("bad version", 7)

    monkeypatch.setattr(x509, "load_pem_x509_certificate", invalid)
    with pytest.raises(ValueError, match="no readable PEM certificate: bad version"):
        validity_of_pem(pem)
