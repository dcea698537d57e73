"""The web edge's address is checked before the node starts: a port in use or a host no
interface has stops the worker at once (exit 1, naming the variable), before it joined its
group; a free one, and one a closed socket left in TIME_WAIT, pass."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from test_worker_run_ends import _Part, _settings, parts  # noqa: F401  (a fixture)

from app.cli.worker import _run_worker
from app.errors import ConfigError
from app.ops.web_port import check_listenable


@pytest.fixture
def taken() -> Iterator[int]:
    """A port another process listens on."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield int(server.getsockname()[1])


def test_a_port_another_socket_listens_on_is_refused(taken: int) -> None:
    with pytest.raises(ConfigError, match=f"TICKWHEEL_WEB_PORT {taken}: cannot listen on"):
        check_listenable("127.0.0.1", taken)


def test_a_host_no_interface_has_is_refused() -> None:
    with pytest.raises(ConfigError, match="cannot listen"):
        check_listenable("192.0.2.1", 8080)  # TEST-NET-1: never this machine's


def test_a_free_port_passes_and_stays_free() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = int(server.getsockname()[1])
    check_listenable("127.0.0.1", port)
    with socket.create_server(("127.0.0.1", port)):  # the check let it go
        pass


def test_a_port_left_in_time_wait_passes() -> None:
    # A worker restarted at once: its last connections' sockets still hold the port.
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = int(server.getsockname()[1])
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()  # the server's side closes first: its side waits in TIME_WAIT
        client.close()
    check_listenable("127.0.0.1", port)


async def test_the_worker_stops_before_its_node_starts_when_its_port_is_taken(
    parts: tuple[_Part, _Part],  # noqa: F811
    taken: int,
) -> None:
    node, _ = parts
    settings = _settings().model_copy(update={"web_port": taken, "web_host": "127.0.0.1"})
    node.settings = settings  # type: ignore[attr-defined]  # the web edge reads the node's
    with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{taken}"):
        await _run_worker(settings, None)  # type: ignore[arg-type]
    assert "node start" not in node.calls


def test_an_address_this_machine_lacks_is_passed_over_while_another_binds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # localhost as ::1 and 127.0.0.1, IPv6 off: the server listens on 127.0.0.1 alone.
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = int(server.getsockname()[1])
    lacking = (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("2001:db8::1", port, 0, 0))
    free = (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: [lacking, free])
    check_listenable("localhost", port)
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: [lacking])
    with pytest.raises(ConfigError, match="cannot listen on localhost"):
        check_listenable("localhost", port)
