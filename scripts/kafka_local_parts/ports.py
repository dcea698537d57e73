"""The ports of a start: free ones, whether one is free, the plan of a single broker's
start (:class:`StartPlan`: keep the data or format, which port is required) and the
(client, controller) ports of one broker (:func:`choose_ports`) or of every node of a
cluster (:func:`choose_cluster_ports`), with a clear error naming a required port that
is taken. May import: constants, state_dir, wire.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from .constants import CLUSTERFILE, HOST, BrokerError, _say
from .state_dir import Remembered
from .wire import probe


def _free_ports(count: int) -> list[int]:
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((HOST, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_port() -> int:
    return _free_ports(1)[0]


@dataclass(frozen=True)
class StartPlan:
    """What one ``start`` does with its state dir; made by :func:`plan_start`."""

    keep: bool
    """Reuse ``data/`` as it is; otherwise wipe it and format anew (a new cluster id)."""
    cluster_id: str | None
    """The kept cluster's id (None when a new one is formatted)."""
    port: int | None
    """The PLAINTEXT port to use (None: a free one)."""
    port_required: bool
    """``port`` or a clear error: never another port (clients know this address)."""
    port_origin: str
    """Where ``port`` came from: ``"--port"``, ``"remembered"`` or ``""`` (none)."""
    controller_port: int | None
    """The controller port to prefer (a free one if it is taken: clients never see it)."""

    def after_port_clash(self) -> StartPlan:
        """The plan for a retry after a port clash: free ports, except a required one."""
        return replace(
            self,
            port=self.port if self.port_required else None,
            port_origin=self.port_origin if self.port_required else "",
            controller_port=None,
        )


def plan_start(
    remembered: Remembered, formatted: str | None, *, fresh: bool, port: int | None = None
) -> StartPlan:
    """Decide between keeping the dir's broker and formatting an empty one, and the ports.

    ``formatted`` is the cluster id of ``data/`` (:func:`formatted_cluster_id`).  A dir that
    was formatted before is kept unless ``fresh``; a kept broker's remembered port is
    required (its clients know it).  ``port`` (``--port``) is always required; a fresh
    broker prefers the remembered port but takes a free one if it is taken.
    """
    keep = not fresh and formatted is not None
    if port is not None:
        chosen, required, origin = port, True, "--port"
    elif remembered.port is not None:
        chosen, required, origin = remembered.port, keep, "remembered"
    else:
        chosen, required, origin = None, False, ""
    return StartPlan(
        keep=keep,
        cluster_id=formatted if keep else None,
        port=chosen,
        port_required=required,
        port_origin=origin,
        controller_port=remembered.controller_port,
    )


def port_free(port: int) -> bool:
    """Whether a listener could bind ``127.0.0.1:port`` now.

    With SO_REUSEADDR, as the JVM binds: the TIME_WAIT connections that a stopped broker
    leaves on its port do not count as taken.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def _port_taken(port: int, origin: str, state_dir: Path | None) -> str:
    who = "another process"
    if probe(f"{HOST}:{port}", timeout=1.0):
        who = "another Kafka broker (one started in another state dir?)"
    if origin == "remembered":
        where = f" (remembered in {state_dir / CLUSTERFILE})" if state_dir else ""
        return (
            f"port {port} of this broker{where} is in use by {who}: free it, or move the "
            "broker to another port with `start --port N` (its data is kept; clients must use "
            "the new address), or `start --fresh` for an empty broker"
        )
    return f"port {port} ({origin or 'asked for'}) is in use by {who}"


def choose_ports(
    plan: StartPlan,
    *,
    state_dir: Path | None = None,
    is_free: Callable[[int], bool] = port_free,
    free_ports: Callable[[int], list[int]] | None = None,
) -> tuple[int, int]:
    """The (PLAINTEXT, controller) ports for one start attempt of ``plan``.

    Raises :class:`BrokerError` naming the port when the plan's required port is taken.
    """
    port = plan.port
    if port is not None and not is_free(port):
        if plan.port_required:
            raise BrokerError(_port_taken(port, plan.port_origin, state_dir))
        _say(f"port {port} is taken; the broker gets a free one")
        port = None
    controller = plan.controller_port
    if controller is not None and (controller == port or not is_free(controller)):
        controller = None
    if port is None or controller is None:
        spare = [p for p in (free_ports or _free_ports)(3) if p not in (port, controller)]
        port = spare.pop(0) if port is None else port
        controller = spare.pop(0) if controller is None else controller
    return port, controller


def choose_cluster_ports(
    nodes: int,
    remembered: Remembered,
    *,
    keep: bool,
    port: int | None = None,
    new_controller_ports: bool = False,
    state_dir: Path | None = None,
    is_free: Callable[[int], bool] = port_free,
    free_ports: Callable[[int], list[int]] | None = None,
) -> tuple[tuple[int, int], ...]:
    """Every node's (client, controller) ports for one start attempt of a cluster.

    Client ports: ``port``, ``port + 1``, ... (required) if given, else the remembered ones
    (required when the data is ``keep``-t: clients know them; else preferred), else free
    ones.  Controller ports: the remembered ones if free (unless
    ``new_controller_ports``), else free ones.  All distinct.  Raises
    :class:`BrokerError` naming the node and port when a required one is taken.
    """
    known = list(remembered.node_ports) if len(remembered.node_ports) == nodes else []
    wanted: list[int | None]
    if port is not None:
        wanted, required, origin = [port + i for i in range(nodes)], True, "--port"
    elif known:
        wanted, required, origin = [p for p, _ in known], keep, "remembered"
    else:
        wanted, required, origin = [None] * nodes, False, ""
    controllers: list[int | None] = (
        [c for _, c in known] if known and not new_controller_ports else [None] * nodes
    )
    taken: set[int] = set()

    def claim(candidates: list[int | None], must: bool) -> list[int | None]:
        chosen: list[int | None] = []
        for node, candidate in enumerate(candidates, start=1):
            if candidate is not None and (candidate in taken or not is_free(candidate)):
                if must:
                    raise BrokerError(f"node {node}: {_port_taken(candidate, origin, state_dir)}")
                candidate = None
            if candidate is not None:
                taken.add(candidate)
            chosen.append(candidate)
        return chosen

    clients = claim(wanted, required)
    controller_ports = claim(controllers, False)
    missing = clients.count(None) + controller_ports.count(None)
    if missing:
        spare = [p for p in (free_ports or _free_ports)(missing + len(taken)) if p not in taken]
        if len(spare) < missing:
            raise BrokerError("could not find enough free ports")
        clients = [p if p is not None else spare.pop(0) for p in clients]
        controller_ports = [p if p is not None else spare.pop(0) for p in controller_ports]
    return tuple((int(p or 0), int(c or 0)) for p, c in zip(clients, controller_ports, strict=True))
