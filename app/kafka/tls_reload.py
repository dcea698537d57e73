"""A running node's TLS files read again (`TlsReload`, made by `tls_reload`): a client
certificate renewed on disk (cert-manager, Vault) or a CA added to the bundle is loaded
into the one `ssl.SSLContext` every aiokafka client of the node holds
(`KafkaConnection.ssl_context`), so that their next connections present it; the
connections open go on with what they began with.

`SSLContext.load_cert_chain` on a context replaces its certificate and key for later
handshakes; `load_verify_locations` only adds CAs: a CA removed from the bundle stays
trusted until a restart. librdkafka's clients (`TICKWHEEL_KAFKA_CLIENT=confluent`) read
the files once, when each is made: they are not reloaded here.

A pair is loaded only once it loads together: the files are read, copied into private
memory files (or a private temporary directory, `tls_files.private_copies`), loaded from
those copies into a scratch context first (the key matched to the certificate, an
encrypted key's password tried), and then the very same copies into the clients' context,
so that a certificate renewed before its key is never mixed with the old one. A client
certificate not valid at the check (expired: a backup restored; or not yet: its issuer's
clock ahead) is not loaded in place of one that is: the brokers would refuse the next
connections. One the context holds that is no longer valid itself is replaced all the
same (nothing is lost), said in a WARNING. A refused change is one WARNING (the old
material kept) and retried at the next check.

What a file is compared with is what the clients' context holds (`tls_files.held`): the
digests of the bytes it was built from (`KafkaConnection.ssl_context`), then of those each
load put in it. The first check loads nothing again when the files are still those, and
one changed since the build is loaded.

The load runs on the node's event loop, between its connections' handshakes; aiokafka's
producers on a thread of their own (`TICKWHEEL_PRODUCER_THREAD`) share the context, and
OpenSSL does not lock a context's certificate against a handshake on another thread: a
window of microseconds, once per renewal.

An encrypted key's password given as a file (`KAFKA_SSL_KEY_PASSWORD_FILE` in the
process's environment, a secret's mount) is read again at each load, so that a key
renewed with a new password loads once both are written; given as
`KAFKA_SSL_KEY_PASSWORD` (or its file named in a `.env` file) it is the one read at the
start. A key that does not decrypt is refused naming where its password comes from.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

from app.kafka.connection import KafkaConnection, key_password, read_tls_file
from app.kafka.tls_expiry import Validity, expiry_warning_due, valid_at, validity_of_pem
from app.kafka.tls_files import digests, held, note_held, private_copies

__all__ = [
    "CHECK_EVERY_S",
    "PASSWORD_FILE",
    "TlsReload",
    "changed_files",
    "load_material",
    "tls_reload",
]

logger = logging.getLogger(__name__)

CHECK_EVERY_S: Final = 60.0
"""How often the files are read (a renewal comes hours or days before the end)."""

CA, CERT, KEY = "KAFKA_SSL_CAFILE", "KAFKA_SSL_CERTFILE", "KAFKA_SSL_KEYFILE"
PASSWORD_FILE: Final = "KAFKA_SSL_KEY_PASSWORD_FILE"


def changed_files(loaded: Mapping[str, str], read: Mapping[str, str]) -> list[str]:
    """The settings whose file holds other than what the context holds (`loaded`: each
    one's digest; empty when not known: every file)."""
    return [name for name, digest in read.items() if loaded.get(name) != digest]


def load_material(
    context: ssl.SSLContext,
    cafile: str | None,
    certfile: str | None,
    keyfile: str | None,
    password: Callable[[], bytes],
) -> None:
    """Loads a CA bundle (added to those trusted) and a certificate with its key (in place
    of the one held) into `context`: `ssl.SSLError` when OpenSSL cannot use them (a key
    not the certificate's among them), `OSError`, or `ValueError` (an encrypted key
    without a password)."""
    if cafile is not None:
        context.load_verify_locations(cafile=cafile)
    if certfile is not None:
        context.load_cert_chain(certfile, keyfile, password)


class TlsReload:
    """Reads the TLS files every `CHECK_EVERY_S` (`run`) and loads them, changed, into
    `context` (`check`); warns while the loaded client certificate nears its end."""

    def __init__(
        self,
        context: ssl.SSLContext,
        files: Mapping[str, Path],
        *,
        password: str | None = None,
        password_file: Path | None = None,
        now: Callable[[], float] = time.time,
        on_loaded: Callable[[Path, Validity], None] | None = None,
    ) -> None:
        self._context = context
        self.files = dict(files)  # by setting: CA, CERT, KEY (each only if given)
        self._given_password = password
        # Where the password was read from: read again at each load (None: the one given).
        self._password_file = password_file
        self._now = now
        self._on_loaded = on_loaded
        # The digests of the files `validity` is of (None before the first check took any).
        self._taken: dict[str, str] | None = None
        self._refused: str | None = None  # the refusal last warned about
        self.validity: Validity | None = None  # the loaded client certificate's
        self._warned_at: float | None = None

    async def run(self) -> None:
        """Checks the files at once, then every `CHECK_EVERY_S`, until cancelled."""
        while True:
            try:
                self.check()
            except Exception as exc:
                # The material loaded still serves: a reload that fails in a way not
                # foreseen (no memory file to copy into, a certificate OpenSSL took and
                # cryptography did not) is said and tried again, never the node's stop.
                self._refuse(f"the reload failed: {type(exc).__name__}: {exc}")
            await asyncio.sleep(CHECK_EVERY_S)

    def check(self) -> bool:
        """Reads the files and loads them if they changed and load together (an INFO);
        otherwise keeps what the context holds (a WARNING, once for the same refusal).
        Then warns if the client certificate loaded nears its end. Whether it loaded."""
        loaded = False
        try:
            read = {name: read_tls_file(name, path) for name, path in self.files.items()}
        except ValueError as exc:
            self._refuse(f"{exc}")
        else:
            read_digests = digests(read)
            if changed := changed_files(held(self._context), read_digests):
                loaded = self._load(read, read_digests, changed)
            else:
                self._refused = None  # back to what is loaded: a refusal again is news
                if read_digests != self._taken:
                    # What the context was built from (or another reload of it loaded):
                    # taken, not loaded again.
                    self._took(read, read_digests, changed_files(self._taken or {}, read_digests))
        self._warn_of_expiry()
        return loaded

    def _load(
        self, read: Mapping[str, bytes], read_digests: dict[str, str], changed: list[str]
    ) -> bool:
        try:
            # Its file read only for a key that is encrypted: one renewed without (its
            # password file dropped) loads.
            encrypted = b"ENCRYPTED" in read.get(KEY, b"")
            given = self._password() if encrypted else self._given_password
            password = key_password(self.files.get(KEY), given)
        except ValueError as exc:
            self._refuse(f"{exc}")
            return False
        names = [CA, CERT, KEY]
        with private_copies([read.get(name) for name in names]) as (cafile, certfile, keyfile):
            try:
                load_material(
                    ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT),
                    cafile,
                    certfile,
                    keyfile,
                    password,
                )
            except (ssl.SSLError, OSError, ValueError) as exc:
                self._refuse(f"{self._named(changed)} unusable: {exc}{self._hint(read, exc)}")
                return False
            if CERT in changed and (why := self._not_valid_now(read[CERT])) is not None:
                self._refuse(why)
                return False
            # The very copies the trial loaded: a file replaced since is not mixed in.
            load_material(self._context, cafile, certfile, keyfile, password)
        note_held(self._context, read_digests)
        self._refused = None
        self._took(read, read_digests, changed)
        return True

    def _password(self) -> str | None:
        """The key's password: its file's content now, or the one given."""
        if self._password_file is None:
            return self._given_password
        held = read_tls_file(PASSWORD_FILE, self._password_file)
        try:
            password = held.decode("utf-8").strip()
        except UnicodeDecodeError as exc:  # its bytes never said: a secret's
            raise ValueError(f"{PASSWORD_FILE}: {str(self._password_file)!r} is not UTF-8") from exc
        if not password:
            raise ValueError(f"{PASSWORD_FILE}: {str(self._password_file)!r} holds only spaces")
        return password

    def _hint(self, read: Mapping[str, bytes], exc: Exception) -> str:
        """What likely failed when an encrypted key did not load: its password (OpenSSL
        says "PEM lib"), and where that comes from."""
        encrypted = b"ENCRYPTED" in read.get(KEY, b"")
        mismatch = isinstance(exc, ssl.SSLError) and exc.reason == "KEY_VALUES_MISMATCH"
        if not encrypted or mismatch or not isinstance(exc, ssl.SSLError):
            return ""
        if self._password_file is not None:
            source = (
                f"{PASSWORD_FILE} {str(self._password_file)!r} (read again at each check: "
                "write the new password there with the key)"
            )
        else:
            source = (
                "KAFKA_SSL_KEY_PASSWORD (read once, at the start: a new password needs a "
                f"restart, or give it as {PASSWORD_FILE} in the environment)"
            )
        return f"; the key is encrypted: likely not with the password of {source}"

    def _not_valid_now(self, pem: bytes) -> str | None:
        """Why the renewed certificate `pem` is refused: not valid now, while the one held
        is. None when it is loaded: valid now, its dates unread (OpenSSL took it, as
        before), or the one held no better (expired too, or its dates unknown)."""
        try:
            new = validity_of_pem(pem)
        except ValueError:
            return None
        now = self._now()  # the expiry warning's clock
        if valid_at(now, new):
            return None
        dates = (
            f"the client certificate is valid from {_utc(new.not_before)} until "
            f"{_utc(new.not_after)}, not now"  # no time in it: warned once, not each check
        )
        held = self.validity
        if held is not None and valid_at(now, held):
            return (
                f"{self._named([CERT])}: {dates}, and the brokers would refuse it; the one "
                f"held is valid until {_utc(held.not_after)}"
            )
        logger.warning(
            "Kafka TLS: %s: %s; loaded all the same: the one held is %s",
            self._named([CERT]),
            dates,
            "not valid now either" if held is not None else "of dates unknown",
        )
        return None

    def _took(
        self, read: Mapping[str, bytes], read_digests: dict[str, str], changed: list[str]
    ) -> None:
        """The context holds `read` now (`changed` other than what was taken before): its
        client certificate's end, exported and said."""
        first, self._taken = self._taken is None, read_digests
        validity, said = None, ""
        if CERT in read:
            try:
                validity = validity_of_pem(read[CERT])
            except ValueError as exc:  # OpenSSL took it: loaded all the same
                said = f"; its expiry unread ({exc})"
            else:
                said = f"; the client certificate valid until {_utc(validity.not_after)}"
        self.validity, self._warned_at = validity, None
        if validity is not None and self._on_loaded is not None:
            self._on_loaded(self.files[CERT], validity)
        if first:
            logger.info(
                "Kafka TLS: %s loaded%s; read again every %.0f s for renewals",
                self._named(list(self.files)),
                said,
                CHECK_EVERY_S,
            )
        else:
            logger.info(
                "Kafka TLS reloaded (%s changed)%s: new connections to the brokers use it",
                self._named(changed),
                said,
            )

    def _refuse(self, why: str) -> None:
        if why == self._refused:
            return  # said once: the same files, refused again at each check
        self._refused = why
        logger.warning(
            "Kafka TLS files not reloaded, the loaded ones kept (read again in %.0f s): %s",
            CHECK_EVERY_S,
            why,
        )

    def _warn_of_expiry(self) -> None:
        validity, now = self.validity, self._now()
        if validity is None or not expiry_warning_due(now, validity, self._warned_at):
            return
        self._warned_at = now
        left = validity.not_after - now
        when = "expired" if left <= 0 else f"expires in {left / 3600:.1f} h"
        logger.warning(
            "Kafka client certificate %s %s (%s), not renewed: the brokers refuse new "
            "connections with it once expired; renew %s and %s (read every %.0f s)",
            self.files[CERT],
            when,
            _utc(validity.not_after),
            CERT,
            KEY,
            CHECK_EVERY_S,
        )

    def _named(self, names: Sequence[str]) -> str:
        return ", ".join(f"{name} {str(self.files[name])!r}" for name in names)


def tls_reload(
    kafka: KafkaConnection,
    *,
    now: Callable[[], float] = time.time,
    on_loaded: Callable[[Path, Validity], None] | None = None,
    env: Mapping[str, str] | None = None,
) -> TlsReload | None:
    """The reload of `kafka`'s TLS files into the context its clients hold; None without
    TLS, or with TLS and no file (the system's CAs, no client certificate). The key's
    password is read again from `KAFKA_SSL_KEY_PASSWORD_FILE` when `env` (the process's
    environment by default) names it: the settings read it from there."""
    context = kafka.ssl_context()
    given = {CA: kafka.ssl_cafile, CERT: kafka.ssl_certfile, KEY: kafka.ssl_keyfile}
    files = {name: path for name, path in given.items() if path is not None}
    if context is None or not files:
        return None
    password = kafka.ssl_key_password
    named = (os.environ if env is None else env).get(PASSWORD_FILE, "").strip()
    return TlsReload(
        context,
        files,
        password=None if password is None else password.get_secret_value(),
        password_file=Path(named) if named and password is not None else None,
        now=now,
        on_loaded=on_loaded,
    )


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
