"""OAUTHBEARER on a SASL_SSL broker (KIP-768): its token server (``oidc_server.py``, a
process started before the broker and stopped with it), the broker's settings and JVM
property that check tokens against the server's JWKS, and what a client needs to log in
with a token (:func:`oauth_client_settings`). May import: constants, credentials,
processes, state_dir, tls.

Kafka 3.9 and 4.1 alike: ``org.apache.kafka.common.security.oauthbearer.
OAuthBearerValidatorCallbackHandler`` (since 3.4; 3.x's ``...oauthbearer.secured.``
class, deprecated, is gone in 4.0), and the JVM property
``org.apache.kafka.sasl.oauthbearer.allowed.urls`` listing the JWKS and token URLs (in
4.x, unset allows none; in 3.9, unset allows all). The inter-broker login stays SCRAM;
the server's own OAUTHBEARER login (each enabled mechanism logs in) is the unsecured
one, used for nothing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .constants import (
    ADMIN_USER,
    BROKER_PRINCIPAL,
    OIDC,
    SCRAM_MECHANISMS,
    USERS,
    BrokerError,
    _say,
)
from .credentials import password_file
from .processes import _spawn, stop_token_server
from .tls import tls_files

VALIDATOR = "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler"
LOGIN_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
ALLOWED_URLS = "org.apache.kafka.sasl.oauthbearer.allowed.urls"
ISSUER = "tickwheel-kafka-local"  # oidc_server.ISSUER
AUDIENCE = "kafka"  # oidc_server.AUDIENCE
SERVER_SCRIPT = Path(__file__).with_name("oidc_server.py")
START_TIMEOUT = 30.0


@dataclass(frozen=True)
class TokenServer:
    """A running token server: its base URL (``http://127.0.0.1:PORT``) and pid."""

    base: str
    pid: int

    @property
    def token_url(self) -> str:
        return f"{self.base}/token"

    @property
    def jwks_url(self) -> str:
        return f"{self.base}/jwks"


def oauth_available() -> bool:
    """Whether this Python can sign tokens (``cryptography``): without it a SASL_SSL
    broker takes SCRAM alone, as before."""
    return importlib.util.find_spec("cryptography") is not None


def start_token_server(state_dir: Path) -> TokenServer:
    """Start the token server of ``state_dir`` (any earlier one stopped) and wait until it
    listens; :class:`BrokerError` with its log when it does not."""
    directory = state_dir / OIDC
    directory.mkdir(mode=0o700, exist_ok=True)
    stop_token_server(state_dir)
    (directory / "server.json").unlink(missing_ok=True)
    log = directory / "server.log"
    argv = [sys.executable, str(SERVER_SCRIPT), "--dir", str(state_dir)]
    pid = _spawn(argv, log)
    (directory / "server.pid").write_text(f"{pid}\n")
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        found = read_token_server(state_dir)
        if found is not None and found.pid == pid:
            return found
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            break
        time.sleep(0.05)
    stop_token_server(state_dir)
    said = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    raise BrokerError(f"the token server did not start:\n{said}")


def read_token_server(state_dir: Path) -> TokenServer | None:
    """The token server ``state_dir``'s broker was started with, None when none."""
    try:
        info = json.loads((state_dir / OIDC / "server.json").read_text())
        return TokenServer(f"http://127.0.0.1:{int(info['port'])}", int(info["pid"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def oauth_properties(server: TokenServer) -> dict[str, str]:
    """``server.properties`` lines adding OAUTHBEARER to the ``SASL_SSL`` listener, its
    tokens checked against ``server``'s JWKS (signature, ``exp``, ``aud``, ``iss``)."""
    prefix = "listener.name.sasl_ssl.oauthbearer."
    return {
        "sasl.enabled.mechanisms": ",".join((*SCRAM_MECHANISMS, "OAUTHBEARER")),
        f"{prefix}sasl.jaas.config": (
            f'{LOGIN_MODULE} required unsecuredLoginStringClaim_sub="{BROKER_PRINCIPAL}";'
        ),
        f"{prefix}sasl.server.callback.handler.class": VALIDATOR,
        "sasl.oauthbearer.jwks.endpoint.url": server.jwks_url,
        "sasl.oauthbearer.expected.audience": AUDIENCE,
        "sasl.oauthbearer.expected.issuer": ISSUER,
    }


def allowed_urls_option(server: TokenServer) -> str:
    """The broker JVM's option allowing ``server``'s URLs (Kafka 4.x refuses others)."""
    return f"-D{ALLOWED_URLS}={server.jwks_url},{server.token_url}"


def oauth_client_settings(
    state_dir: Path, bootstrap: str, user: str = ADMIN_USER
) -> dict[str, str]:
    """The ``KAFKA_*`` variables of a client logging in as ``user`` with OAUTHBEARER: the
    client id is the user, its secret the user's password file."""
    if user not in USERS:
        raise BrokerError(f"unknown user {user!r}: the users are {', '.join(USERS)}")
    server = read_token_server(state_dir)
    if server is None:
        raise BrokerError(
            f"{state_dir} has no token server: OAUTHBEARER needs a broker started with "
            "--security sasl_ssl by a Python with `cryptography`"
        )
    return {
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "KAFKA_SASL_MECHANISM": "OAUTHBEARER",
        "KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL": server.token_url,
        "KAFKA_SASL_OAUTHBEARER_CLIENT_ID": user,
        "KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET_FILE": str(password_file(state_dir, user)),
        "KAFKA_SSL_CAFILE": str(tls_files(state_dir).ca),
    }


def maybe_start(state_dir: Path, security: str) -> TokenServer | None:
    """The token server of a SASL_SSL broker about to start, None for other brokers (or
    without ``cryptography``: said once)."""
    if security != "sasl_ssl":
        return None
    if not oauth_available():
        _say("no `cryptography` in this Python: the broker takes SCRAM only, not OAUTHBEARER")
        return None
    return start_token_server(state_dir)
