"""Whether the broker of a state dir runs and answers (:func:`status`), each node of a
cluster (:func:`cluster_status`), and whether the dir holds a cluster. May import:
constants, credentials, processes, state_dir, wire.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .constants import HOST, SECURITY_PROTOCOLS, default_state_dir
from .credentials import client_auth, read_credentials
from .processes import _is_broker, _node_pid
from .state_dir import (
    _read_info,
    _read_pid,
    _remembered_cluster,
    formatted_cluster_id,
    read_remembered,
)
from .wire import probe


@dataclass
class Status:
    running: bool
    answering: bool
    bootstrap: str | None
    pid: int | None
    version: str | None
    cluster_id: str | None = None
    security: str = "plaintext"


def status(state_dir: Path | str | None = None) -> Status:
    state = Path(state_dir or default_state_dir()).absolute()
    pid = _read_pid(state)
    info = _read_info(state)
    bootstrap = info.get("bootstrap")
    version = info.get("version")
    if pid is None or not _is_broker(pid, state):
        return Status(False, False, None, None, None)
    security = info.get("security")
    if not isinstance(security, str) or security not in SECURITY_PROTOCOLS:
        security = read_remembered(state).security
    address = bootstrap if isinstance(bootstrap, str) else None
    auth = client_auth(read_credentials(state, security))
    answering = address is not None and probe(address, auth=auth)
    cluster = info.get("cluster_id")
    return Status(
        True,
        answering,
        address,
        pid,
        version if isinstance(version, str) else None,
        cluster if isinstance(cluster, str) else formatted_cluster_id(state),
        security,
    )


@dataclass
class NodeStatus:
    """One node of a cluster: :func:`cluster_status`."""

    node: int
    running: bool
    answering: bool
    bootstrap: str
    pid: int | None


def cluster_status(state_dir: Path | str | None = None) -> list[NodeStatus]:
    """Every node of the cluster in ``state_dir``, running or not (BrokerError: no cluster)."""
    state = Path(state_dir or default_state_dir()).absolute()
    remembered = _remembered_cluster(state)
    auth = client_auth(read_credentials(state, remembered.security))
    found: list[NodeStatus] = []
    for node, (client, _) in enumerate(remembered.node_ports, start=1):
        address = f"{HOST}:{client}"
        pid = _node_pid(state, node)
        answering = pid is not None and probe(address, auth=auth, expect=[node])
        found.append(NodeStatus(node, pid is not None, answering, address, pid))
    return found


def is_cluster(state_dir: Path | str | None = None) -> bool:
    """Whether ``state_dir`` was last started as a multi-node cluster."""
    state = Path(state_dir or default_state_dir()).absolute()
    return read_remembered(state).nodes > 1
