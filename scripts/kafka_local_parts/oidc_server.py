"""The local broker's identity provider, run as a process of its own beside the broker
(``python oidc_server.py --dir STATE``; started and stopped by :mod:`oidc`): an OIDC token
endpoint (``POST /token``, the client-credentials grant) and the JWKS the broker checks
its tokens against (``GET /jwks``), on 127.0.0.1 and a free port, written with the pid
to ``STATE/oidc/server.json`` once it listens.

The clients are the broker's users: client id ``tickwheel``, secret its SCRAM password
(``STATE/secrets/tickwheel.password``). A token is an RS256 JWT signed with
``STATE/oidc/key.pem`` (made once, kept: tokens outlive a restart), ``sub`` the client id
(so the principal ``User:tickwheel``, whose ACLs the tests grant), ``aud`` ``kafka``,
``iss`` :data:`ISSUER`. Imports ``cryptography`` (the project's runtime dependency) and the
stdlib only; no sibling module (it runs as a script).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import os
import re
import sys
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote_plus

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

ISSUER = "tickwheel-kafka-local"
AUDIENCE = "kafka"
LIFETIME_S = 3600
KEY_FILE = "key.pem"
SERVER_FILE = "server.json"
_CLIENT_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_MAX_BODY = 64 * 1024


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def load_key(path: Path) -> rsa.RSAPrivateKey:
    """The signing key kept in ``path``, made (RSA 2048, mode 0600) when there is none."""
    if not path.exists():
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
    loaded = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(loaded, rsa.RSAPrivateKey):
        raise SystemExit(f"{path} holds no RSA key")
    return loaded


def key_id(key: rsa.RSAPrivateKey) -> str:
    public = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(public).hexdigest()[:16]


def jwks(key: rsa.RSAPrivateKey) -> dict[str, object]:
    numbers = key.public_key().public_numbers()

    def whole(n: int) -> str:
        return b64url(n.to_bytes((n.bit_length() + 7) // 8, "big"))

    return {
        "keys": [
            {
                "kty": "RSA",
                "use": "sig",
                "alg": "RS256",
                "kid": key_id(key),
                "n": whole(numbers.n),
                "e": whole(numbers.e),
            }
        ]
    }


def sign(key: rsa.RSAPrivateKey, claims: dict[str, object]) -> str:
    """``claims`` as an RS256 JWT (RFC 7515's compact form) signed with ``key``."""
    header = {"alg": "RS256", "typ": "JWT", "kid": key_id(key)}
    signing_input = f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(claims).encode())}"
    signature = key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
    return f"{signing_input}.{b64url(signature)}"


def token_claims(client_id: str, scope: str, now: float) -> dict[str, object]:
    issued = int(now)
    return {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": client_id,
        "azp": client_id,
        "scope": scope,
        "iat": issued,
        "nbf": issued - 5,
        "exp": issued + LIFETIME_S,
        "jti": uuid.uuid4().hex,
    }


class Provider:
    """The tokens and keys of one state dir."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.key = load_key(state / "oidc" / KEY_FILE)
        self.jwks = json.dumps(jwks(self.key)).encode()

    def secret_of(self, client_id: str) -> str | None:
        if not _CLIENT_ID.fullmatch(client_id):
            return None  # a name only: never a path out of secrets/
        try:
            return (self.state / "secrets" / f"{client_id}.password").read_text().strip() or None
        except OSError:
            return None

    def grant(self, form: dict[str, str], authorization: str) -> tuple[int, dict[str, object]]:
        """The answer to a token request: (HTTP status, JSON body)."""
        client_id, secret = form.get("client_id", ""), form.get("client_secret", "")
        scheme, _, encoded = authorization.partition(" ")
        if scheme.lower() == "basic":
            try:
                pair = base64.b64decode(encoded, validate=True).decode()
            except (ValueError, UnicodeDecodeError):
                return 401, {"error": "invalid_client"}
            raw_id, _, raw_secret = pair.partition(":")
            client_id, secret = unquote_plus(raw_id), unquote_plus(raw_secret)
        if form.get("grant_type") != "client_credentials":
            return 400, {"error": "unsupported_grant_type"}
        known = self.secret_of(client_id)
        if known is None or not hmac.compare_digest(known.encode(), secret.encode()):
            return 401, {"error": "invalid_client", "error_description": "unknown client"}
        scope = form.get("scope") or AUDIENCE
        token = sign(self.key, token_claims(client_id, scope, time.time()))
        return 200, {
            "access_token": token,
            "token_type": "Bearer",
            "expires_in": LIFETIME_S,
            "scope": scope,
        }


def handler(provider: Provider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/jwks":
                self._answer(404, b'{"error": "not_found"}')
                return
            self._answer(200, provider.jwks)

        def do_POST(self) -> None:
            if self.path != "/token":
                self._answer(404, b'{"error": "not_found"}')
                return
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 <= length <= _MAX_BODY:
                self._answer(413, b'{"error": "invalid_request"}')
                return
            body = self.rfile.read(length).decode(errors="replace")
            form = {k: v[0] for k, v in parse_qs(body).items()}
            status, answer = provider.grant(form, self.headers.get("Authorization", ""))
            self._answer(status, json.dumps(answer).encode())

        def _answer(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            sys.stderr.write(f"oidc: {self.address_string()} {format % args}\n")
            sys.stderr.flush()

    return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, type=Path, help="the broker's state dir")
    args = parser.parse_args(argv)
    state: Path = args.dir.absolute()
    (state / "oidc").mkdir(mode=0o700, exist_ok=True)
    provider = Provider(state)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(provider))
    port = server.server_address[1]
    written = state / "oidc" / f".{SERVER_FILE}.{os.getpid()}"
    written.write_text(json.dumps({"port": port, "pid": os.getpid()}))
    written.replace(state / "oidc" / SERVER_FILE)  # whole or not at all: the start reads it
    sys.stderr.write(f"oidc: listening on http://127.0.0.1:{port} (pid {os.getpid()})\n")
    sys.stderr.flush()
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
