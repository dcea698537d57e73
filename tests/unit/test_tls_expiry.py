"""The decisions of the TLS reload, pure: a certificate's validity read from its DER (what
OpenSSL's own reading says, for any date and length encoding), which files changed, and
when a certificate near its end is warned about (in its last 7 days, or its last tenth
when shorter-lived; once a day)."""

from __future__ import annotations

import calendar
import contextlib
import ssl
import subprocess
from datetime import UTC, datetime, timedelta
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
    validity_of_der,
    validity_of_pem,
    warn_window,
)
from app.kafka.tls_reload import changed_files

DAY = 86400


def _element(tag: int, content: bytes) -> bytes:
    n = len(content)
    if n < 0x80:
        return bytes([tag, n]) + content
    size = (n.bit_length() + 7) // 8
    return bytes([tag, 0x80 | size]) + n.to_bytes(size, "big") + content


def _time(moment: datetime, generalized: bool) -> bytes:
    if generalized:
        return _element(0x18, moment.strftime("%Y%m%d%H%M%SZ").encode())
    return _element(0x17, moment.strftime("%y%m%d%H%M%SZ").encode())


def _certificate(not_before: bytes, not_after: bytes, issuer_bytes: int, version: bool) -> bytes:
    """A Certificate as far as its validity (the rest of tbsCertificate, the signature
    algorithm and value after it, as a reader must skip them)."""
    issuer = _element(0x30, _element(0x31, _element(0x0C, b"x" * issuer_bytes)))
    tbs = (
        (_element(0xA0, _element(0x02, b"\x02")) if version else b"")
        + _element(0x02, b"\x01\x23")
        + _element(0x30, _element(0x06, b"\x2a\x86\x48\xce\x3d\x04\x03\x02"))
        + issuer
        + _element(0x30, not_before + not_after)
        + issuer
    )
    return _element(0x30, _element(0x30, tbs) + _element(0x30, b"") + _element(0x03, b"\x00"))


moments = st.datetimes(
    min_value=datetime(1950, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59)
).map(lambda d: d.replace(microsecond=0, tzinfo=UTC))


@settings(max_examples=200, deadline=None)
@given(
    before=moments,
    after=moments,
    generalized=st.booleans(),
    issuer_bytes=st.sampled_from([0, 5, 120, 200, 300, 70_000]),
    version=st.booleans(),
)
def test_a_validity_is_read_as_written(
    before: datetime, after: datetime, generalized: bool, issuer_bytes: int, version: bool
) -> None:
    """Times in UTCTime (1950 to 2049: RFC 5280) or GeneralizedTime, lengths short and
    long-form (up to 3 bytes), with or without the version."""
    utc_years = range(1950, 2050)
    assume(generalized or (before.year in utc_years and after.year in utc_years))
    der = _certificate(_time(before, generalized), _time(after, generalized), issuer_bytes, version)
    assert validity_of_der(der) == Validity(
        calendar.timegm(before.timetuple()), calendar.timegm(after.timetuple())
    )


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_anything_else_is_a_value_error(der: bytes) -> None:
    with contextlib.suppress(ValueError):
        validity_of_der(der)


def test_what_a_certificate_is_not_is_said() -> None:
    good = _certificate(
        _time(datetime(2030, 1, 1, tzinfo=UTC), False),
        _time(datetime(2031, 1, 1, tzinfo=UTC), False),
        3,
        True,
    )
    with pytest.raises(ValueError, match="cut short"):
        validity_of_der(good[:-10])
    with pytest.raises(ValueError, match="no PEM certificate"):
        validity_of_pem(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    bad_month = good.replace(b"300101000000Z", b"301301000000Z")
    with pytest.raises(ValueError, match="no date"):
        validity_of_der(bad_month)


def test_openssl_certificates_read_as_openssl_reads_them(tmp_path: Path) -> None:
    certs = Certs(tmp_path)
    ca = certs.ca("ca", days=3650)
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
    days = validity_of_pem(leaf.cert.read_bytes())
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
