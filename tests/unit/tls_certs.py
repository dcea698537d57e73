"""Certificates for TLS tests, made with the machine's `openssl` (`trustme` is no
dependency): CAs, a server certificate for localhost, client certificates; P-256 keys,
made in milliseconds. And one mutual TLS handshake with an in-process asyncio server that
requires a client certificate (`client_seen`)."""

from __future__ import annotations

import asyncio
import secrets
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

_CONFIG = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost,IP:127.0.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


class Certs:
    """Certificates made in `directory`, each named by its common name."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "openssl.cnf").write_text(_CONFIG)

    def _openssl(self, *arguments: str) -> None:
        subprocess.run(
            ["openssl", *arguments],
            cwd=self.directory,
            check=True,
            capture_output=True,
            stdin=subprocess.DEVNULL,
        )

    def _key(self, name: str, password: str | None) -> Path:
        encrypted = [] if password is None else ["-aes256", "-pass", f"pass:{password}"]
        self._openssl(
            "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
            *encrypted, "-out", f"{name}.key",
        )  # fmt: skip
        return self.directory / f"{name}.key"

    def ca(self, name: str, days: int = 30) -> Pair:
        key = self._key(name, None)
        self._openssl(
            "req", "-x509", "-new", "-key", key.name, "-out", f"{name}.pem", "-days",
            str(days), "-subj", f"/CN={name}", "-config", "openssl.cnf", "-extensions", "ca",
        )  # fmt: skip
        return Pair(self.directory / f"{name}.pem", key)

    def leaf(
        self,
        name: str,
        ca: Pair,
        *,
        server: bool = False,
        days: int = 30,
        password: str | None = None,
    ) -> Pair:
        """A certificate of CN `name` signed by `ca`: a server's for localhost, or a
        client's; its key encrypted with `password` if given."""
        key = self._key(name, password)
        passin = [] if password is None else ["-passin", f"pass:{password}"]
        self._openssl(
            "req", "-new", "-key", key.name, *passin, "-out", f"{name}.csr", "-subj",
            f"/CN={name}", "-config", "openssl.cnf",
        )  # fmt: skip
        self._openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", ca.cert.name, "-CAkey", ca.key.name,
            "-set_serial", "0x" + secrets.token_hex(16), "-days", str(days), "-out",
            f"{name}.crt", "-extfile", "openssl.cnf", "-extensions",
            "server" if server else "client",
        )  # fmt: skip
        return Pair(self.directory / f"{name}.crt", key)


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
