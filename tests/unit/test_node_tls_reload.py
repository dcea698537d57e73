"""A node with TLS files reads them again while it runs (`Node.tls`, a watch of its run):
its first check takes what its clients' context was built from (loaded again only if a
file changed since) and sets `tickwheel_kafka_client_cert_expiry_timestamp_seconds`;
the watch ending (a check that raised) stops the node loudly, naming it, as every watch of
a run does. On the memory log: the files are read, no broker is connected to."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
from fakes import wait_until
from tls_certs import Certs

from app.clients.timer_book import timer_book
from app.errors import NodeFailed
from app.kafka.memory import MemoryLog
from app.kafka.tls_expiry import validity_of_pem
from app.node.node import Node
from app.node.settings import Settings
from app.service import Service

GAUGE = "tickwheel_kafka_client_cert_expiry_timestamp_seconds"


def tls_node(tmp_path: Path) -> tuple[Node, Path]:
    certs = Certs(tmp_path / "tls")
    ca = certs.ca("ca")
    client = certs.leaf("client", ca)
    settings = Settings(
        bootstrap_servers="memory",
        partitions=2,
        data_dir=tmp_path / "a",
        group_id="g",
        session_timeout_ms=1_000,
        commit_interval_ms=20,
        security_protocol="SSL",
        ssl_cafile=ca.cert,
        ssl_certfile=client.cert,
        ssl_keyfile=client.key,
    )
    service = Service(aggregates=(timer_book("shop", "reminders"),))
    return Node(settings, service, clients=MemoryLog()), client.cert


async def test_a_running_node_loads_its_tls_files_and_exports_the_certificates_end(
    tmp_path: Path,
) -> None:
    node, cert = tls_node(tmp_path)
    assert node.tls is not None
    not_after = validity_of_pem(cert.read_bytes()).not_after
    await node.start()
    run = asyncio.create_task(node.run())
    try:
        await wait_until(
            lambda: node.metrics.registry.get_sample_value(GAUGE, {"file": str(cert)}) is not None
        )
        assert node.metrics.registry.get_sample_value(GAUGE, {"file": str(cert)}) == not_after
        assert not run.done()
    finally:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        await node.stop()


async def test_the_tls_reload_ending_stops_the_node_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A watch that died quietly would leave the node on its old certificate until the
    brokers refuse it, with nothing said."""
    node, _ = tls_node(tmp_path)
    assert node.tls is not None

    async def broken() -> None:
        raise RuntimeError("a bug in the check")  # its check's failures it says itself

    monkeypatch.setattr(node.tls, "run", broken)
    await node.start()
    try:
        with pytest.raises(NodeFailed, match=r"the TLS reload failed: .*a bug in the check"):
            await asyncio.wait_for(node.run(), 10)
    finally:
        with contextlib.suppress(NodeFailed):
            await node.stop()
