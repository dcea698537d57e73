"""A running node's TLS files read again (`app.kafka.tls_reload`): a client certificate
renewed on disk is the one the next connection presents, through the very context every
client holds; a CA added to the bundle is trusted by the next; a certificate renewed
before its key, or a file unreadable, changes nothing (one WARNING) until the files load
together; a certificate near its end is warned about once a day. Against an in-process
TLS server that requires a client certificate, no broker; the clock is a test's."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import ssl
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from tls_certs import Certs, Pair, client_seen, server_context

from app.kafka import connection as connection_module
from app.kafka import tls_files
from app.kafka import tls_reload as reload_module
from app.kafka.connection import KafkaConnection
from app.kafka.tls_expiry import validity_of_pem
from app.kafka.tls_reload import CA, CERT, KEY, TlsReload, tls_reload

LOGGER = "app.kafka.tls_reload"


class World:
    """A CA, a server of it that requires a client certificate of it, and the client's
    files (`cert`, `key`, `ca`) as its settings name them, first holding `client-1`."""

    def __init__(self, tmp_path: Path, *, password: str | None = None) -> None:
        self.certs = Certs(tmp_path / "made")
        self.ca = self.certs.ca("ca-1")
        self.server = server_context(self.certs.leaf("broker", self.ca, server=True), self.ca.cert)
        self.password = password
        self.first = self.certs.leaf("client-1", self.ca, password=password)
        files = tmp_path / "mounted"
        files.mkdir()
        self.cert, self.key, self.ca_file = files / "tls.crt", files / "tls.key", files / "ca.crt"
        shutil.copy(self.ca.cert, self.ca_file)
        self.put(self.first)
        self.kafka = KafkaConnection(
            bootstrap_servers="127.0.0.1:9093",
            security_protocol="SSL",
            ssl_cafile=self.ca_file,
            ssl_certfile=self.cert,
            ssl_keyfile=self.key,
            ssl_key_password=password,
        )
        # The reload's clock: a test's, starting at the time the certificates are issued from.
        self.now = time.time()
        self.loaded: list[tuple[Path, int]] = []

    def put(self, pair: Pair, *, cert: bool = True, key: bool = True) -> None:
        """Renews the files in place, as a cert-manager or Vault agent writes them."""
        if cert:
            self.cert.write_bytes(pair.cert.read_bytes())
        if key:
            self.key.write_bytes(pair.key.read_bytes())

    def dated(self, name: str, *, starts_in: timedelta, ends_in: timedelta) -> Pair:
        """A client certificate of the CA valid from now + `starts_in` to now + `ends_in`
        (an expired one: a backup restored; one not valid yet: its issuer's clock ahead)."""
        start = datetime.fromtimestamp(int(self.now), UTC)
        leaf = self.ca.issuer.issue_cert(
            name, common_name=name, not_before=start + starts_in, not_after=start + ends_in
        )
        pair = Pair(self.certs.directory / f"{name}.crt", self.certs.directory / f"{name}.key")
        pair.cert.write_bytes(leaf.cert_chain_pems[0].bytes())
        pair.key.write_bytes(leaf.private_key_pem.bytes())
        return pair

    def reload(self) -> TlsReload:
        made = tls_reload(
            self.kafka,
            now=lambda: self.now,
            on_loaded=lambda path, v: self.loaded.append((path, v.not_after)),
        )
        assert made is not None
        return made

    async def seen(self) -> str:
        """The client certificate the server is shown on a new connection of the
        context aiokafka's clients are given."""
        context = self.kafka.options()["ssl_context"]
        assert isinstance(context, ssl.SSLContext)
        return await client_seen(self.server, context)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelname == "WARNING"]


def infos(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelname == "INFO"]


@pytest.mark.parametrize("in_memory", [True, False], ids=["memory-files", "temporary-dir"])
async def test_a_renewed_client_certificate_is_the_one_the_next_connection_presents(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    in_memory: bool,
) -> None:
    """The reason for the reload: a node started with a short-lived certificate kept
    presenting it (read once, at the start) and, once it expired, could make no new
    connection until restarted. Encrypted keys renew with the same password."""
    monkeypatch.setattr(tls_files, "_IN_MEMORY", in_memory and tls_files._IN_MEMORY)
    caplog.set_level(logging.INFO, logger=LOGGER)
    world = World(tmp_path, password="s3cret")
    tls = world.reload()
    assert tls.check() is False  # the first check: what the context was built from, held
    assert await world.seen() == "client-1"
    assert tls.check() is False, "unchanged: nothing loaded"
    second = world.certs.leaf("client-2", world.ca, days=20, password="s3cret")
    world.put(second)
    assert tls.check() is True
    assert await world.seen() == "client-2"
    not_after = validity_of_pem(second.cert.read_bytes()).not_after
    assert world.loaded[-1] == (world.cert, not_after)
    [_, reloaded] = infos(caplog)
    assert "reloaded" in reloaded and str(world.cert) in reloaded and str(world.key) in reloaded
    assert "valid until 20" in reloaded
    assert warnings(caplog) == []


async def test_a_certificate_renewed_before_its_key_waits_for_the_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A half-written renewal (the certificate written, its key not yet) is never
    loaded: OpenSSL would hold the new certificate without a key and every new
    connection fail. One WARNING, the old pair kept, loaded at the check after the key."""
    world = World(tmp_path)
    tls = world.reload()
    tls.check()
    second = world.certs.leaf("client-2", world.ca)
    world.put(second, key=False)
    assert tls.check() is False
    assert await world.seen() == "client-1"
    [warned] = warnings(caplog)
    assert "KAFKA_SSL_CERTFILE" in warned and "unusable" in warned and "kept" in warned
    assert tls.check() is False
    assert len(warnings(caplog)) == 1, "the same refusal is said once"
    world.put(second, cert=False)
    assert tls.check() is True
    assert await world.seen() == "client-2"


async def test_unreadable_files_keep_what_was_loaded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    world = World(tmp_path)
    tls = world.reload()
    tls.check()
    world.key.unlink()  # between a secret mount's swaps
    assert tls.check() is False
    world.cert.write_bytes(b"")
    world.put(world.first, cert=False)
    assert tls.check() is False
    world.cert.write_bytes(b"-----BEGIN CERTIFICATE-----\nMIIB")  # cut short
    assert tls.check() is False
    assert await world.seen() == "client-1"
    said = warnings(caplog)
    assert len(said) == 3, said
    assert "no such file" in said[0] and "is empty" in said[1] and "unusable" in said[2]
    world.put(world.first)  # back to what is loaded: nothing to load
    assert tls.check() is False
    world.key.unlink()
    tls.check()
    assert len(warnings(caplog)) == 4, "refused again after a good read: said again"


async def test_a_ca_added_to_the_bundle_is_trusted_by_the_next_connection(tmp_path: Path) -> None:
    """The brokers' certificates rotated to a new CA, the bundle given both first: new
    connections trust it. (A CA removed from the bundle stays trusted until a restart:
    OpenSSL only adds to a context's store.)"""
    world = World(tmp_path)
    tls = world.reload()
    tls.check()
    new_ca = world.certs.ca("ca-2")
    world.server = server_context(world.certs.leaf("broker-2", new_ca, server=True), world.ca.cert)
    with pytest.raises(ssl.SSLCertVerificationError):
        await world.seen()
    world.ca_file.write_bytes(world.ca.cert.read_bytes() + new_ca.cert.read_bytes())
    assert tls.check() is True
    assert await world.seen() == "client-1"


def test_a_client_certificate_near_its_end_is_warned_about_once_a_day(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    world = World(tmp_path)
    tls = world.reload()
    tls.check()
    assert tls.validity is not None
    end = tls.validity.not_after  # valid 30 days: warned about in its last 3 (a tenth)
    world.now = end - 4 * 86400
    tls.check()
    assert warnings(caplog) == []
    world.now = end - 2 * 86400
    tls.check()
    world.now += 3600
    tls.check()
    [warned] = warnings(caplog)
    assert str(world.cert) in warned and "expires in 48.0 h" in warned
    world.now = end + 86400  # past a day since: again
    tls.check()
    assert "expired" in warnings(caplog)[-1]
    world.put(world.certs.leaf("client-2", world.ca, days=60))
    world.now += 3600
    tls.check()
    assert len(warnings(caplog)) == 2, "renewed: nothing to warn of"


def test_no_reload_without_tls_files(tmp_path: Path) -> None:
    assert tls_reload(KafkaConnection(bootstrap_servers="b:9092")) is None
    system_cas = KafkaConnection(bootstrap_servers="b:9093", security_protocol="SSL")
    assert tls_reload(system_cas) is None
    ca_only = World(tmp_path).kafka.model_copy(update={"ssl_certfile": None, "ssl_keyfile": None})
    made = tls_reload(ca_only)
    assert made is not None and set(made.files) == {"KAFKA_SSL_CAFILE"}
    assert made.check() is False and made.validity is None  # built from the CA: held


async def test_a_directory_not_searchable_keeps_what_was_loaded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A secret's mount remade with other permissions: the stat of the path itself fails
    # (as root, chmod cannot show it: the stat is made to fail).
    world = World(tmp_path)
    tls = world.reload()
    tls.check()
    world.put(world.certs.leaf("client-2", world.ca))

    def denied(self: Path, *args: object, **kw: object) -> bool:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "exists", denied)
    assert tls.check() is False
    monkeypatch.undo()
    assert "Permission denied" in warnings(caplog)[0]
    assert await world.seen() == "client-1"
    assert tls.check() is True
    assert await world.seen() == "client-2"


async def test_a_reload_failing_unforeseen_is_said_and_the_watch_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No memory file to copy into (EMFILE): the loaded material still serves, so the watch
    # (whose end stops the node) says it and tries again at its next check.
    world = World(tmp_path)
    tls = world.reload()
    tls.check()
    world.put(world.certs.leaf("client-2", world.ca))

    def no_files(contents: object) -> object:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(reload_module, "private_copies", no_files)
    watch = asyncio.create_task(tls.run())
    while not warnings(caplog):
        assert not watch.done(), watch
        await asyncio.sleep(0.01)
    watch.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watch
    assert "the reload failed: OSError" in warnings(caplog)[0]
    assert await world.seen() == "client-1"


# --- the first check: what the clients' context was built from is not loaded again ------


class Loads:
    """The loads into `context` (the one every client holds), by method, in order."""

    def __init__(self, context: ssl.SSLContext, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        for name in ("load_verify_locations", "load_cert_chain"):
            real = getattr(context, name)

            def spy(*args: object, _real: Any = real, _name: str = name, **kw: object) -> Any:
                self.calls.append(_name)
                return _real(*args, **kw)

            monkeypatch.setattr(context, name, spy)


async def test_the_first_check_loads_nothing_the_context_was_built_from(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The clients' context was just built from these files: the first check takes their
    digests, the certificate's end (exported, warned about) and says them, and loads
    nothing (it loaded them all again, the work of the start done twice). A renewal after
    it is loaded as ever."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    world = World(tmp_path)
    context = world.kafka.ssl_context()
    assert context is not None
    loads = Loads(context, monkeypatch)
    tls = world.reload()
    loaded = tls.check()
    assert loads.calls == [], "loaded again what the context was just built from"
    assert loaded is False
    not_after = validity_of_pem(world.first.cert.read_bytes()).not_after
    assert tls.validity is not None and tls.validity.not_after == not_after
    assert world.loaded == [(world.cert, not_after)]
    [said] = infos(caplog)
    assert "loaded; the client certificate valid until 20" in said and str(world.key) in said
    assert await world.seen() == "client-1"
    assert tls.check() is False and loads.calls == []
    world.put(world.certs.leaf("client-2", world.ca))
    assert tls.check() is True
    assert loads.calls == ["load_verify_locations", "load_cert_chain"]
    assert await world.seen() == "client-2"


async def test_a_file_changed_between_the_build_and_the_first_check_is_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = World(tmp_path)
    context = world.kafka.ssl_context()
    assert context is not None
    loads = Loads(context, monkeypatch)
    second = world.certs.leaf("client-2", world.ca, days=20)
    world.put(second, key=False)  # the certificate first: refused until its key comes
    tls = world.reload()
    assert tls.check() is False
    world.put(second, cert=False)
    assert tls.check() is True
    assert loads.calls == ["load_verify_locations", "load_cert_chain"]
    assert await world.seen() == "client-2"
    not_after = validity_of_pem(second.cert.read_bytes()).not_after
    assert tls.validity is not None and tls.validity.not_after == not_after


@pytest.mark.parametrize("copies", [True, False], ids=["copies", "no-copies"])
async def test_a_file_renewed_during_the_build_is_loaded_by_the_first_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, copies: bool
) -> None:
    """Renewed after the build read the files, before it loaded them: the context holds
    what was read (it loads copies of those bytes), and the first check loads the renewal.
    With no copy to be made (no memory file, no writable temporary directory), it is built
    from the files themselves, and the first check loads them all again."""
    world = World(tmp_path)
    second = world.certs.leaf("client-2", world.ca)
    real = tls_files.private_copies

    @contextlib.contextmanager
    def renewed(contents: Sequence[bytes | None]) -> Iterator[list[str | None]]:
        world.put(second)
        if not copies:
            raise OSError(24, "Too many open files")
        with real(contents) as paths:
            yield paths

    monkeypatch.setattr(connection_module, "private_copies", renewed)
    # Built afresh (not the one `ssl_context` made before, and keeps): as a start does.
    context = connection_module._context.__wrapped__(world.ca_file, world.cert, world.key, None)
    assert await client_seen(world.server, context) == ("client-1" if copies else "client-2")
    loads = Loads(context, monkeypatch)
    tls = TlsReload(context, {CA: world.ca_file, CERT: world.cert, KEY: world.key})
    assert tls.check() is True
    assert loads.calls == ["load_verify_locations", "load_cert_chain"]
    assert await client_seen(world.server, context) == "client-2"


def test_a_renewal_another_reload_of_the_context_loaded_is_taken_not_loaded_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two reloads of the one context (two nodes of a process, same files): a renewal is
    loaded once, and each tells the certificate the context holds."""
    world = World(tmp_path)
    context = world.kafka.ssl_context()
    assert context is not None
    loads = Loads(context, monkeypatch)
    one, other = world.reload(), world.reload()
    assert one.check() is False and other.check() is False
    second = world.certs.leaf("client-2", world.ca, days=20)
    world.put(second)
    assert other.check() is True
    assert one.check() is False
    assert loads.calls == ["load_verify_locations", "load_cert_chain"]
    not_after = validity_of_pem(second.cert.read_bytes()).not_after
    assert one.validity is not None and one.validity.not_after == not_after
    assert world.loaded[-2:] == [(world.cert, not_after)] * 2
