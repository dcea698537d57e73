"""A secured broker's credentials and what clients need to use them.

The users' generated passwords (``secrets/``), :class:`Credentials` (certificates and
passwords, made on first use by :func:`ensure_credentials`), how a user connects
(:func:`client_auth`), the ``KAFKA_*`` variables a client needs (:func:`client_settings`,
:func:`env_lines`), the listener name and the SCRAM JAAS line. May import: constants,
state_dir, tls, wire.
"""

from __future__ import annotations

import secrets
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .constants import (
    ADMIN_USER,
    SASL_MECHANISM,
    SECRETS,
    SECURITY_PROTOCOLS,
    USERS,
    BrokerError,
    _say,
)
from .state_dir import _write_private
from .tls import TlsFiles, make_tls, tls_files
from .wire import ClientAuth


def listener_name(security: str) -> str:
    """The client listener's name (and Kafka security protocol) for ``--security``."""
    return security.upper()


def _jaas(username: str, password: str) -> str:
    return (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{username}" password="{password}";'
    )


def password_file(state_dir: Path, user: str) -> Path:
    """The file holding ``user``'s generated password (no trailing newline)."""
    return Path(state_dir) / SECRETS / f"{user}.password"


def read_password(state_dir: Path, user: str) -> str | None:
    try:
        return password_file(state_dir, user).read_text().strip() or None
    except OSError:
        return None


@dataclass(frozen=True)
class Credentials:
    """A secured broker's certificates and users, kept in its state dir across starts."""

    state_dir: Path
    security: str
    passwords: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def tls(self) -> TlsFiles:
        return tls_files(self.state_dir)


def ensure_credentials(state_dir: Path, security: str, *, keep: bool) -> Credentials | None:
    """The state dir's certificates and passwords for ``security``, made on first use.

    Kept across starts and ``--fresh`` (clients keep their CA file and passwords).  A
    SASL_SSL broker whose data is kept (``keep``) must find the passwords its SCRAM users
    were formatted with: missing ones are an error, not new ones.
    """
    if security not in SECURITY_PROTOCOLS:
        raise BrokerError(f"security must be one of {', '.join(SECURITY_PROTOCOLS)}")
    if security == "plaintext":
        return None
    state = Path(state_dir)
    tls = tls_files(state)
    if not tls.complete():
        _say(f"making a CA and certificates in {tls.directory}")
        make_tls(tls.directory)
    passwords: dict[str, str] = {}
    if security == "sasl_ssl":
        (state / SECRETS).mkdir(mode=0o700, exist_ok=True)
        for user in USERS:
            password = read_password(state, user)
            if password is None:
                if keep:
                    raise BrokerError(
                        f"{password_file(state, user)} is missing, but the broker's data "
                        "(with its SCRAM users) is kept: restore it, or `start --fresh`"
                    )
                password = secrets.token_urlsafe(18)
                _write_private(password_file(state, user), password)
            passwords[user] = password
    return Credentials(state, security, passwords)


def read_credentials(state_dir: Path, security: str) -> Credentials | None:
    """The credentials a broker of ``security`` in ``state_dir`` was started with (no new ones)."""
    if security == "plaintext":
        return None
    state = Path(state_dir)
    passwords = {user: pw for user in USERS if (pw := read_password(state, user)) is not None}
    return Credentials(state, security, passwords)


def client_auth(credentials: Credentials | None, user: str = ADMIN_USER) -> ClientAuth | None:
    """How ``user`` connects to a broker with ``credentials`` (None: PLAINTEXT)."""
    if credentials is None or credentials.security == "plaintext":
        return None
    tls = credentials.tls
    if credentials.security == "ssl":
        return ClientAuth("SSL", tls.ca, certfile=tls.cert(user), keyfile=tls.key(user))
    return ClientAuth("SASL_SSL", tls.ca, username=user, password=credentials.passwords.get(user))


def client_settings(
    state_dir: Path, security: str, bootstrap: str, user: str = ADMIN_USER
) -> dict[str, str]:
    """Every ``KAFKA_*`` variable a client needs to reach the broker as ``user``.

    ``KAFKA_BOOTSTRAP_SERVERS`` always; for a secured broker ``KAFKA_SECURITY_PROTOCOL``
    and ``KAFKA_SSL_CAFILE``, then the client certificate (``KAFKA_SSL_CERTFILE``,
    ``KAFKA_SSL_KEYFILE``: SSL) or the SCRAM user (``KAFKA_SASL_MECHANISM``,
    ``KAFKA_SASL_USERNAME``, ``KAFKA_SASL_PASSWORD_FILE``: SASL_SSL).
    """
    if user not in USERS:
        raise BrokerError(f"unknown user {user!r}: the users are {', '.join(USERS)}")
    settings = {"KAFKA_BOOTSTRAP_SERVERS": bootstrap}
    if security == "plaintext":
        if user != ADMIN_USER:
            raise BrokerError("a PLAINTEXT broker has no users (start it with --security)")
        return settings
    tls = tls_files(Path(state_dir))
    settings["KAFKA_SECURITY_PROTOCOL"] = listener_name(security)
    if security == "sasl_ssl":
        settings["KAFKA_SASL_MECHANISM"] = SASL_MECHANISM
        settings["KAFKA_SASL_USERNAME"] = user
        settings["KAFKA_SASL_PASSWORD_FILE"] = str(password_file(Path(state_dir), user))
    settings["KAFKA_SSL_CAFILE"] = str(tls.ca)
    if security == "ssl":
        settings["KAFKA_SSL_CERTFILE"] = str(tls.cert(user))
        settings["KAFKA_SSL_KEYFILE"] = str(tls.key(user))
    return settings


def env_lines(settings: Mapping[str, str]) -> list[str]:
    """``export NAME=value`` lines for ``eval``."""
    return [f"export {name}={shlex.quote(value)}" for name, value in settings.items()]
