"""Certificates for TLS tests, made with `trustme`: CAs, a server certificate for
localhost, client certificates (P-256 keys, a client's key encrypted when a test gives a
password), written to files as a service's settings name them. And one mutual TLS
handshake with an in-process asyncio server that requires a client certificate
(`client_seen`)."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import trustme
from cryptography.hazmat.primitives import serialization


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Authority(Pair):
    """A CA's files, and the CA that issues its leaves."""

    issuer: trustme.CA


class Certs:
    """Certificates made in `directory`, each file named by its certificate's name."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def _write(self, name: str, suffix: str, cert: bytes, key: bytes) -> Pair:
        pair = Pair(self.directory / f"{name}{suffix}", self.directory / f"{name}.key")
        pair.cert.write_bytes(cert)
        pair.key.write_bytes(key)
        return pair

    def ca(self, name: str) -> Authority:
        """A root CA (trustme's: valid from 2000 to 3000), `name` its organizational unit."""
        ca = trustme.CA(organization_unit_name=name)
        made = self._write(name, ".pem", ca.cert_pem.bytes(), ca.private_key_pem.bytes())
        return Authority(made.cert, made.key, ca)

    def leaf(
        self,
        name: str,
        ca: Authority,
        *,
        server: bool = False,
        days: int = 30,
        password: str | None = None,
    ) -> Pair:
        """A certificate of CN `name` signed by `ca`, valid from now for `days`: a
        server's for localhost, or a client's; its key encrypted with `password` if
        given."""
        # whole seconds, as X.509 holds them: its validity is exactly `days`
        now = datetime.now(UTC).replace(microsecond=0)
        # trustme issues no certificate without a subject alternative name: a client's
        # names itself
        identities = ("localhost", "127.0.0.1") if server else (name,)
        leaf = ca.issuer.issue_cert(
            *identities, common_name=name, not_before=now, not_after=now + timedelta(days=days)
        )
        key = leaf.private_key_pem.bytes()
        if password is not None:
            # trustme writes no encrypted key: its key, re-serialized with the password
            key = serialization.load_pem_private_key(key, password=None).private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.BestAvailableEncryption(password.encode()),
            )
        return self._write(name, ".crt", leaf.cert_chain_pems[0].bytes(), key)


def server_context(server: Pair, *client_cas: Path) -> ssl.SSLContext:
    """A server's context that requires a client certificate of one of `client_cas`."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(server.cert, server.key)
    for ca in client_cas:
        context.load_verify_locations(cafile=ca)
    context.verify_mode = ssl.CERT_REQUIRED
    return context


async def client_seen(server: ssl.SSLContext, client: ssl.SSLContext) -> str:
    """One connection of `client` to an in-process server of `server` (as aiokafka opens
    one: `asyncio.open_connection` with its `ssl_context`): the common name of the
    certificate the server was shown."""
    seen: list[str] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peercert") or {}
        seen.extend(v for rdn in peer.get("subject", ()) for k, v in rdn if k == "commonName")
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    listening = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server)
    async with listening:
        port = listening.sockets[0].getsockname()[1]
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname="localhost"),
            10,
        )
        try:
            assert await asyncio.wait_for(reader.read(2), 10) == b"ok"
        finally:
            writer.close()
    [name] = seen
    return name
