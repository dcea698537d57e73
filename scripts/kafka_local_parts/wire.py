"""The Kafka wire protocol, as much as this script needs: stdlib only.

Request framing, ApiVersions and Metadata (the readiness probe: :func:`broker_ids`,
:func:`probe`, :func:`wait_until_ready`), a connection over TLS and SASL
(:class:`ClientAuth`), and the client side of SCRAM-SHA-256/512 (:class:`ScramClient`).
May import: constants, processes.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import secrets
import socket
import ssl
import struct
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .constants import DEFAULT_START_TIMEOUT, SASL_MECHANISM, BrokerError
from .processes import _alive


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("connection closed by the broker")
        chunks += chunk
    return bytes(chunks)


def _request(
    sock: socket.socket, api_key: int, version: int, correlation: int, body: bytes
) -> bytes:
    client_id = b"tickwheel-kafka-local"
    header = struct.pack(">hhih", api_key, version, correlation, len(client_id)) + client_id
    payload = header + body
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    (size,) = struct.unpack(">i", _recv_exact(sock, 4))
    response = _recv_exact(sock, size)
    (got,) = struct.unpack_from(">i", response, 0)
    if got != correlation:
        raise ConnectionError(f"unexpected correlation id {got}")
    return response[4:]


def _api_versions(sock: socket.socket) -> dict[int, tuple[int, int]]:
    body = _request(sock, 18, 0, 1, b"")
    error, count = struct.unpack_from(">hi", body, 0)
    if error != 0:
        raise ConnectionError(f"ApiVersions error {error}")
    versions: dict[int, tuple[int, int]] = {}
    for i in range(count):
        key, low, high = struct.unpack_from(">hhh", body, 6 + 6 * i)
        versions[key] = (low, high)
    return versions


def _metadata_brokers(sock: socket.socket, version: int) -> list[tuple[int, str, int]]:
    # Metadata v4..v8 (non-flexible): topics=[] (no topics), allow_auto_topic_creation=false,
    # v8 adds the two include_*_authorized_operations flags.
    body = struct.pack(">ib", 0, 0) + (b"\x00\x00" if version >= 8 else b"")
    response = _request(sock, 3, version, 2, body)
    offset = 4  # throttle_time_ms
    (count,) = struct.unpack_from(">i", response, offset)
    offset += 4
    brokers: list[tuple[int, str, int]] = []
    for _ in range(count):
        node_id, host_len = struct.unpack_from(">ih", response, offset)
        offset += 6
        host = response[offset : offset + host_len].decode()
        offset += host_len
        port, rack_len = struct.unpack_from(">ih", response, offset)
        offset += 6 + max(rack_len, 0)
        brokers.append((node_id, host, port))
    return brokers


class AuthenticationFailed(BrokerError):
    """The broker answered but refused this script's credentials (or its TLS certificate)."""


@dataclass(frozen=True)
class ClientAuth:
    """How a client (this script's probe, or a test) reaches a secured listener.

    ``protocol`` is Kafka's name (``SSL`` or ``SASL_SSL``); ``cafile`` verifies the broker;
    ``certfile``/``keyfile`` are the client certificate (mutual TLS, ``SSL``);
    ``username``/``password`` the SCRAM credentials (``SASL_SSL``).
    """

    protocol: str
    cafile: Path
    certfile: Path | None = None
    keyfile: Path | None = None
    username: str | None = None
    password: str | None = None
    mechanism: str = SASL_MECHANISM

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.cafile))
        if self.certfile is not None:
            context.load_cert_chain(str(self.certfile), str(self.keyfile or self.certfile))
        return context


def _string(value: str | None) -> bytes:
    if value is None:
        return struct.pack(">h", -1)
    raw = value.encode()
    return struct.pack(">h", len(raw)) + raw


def _read_string(data: bytes, offset: int) -> tuple[str | None, int]:
    (size,) = struct.unpack_from(">h", data, offset)
    offset += 2
    if size < 0:
        return None, offset
    return data[offset : offset + size].decode(errors="replace"), offset + size


def _version(versions: Mapping[int, tuple[int, int]], api: int, wanted: Sequence[int]) -> int:
    low, high = versions.get(api, (0, -1))
    usable = [v for v in wanted if low <= v <= high]
    if not usable:
        raise ConnectionError(f"the broker speaks no version of API {api} among {list(wanted)}")
    return usable[-1]


def _scram_name(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


class ScramClient:
    """The client side of SCRAM-SHA-256/512 (RFC 5802, RFC 7677), without channel binding."""

    def __init__(self, mechanism: str, username: str, password: str, nonce: str | None = None):
        digest = {"SCRAM-SHA-512": "sha512", "SCRAM-SHA-256": "sha256"}.get(mechanism)
        if digest is None:
            raise AuthenticationFailed(f"unsupported SASL mechanism {mechanism}")
        self.mechanism, self.digest, self.password = mechanism, digest, password
        self.nonce = nonce or base64.b64encode(secrets.token_bytes(24)).decode()
        self.first_bare = f"n={_scram_name(username)},r={self.nonce}"
        self._expected: str | None = None

    def first(self) -> str:
        """The client-first-message."""
        return "n,," + self.first_bare

    def final(self, server_first: str) -> str:
        """The client-final-message (with the proof) for the server-first-message."""
        fields = dict(item.split("=", 1) for item in server_first.split(",") if "=" in item)
        if "e" in fields or not fields.get("r", "").startswith(self.nonce):
            raise AuthenticationFailed(f"{self.mechanism}: unexpected message {server_first!r}")
        digest = self.digest
        salt, iterations = base64.b64decode(fields["s"]), int(fields["i"])
        salted = hashlib.pbkdf2_hmac(digest, self.password.encode(), salt, iterations)
        client_key = hmac.new(salted, b"Client Key", digest).digest()
        stored_key = hashlib.new(digest, client_key).digest()
        without_proof = f"c=biws,r={fields['r']}"
        message = f"{self.first_bare},{server_first},{without_proof}".encode()
        signature = hmac.new(stored_key, message, digest).digest()
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        server_key = hmac.new(salted, b"Server Key", digest).digest()
        verifier = hmac.new(server_key, message, digest).digest()
        self._expected = "v=" + base64.b64encode(verifier).decode()
        return f"{without_proof},p={base64.b64encode(proof).decode()}"

    def verify(self, server_final: str) -> None:
        """Check the server-final-message: the server knew the password too."""
        if self._expected is None or not hmac.compare_digest(server_final, self._expected):
            raise AuthenticationFailed(f"{self.mechanism}: the broker's signature does not match")


def _sasl_scram(
    sock: socket.socket, versions: Mapping[int, tuple[int, int]], auth: ClientAuth
) -> None:
    """Authenticate ``sock`` with SCRAM over Kafka's SASL framing (SaslHandshake v1 and
    SaslAuthenticate); :class:`AuthenticationFailed` when the broker refuses."""
    if auth.username is None or auth.password is None:
        raise AuthenticationFailed("SASL_SSL needs a username and a password")
    scram = ScramClient(auth.mechanism, auth.username, auth.password)
    handshake = _request(sock, 17, _version(versions, 17, (1,)), 3, _string(auth.mechanism))
    (error,) = struct.unpack_from(">h", handshake, 0)
    if error != 0:
        raise AuthenticationFailed(f"the broker does not enable {auth.mechanism} (error {error})")
    auth_version = _version(versions, 36, (0, 1))
    correlation = iter(range(4, 100))

    def exchange(message: str) -> str:
        raw = message.encode()
        response = _request(
            sock, 36, auth_version, next(correlation), struct.pack(">i", len(raw)) + raw
        )
        (code,) = struct.unpack_from(">h", response, 0)
        text, offset = _read_string(response, 2)
        if code != 0:
            raise AuthenticationFailed(f"{auth.mechanism} as {auth.username}: {text} ({code})")
        (size,) = struct.unpack_from(">i", response, offset)
        return response[offset + 4 : offset + 4 + max(size, 0)].decode()

    scram.verify(exchange(scram.final(exchange(scram.first()))))


@contextlib.contextmanager
def _connection(
    bootstrap: str, timeout: float, auth: ClientAuth | None
) -> Iterator[tuple[socket.socket, dict[int, tuple[int, int]]]]:
    """A connection to one ``host:port`` (TLS, SASL as ``auth`` says) and its ApiVersions."""
    host, _, port = bootstrap.rpartition(":")
    host = host.strip("[]")
    with socket.create_connection((host, int(port)), timeout=timeout) as raw:
        raw.settimeout(timeout)
        sock = raw
        try:
            if auth is not None:
                sock = auth.ssl_context().wrap_socket(raw, server_hostname=host)
            versions = _api_versions(sock)
            if auth is not None and auth.protocol.upper() == "SASL_SSL":
                _sasl_scram(sock, versions, auth)
            yield sock, versions
        except ssl.SSLCertVerificationError as exc:
            raise AuthenticationFailed(f"TLS: {exc.verify_message or exc}") from exc
        finally:
            if sock is not raw:
                sock.close()


def _first(bootstrap: str) -> str:
    return bootstrap.split(",", 1)[0].strip()


def broker_ids(
    bootstrap: str, timeout: float = 3.0, auth: ClientAuth | None = None
) -> list[int] | None:
    """The node ids that the broker at ``host:port`` lists in Metadata (None: no answer).

    An empty list: it answered ApiVersions but this probe speaks no common Metadata
    version.  Raises :class:`AuthenticationFailed` when it refuses ``auth``.
    """
    try:
        with _connection(_first(bootstrap), timeout, auth) as (sock, versions):
            low, high = versions.get(3, (0, -1))
            usable = [v for v in range(4, 9) if low <= v <= high]
            if not usable:
                return []
            return [node for node, _, _ in _metadata_brokers(sock, usable[-1])]
    except AuthenticationFailed:
        raise
    except (OSError, ValueError, KeyError, struct.error, UnicodeDecodeError):
        return None


def probe(
    bootstrap: str,
    timeout: float = 3.0,
    *,
    auth: ClientAuth | None = None,
    expect: Sequence[int] = (),
) -> bool:
    """Whether the broker at ``host:port`` answers ApiVersions and lists brokers in Metadata.

    With ``auth``, over TLS (and SASL); with ``expect``, only if those node ids are among
    the brokers it lists (a cluster's nodes have all registered).  Refused credentials
    count as no answer.
    """
    try:
        ids = broker_ids(bootstrap, timeout, auth)
    except AuthenticationFailed:
        return False
    if ids is None:
        return False
    if not ids:
        return not expect  # it answered ApiVersions; this probe speaks no common Metadata
    return set(expect) <= set(ids)


def wait_until_ready(
    bootstrap: str,
    timeout: float = DEFAULT_START_TIMEOUT,
    pid: int | None = None,
    *,
    auth: ClientAuth | None = None,
    expect: Sequence[int] = (),
) -> None:
    """Block until the broker answers, or raise BrokerError (also if ``pid`` dies).

    ``auth`` and ``expect`` as for :func:`probe`; refused credentials fail at once.
    """
    deadline = time.monotonic() + timeout
    while True:
        if pid is not None and not _alive(pid):
            raise BrokerError(f"the Kafka process {pid} exited during startup")
        ids = broker_ids(bootstrap, 2.0, auth)
        if ids is not None and (set(expect) <= set(ids) if ids else not expect):
            return
        if time.monotonic() >= deadline:
            raise BrokerError(f"Kafka at {bootstrap} did not answer within {timeout:g} s")
        time.sleep(0.1)
