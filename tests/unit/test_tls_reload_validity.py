"""A renewal's checks beyond its pair (`app.kafka.tls_reload`): a client certificate not
valid now is refused while the one held is valid (warned about once, loaded all the same
when the one held is not valid either), and an encrypted key's password is read from its
file again at each load (a key not encrypted needs none), a key that does not decrypt
refused naming where its password comes from."""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from pathlib import Path

import pytest
from test_tls_reload import LOGGER, World, infos, warnings

from app.kafka.tls_expiry import validity_of_pem
from app.kafka.tls_reload import tls_reload


@pytest.mark.parametrize("which", ["expired", "not-yet-valid"])
async def test_a_renewal_not_valid_now_keeps_the_valid_certificate_held(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, which: str
) -> None:
    """A matching pair written over a working one, but expired (a backup restored) or not
    valid yet (its issuer's clock ahead), was loaded: the brokers refused every next
    connection. Refused as a key not the certificate's is: one WARNING with its dates,
    the pair held kept, tried again at each check: loaded once valid."""
    world = World(tmp_path)
    tls = world.reload()
    tls.check()
    held = tls.validity
    day = timedelta(days=1)
    if which == "expired":
        bad = world.dated("client-old", starts_in=-60 * day, ends_in=-30 * day)
    else:
        bad = world.dated("client-early", starts_in=timedelta(hours=1), ends_in=30 * day)
    world.put(bad)
    assert tls.check() is False
    assert await world.seen() == "client-1"
    assert tls.validity == held
    [warned] = warnings(caplog)
    dates = validity_of_pem(bad.cert.read_bytes())
    assert "kept" in warned and str(world.cert) in warned and "not now" in warned
    assert time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(dates.not_after)) in warned
    assert tls.check() is False
    assert len(warnings(caplog)) == 1, "the same refusal is said once"
    if which == "not-yet-valid":
        world.now += 2 * 3600
        assert tls.check() is True
        # (not shown to the server: its clock is the real one, the certificate not valid yet)
        assert world.loaded[-1] == (world.cert, dates.not_after)


async def test_a_renewal_not_valid_now_replaces_a_held_one_expired_too(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The certificate held expired itself: loading one not valid yet loses nothing (it
    will be, the held one never again); said in a WARNING."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    world = World(tmp_path)
    tls = world.reload()
    tls.check()
    assert tls.validity is not None
    world.now = tls.validity.not_after + 3600.0
    early = world.dated(
        "client-early", starts_in=timedelta(days=30, hours=2), ends_in=timedelta(days=60)
    )
    world.put(early)
    assert tls.check() is True
    assert world.loaded[-1] == (world.cert, validity_of_pem(early.cert.read_bytes()).not_after)
    assert any("loaded all the same" in w and "not valid now either" in w for w in warnings(caplog))
    assert any("reloaded" in i for i in infos(caplog))


async def test_a_key_renewed_with_its_password_file_loads(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An encrypted key renewed with a new password, KAFKA_SSL_KEY_PASSWORD_FILE written
    with it: the password was read once, at the start, and the renewal never loaded
    until a restart. Read again at each load: a key written before its password is
    refused (naming the password file), and loads once the password is written."""
    world = World(tmp_path, password="old-pass")
    secret = tmp_path / "password"
    secret.write_text("old-pass\n")
    tls = tls_reload(
        world.kafka, now=lambda: world.now, env={"KAFKA_SSL_KEY_PASSWORD_FILE": str(secret)}
    )
    assert tls is not None
    tls.check()
    second = world.certs.leaf("client-2", world.ca, password="new-pass")
    world.put(second)
    assert tls.check() is False
    assert await world.seen() == "client-1"
    [warned] = warnings(caplog)
    assert (
        "password" in warned and "KAFKA_SSL_KEY_PASSWORD_FILE" in warned and str(secret) in warned
    )
    assert "new-pass" not in warned and "old-pass" not in warned
    secret.write_text("new-pass\n")
    assert tls.check() is True
    assert await world.seen() == "client-2"


async def test_a_key_not_decrypting_names_the_password_given_at_the_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """KAFKA_SSL_KEY_PASSWORD is read once: a key renewed with another password is
    refused saying that its password is the likely cause, and that it takes a restart
    (OpenSSL says only "PEM lib")."""
    world = World(tmp_path, password="old-pass")
    tls = tls_reload(world.kafka, now=lambda: world.now, env={})
    assert tls is not None
    tls.check()
    world.put(world.certs.leaf("client-2", world.ca, password="new-pass"))
    assert tls.check() is False
    assert await world.seen() == "client-1"
    [warned] = warnings(caplog)
    assert "encrypted" in warned and "KAFKA_SSL_KEY_PASSWORD" in warned and "restart" in warned


async def test_a_renewal_not_valid_now_is_warned_about_once_as_time_passes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its refusal held the check's time, so each check's differed: one WARNING a minute
    until the held certificate ran out (a review's finding)."""
    world = World(tmp_path)
    tls = world.reload()
    tls.check()
    day = timedelta(days=1)
    world.put(world.dated("client-old", starts_in=-60 * day, ends_in=-30 * day))
    for _ in range(5):
        assert tls.check() is False
        world.now += 60
    assert len(warnings(caplog)) == 1, warnings(caplog)


async def test_a_key_not_encrypted_loads_without_its_password_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The password file was read before every load: with it dropped (no key needs it any
    more), no renewal of an unencrypted key loaded until a restart."""
    world = World(tmp_path, password="unused")
    secret = tmp_path / "pw"
    secret.write_text("unused")
    tls = tls_reload(
        world.kafka, now=lambda: world.now, env={"KAFKA_SSL_KEY_PASSWORD_FILE": str(secret)}
    )
    assert tls is not None
    tls.check()
    secret.unlink()
    world.put(world.certs.leaf("client-2", world.ca))
    assert tls.check(), warnings(caplog)
