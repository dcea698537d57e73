"""How to reach a Kafka cluster: its address and its security (TLS, SASL), the one place
every client the project creates takes its connection options from.

A plain bootstrap string is a PLAINTEXT connection to that address (the local broker,
the tests). `KafkaConnection` checks its own consistency (a SASL protocol needs a
mechanism and credentials, a certificate needs its key, every file must be readable), so
that a wrong setting is one clear error before anything connects.
"""

from __future__ import annotations

import contextlib
import functools
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from app.kafka.oauth import ClientCredentials, endpoint_context, token_provider
from app.kafka.oauth_token import endpoint_problem
from app.kafka.tls_files import digests, note_held, private_copies

__all__ = [
    "OAUTH_SETTINGS",
    "Connectable",
    "KafkaConnection",
    "SaslMechanism",
    "SecurityProtocol",
    "address",
    "client_options",
    "connection",
    "key_password",
    "read_tls_file",
]

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]

OAUTH_SETTINGS: dict[str, str] = {
    "sasl_oauthbearer_token_endpoint_url": "KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL",
    "sasl_oauthbearer_client_id": "KAFKA_SASL_OAUTHBEARER_CLIENT_ID",
    "sasl_oauthbearer_client_secret": "KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET",
    "sasl_oauthbearer_scope": "KAFKA_SASL_OAUTHBEARER_SCOPE",
    "sasl_oauthbearer_cafile": "KAFKA_SASL_OAUTHBEARER_CAFILE",
}
"""OAUTHBEARER's fields and their variables (named as Java's `sasl.oauthbearer.*`)."""

_OAUTH_OPTIONAL = frozenset({"sasl_oauthbearer_scope", "sasl_oauthbearer_cafile"})


MAX_TLS_FILE_BYTES = 1024 * 1024
"""The most a CA, certificate or key file may hold (a CA bundle is ~200 KiB)."""


class KafkaConnection(BaseModel):
    """A cluster's address and the client side of its security."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    bootstrap_servers: str = Field(min_length=1)
    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    sasl_oauthbearer_token_endpoint_url: str | None = None
    """OAUTHBEARER: the OIDC token endpoint (https; http to this machine alone)."""
    sasl_oauthbearer_client_id: str | None = None
    sasl_oauthbearer_client_secret: SecretStr | None = None
    sasl_oauthbearer_scope: str | None = None
    """OAUTHBEARER: the scope asked for (the endpoint's default when None)."""
    sasl_oauthbearer_cafile: Path | None = None
    """OAUTHBEARER: the CA the token endpoint's certificate is checked against; the
    system's CAs when absent (not `ssl_cafile`: an identity provider's certificate is
    seldom signed by the brokers' private CA)."""
    ssl_cafile: Path | None = None
    """The CA that signed the brokers' certificates; the system's CAs when absent."""
    ssl_certfile: Path | None = None
    """This client's certificate, for mutual TLS (with `ssl_keyfile`)."""
    ssl_keyfile: Path | None = None
    ssl_key_password: SecretStr | None = None
    """The password of an encrypted `ssl_keyfile` (never asked for on a terminal)."""

    @model_validator(mode="after")
    def _consistent(self) -> KafkaConnection:
        sasl = self.security_protocol.startswith("SASL_")
        tls = self.security_protocol.endswith("SSL")
        oauth = [var for name, var in OAUTH_SETTINGS.items() if getattr(self, name)]
        if sasl and self.sasl_mechanism == "OAUTHBEARER":
            _oauth_consistent(self)
        elif sasl and (
            self.sasl_mechanism is None
            or not self.sasl_username
            or self.sasl_password is None
            or not self.sasl_password.get_secret_value()
        ):
            raise ValueError(
                f"{self.security_protocol} needs KAFKA_SASL_MECHANISM, KAFKA_SASL_USERNAME and "
                "KAFKA_SASL_PASSWORD (or KAFKA_SASL_PASSWORD_FILE); or KAFKA_SASL_MECHANISM="
                "OAUTHBEARER and its KAFKA_SASL_OAUTHBEARER_* settings"
            )
        if not sasl and (self.sasl_mechanism or self.sasl_username or self.sasl_password or oauth):
            raise ValueError(
                f"SASL settings given, but KAFKA_SECURITY_PROTOCOL is {self.security_protocol}"
                " (use SASL_SSL or SASL_PLAINTEXT)"
            )
        if sasl and oauth and self.sasl_mechanism != "OAUTHBEARER":
            raise ValueError(
                f"{', '.join(oauth)} given, but KAFKA_SASL_MECHANISM is {self.sasl_mechanism}"
                " (they are OAUTHBEARER's)"
            )
        files = {
            "KAFKA_SSL_CAFILE": self.ssl_cafile,
            "KAFKA_SSL_CERTFILE": self.ssl_certfile,
            "KAFKA_SSL_KEYFILE": self.ssl_keyfile,
        }
        given = {name: path for name, path in files.items() if path is not None}
        if given and not tls:
            raise ValueError(
                f"{', '.join(given)} given, but KAFKA_SECURITY_PROTOCOL is "
                f"{self.security_protocol} (use SSL or SASL_SSL)"
            )
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("mutual TLS needs both KAFKA_SSL_CERTFILE and KAFKA_SSL_KEYFILE")
        if self.ssl_key_password is not None and self.ssl_keyfile is None:
            raise ValueError("KAFKA_SSL_KEY_PASSWORD given without KAFKA_SSL_KEYFILE")
        for name, path in given.items():
            read_tls_file(name, path)
        if tls:
            self.ssl_context()  # a bad CA or key pair is a setting error, said now
        return self

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of SSL and SASL_SSL; None without TLS. Made once for these files:
        every client holds this one object, into which `tls_reload` loads them renewed."""
        if not self.security_protocol.endswith("SSL"):
            return None
        password = self.ssl_key_password
        return _context(
            self.ssl_cafile,
            self.ssl_certfile,
            self.ssl_keyfile,
            None if password is None else password.get_secret_value(),
        )

    def describe(self, at: str | None = None) -> str:
        """Where (`at`: one of the brokers; else the bootstrap addresses) and how, for
        error messages (never the password)."""
        where = at or self.bootstrap_servers
        if self.security_protocol == "PLAINTEXT":
            return where
        how: str = self.security_protocol
        if self.sasl_mechanism == "OAUTHBEARER":
            how += f" OAUTHBEARER as client {self.sasl_oauthbearer_client_id!r}"
        elif self.sasl_mechanism is not None:
            how += f" {self.sasl_mechanism} as {self.sasl_username!r}"
        return f"{where} ({how})"

    def options(self) -> dict[str, Any]:
        """aiokafka's connection keyword arguments."""
        options: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers,
            "security_protocol": self.security_protocol,
        }
        if (context := self.ssl_context()) is not None:
            options["ssl_context"] = context
        if self.sasl_mechanism == "OAUTHBEARER":
            options["sasl_mechanism"] = "OAUTHBEARER"
            options["sasl_oauth_token_provider"] = self.token_provider()
        elif self.sasl_mechanism is not None:
            assert self.sasl_password is not None  # checked by the validator
            options["sasl_mechanism"] = self.sasl_mechanism
            options["sasl_plain_username"] = self.sasl_username
            options["sasl_plain_password"] = self.sasl_password.get_secret_value()
        return options

    def token_provider(self) -> ClientCredentials:
        """OAUTHBEARER's token provider: one for these settings, shared by every client."""
        endpoint = self.sasl_oauthbearer_token_endpoint_url
        secret = self.sasl_oauthbearer_client_secret
        assert endpoint and self.sasl_oauthbearer_client_id and secret  # the validator's
        return token_provider(
            endpoint,
            self.sasl_oauthbearer_client_id,
            secret.get_secret_value(),
            self.sasl_oauthbearer_scope or None,
            self.sasl_oauthbearer_cafile,
        )


def _oauth_consistent(c: KafkaConnection) -> None:
    """OAUTHBEARER's settings all there, usable, and no PLAIN/SCRAM login beside them."""
    secret = c.sasl_oauthbearer_client_secret
    missing = [
        var
        for name, var in OAUTH_SETTINGS.items()
        if name not in _OAUTH_OPTIONAL and not getattr(c, name)
    ]
    if secret is not None and not secret.get_secret_value():
        missing.append(OAUTH_SETTINGS["sasl_oauthbearer_client_secret"])
    if missing:
        raise ValueError(
            f"KAFKA_SASL_MECHANISM=OAUTHBEARER needs {', '.join(dict.fromkeys(missing))} "
            "(the secret best as KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET_FILE)"
        )
    if c.sasl_username or c.sasl_password:
        raise ValueError(
            "KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD are for PLAIN and SCRAM: "
            "OAUTHBEARER logs in with KAFKA_SASL_OAUTHBEARER_CLIENT_ID and _CLIENT_SECRET"
        )
    assert c.sasl_oauthbearer_token_endpoint_url is not None
    if (why := endpoint_problem(c.sasl_oauthbearer_token_endpoint_url)) is not None:
        raise ValueError(f"KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL: {why}")
    if c.sasl_oauthbearer_cafile is not None:
        _endpoint_ca_usable(c.sasl_oauthbearer_token_endpoint_url, c.sasl_oauthbearer_cafile)
    for name in ("sasl_oauthbearer_client_id", "sasl_oauthbearer_scope"):
        value: str | None = getattr(c, name)
        if value is not None and (not value.isprintable() or len(value) > 1000):
            raise ValueError(f"{OAUTH_SETTINGS[name]}: printable, at most 1000 characters")


def _endpoint_ca_usable(endpoint: str, cafile: Path) -> None:
    """KAFKA_SASL_OAUTHBEARER_CAFILE readable, a CA that loads, for an https endpoint."""
    name = OAUTH_SETTINGS["sasl_oauthbearer_cafile"]
    if urlsplit(endpoint).scheme != "https":
        raise ValueError(f"{name} given, but the token endpoint {endpoint} is not https://")
    read_tls_file(name, cafile)
    try:
        endpoint_context(endpoint, cafile)
    except (ssl.SSLError, OSError) as exc:
        raise ValueError(f"{name}: {str(cafile)!r} holds no usable CA: {exc}") from exc


def read_tls_file(name: str, path: Path) -> bytes:
    """What the CA, certificate or key file `path` (the setting `name`) holds; `ValueError`
    naming the setting when it is missing, no regular file, unreadable, empty or too large
    (read at the start and at each check of `tls_reload`)."""
    try:
        # A parent directory not searchable raises here, not in the open below.
        if not path.exists():
            raise ValueError(f"{name}: no such file {str(path)!r}")
        if not path.is_file():
            what = "a directory" if path.is_dir() else "not a regular file"
            raise ValueError(f"{name}: {str(path)!r} is {what}")
        with path.open("rb") as f:
            held = f.read(MAX_TLS_FILE_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"{name}: cannot read {str(path)!r}: {exc.strerror}") from exc
    if not held:
        raise ValueError(f"{name}: {str(path)!r} is empty")
    if len(held) > MAX_TLS_FILE_BYTES:
        raise ValueError(f"{name}: {str(path)!r} holds more than a PEM file would")
    return held


class _NoKeyPassword(ValueError):
    pass


def key_password(keyfile: Path | None, password: str | None) -> Callable[[], bytes]:
    """OpenSSL's password callback of `keyfile`, called only for an encrypted key: without
    it, OpenSSL asks on the terminal (a worker's start hangs there, or reads nothing and
    fails without saying why)."""

    def given() -> bytes:
        if password is None:
            raise _NoKeyPassword(
                f"KAFKA_SSL_KEYFILE {str(keyfile)!r} is encrypted: set KAFKA_SSL_KEY_PASSWORD "
                "(or KAFKA_SSL_KEY_PASSWORD_FILE)"
            )
        return password.encode()

    return given


@functools.cache
def _context(
    cafile: Path | None, certfile: Path | None, keyfile: Path | None, password: str | None
) -> ssl.SSLContext:
    """As aiokafka's `create_ssl_context` makes it (the system's CAs without `cafile`; the
    host name checked), built from private copies of the files' bytes, their digests noted
    (`tls_files.note_held`): the reload's first check loads it again only if a file
    changed since (`app.kafka.tls_reload`)."""
    given = {
        "KAFKA_SSL_CAFILE": cafile,
        "KAFKA_SSL_CERTFILE": certfile,
        "KAFKA_SSL_KEYFILE": keyfile,
    }
    read = {name: read_tls_file(name, path) for name, path in given.items() if path is not None}
    noted = digests(read)
    try:
        with contextlib.ExitStack() as stack:
            paths: list[str | Path | None]
            try:
                paths = list(stack.enter_context(private_copies([read.get(n) for n in given])))
            except OSError:
                # No copy to be made (no memory file, no writable temporary directory): built
                # from the files, nothing noted, so the reload's first check loads them again.
                paths, noted = [cafile, certfile, keyfile], {}
            context = _built(*paths, password=key_password(keyfile, password))
    except _NoKeyPassword:
        raise
    except (ssl.SSLError, OSError) as exc:
        raise ValueError(
            f"TLS material unusable (CA {cafile}, certificate {certfile}, key {keyfile}): {exc}"
        ) from exc
    note_held(context, noted)
    return context


def _built(
    cafile: str | Path | None,
    certfile: str | Path | None,
    keyfile: str | Path | None,
    *,
    password: Callable[[], bytes],
) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile)
    if certfile is not None:
        context.load_cert_chain(certfile, keyfile, password)
    return context


Connectable = str | KafkaConnection
"""A cluster: a bootstrap address (PLAINTEXT), or a `KafkaConnection`."""


def connection(where: Connectable) -> KafkaConnection:
    return where if isinstance(where, KafkaConnection) else KafkaConnection(bootstrap_servers=where)


def client_options(where: Connectable) -> dict[str, Any]:
    """aiokafka's connection keyword arguments for `where`."""
    if isinstance(where, str):
        return {"bootstrap_servers": where}
    return where.options()


def address(where: Connectable) -> str:
    """Where and how, for messages."""
    return where if isinstance(where, str) else where.describe()
