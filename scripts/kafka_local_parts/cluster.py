"""A running multi-node cluster (:class:`Cluster`, the ones this process owns) and the
start of one node of it again (:func:`start_node`, :func:`restart_node`). May import:
broker, constants, credentials, jars, jvm, ports, processes, properties, state_dir, wire.
"""

from __future__ import annotations

import atexit
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from .broker import Broker
from .constants import (
    ADMIN_USER,
    CLUSTER_JVM_OPTS,
    DEFAULT_START_TIMEOUT,
    DEFAULT_STOP_TIMEOUT,
    HOST,
    LOGFILE,
    BrokerError,
    _say,
    default_state_dir,
    kafka_version,
)
from .credentials import client_auth, client_settings, read_credentials
from .jars import ensure_jars
from .jvm import _java, _launch
from .ports import _port_taken, port_free
from .processes import _node_pid, _terminate, kill_node, stop, stop_node
from .properties import _write_properties, cluster_properties
from .state_dir import (
    _clear_state_files,
    _lock_state_dir,
    _remembered_cluster,
    _write_info,
    formatted_cluster_id,
    log_tail,
    node_dir,
)
from .wire import ClientAuth, wait_until_ready


@dataclass
class Cluster:
    """A running local multi-node KRaft cluster started by :func:`start_cluster`.

    Every node is a broker and a controller; node ``n`` lives in ``node-n/`` of the state
    dir with its own data, log and JVM.  :meth:`kill_node`, :meth:`stop_node` and
    :meth:`start_node` act on one node, for failover tests.
    """

    state_dir: Path
    version: str
    security: str
    cluster_id: str
    ports: tuple[tuple[int, int], ...]
    brokers: dict[int, Broker] = field(default_factory=dict)
    """The node Brokers last started by this object, by node id."""
    startup_seconds: float = 0.0
    kept: bool = False
    _lock_fd: int | None = field(default=None, repr=False)
    _stop_at_exit: bool = field(default=True, repr=False)
    _stopped: bool = field(default=False, repr=False)

    @property
    def nodes(self) -> list[int]:
        return list(range(1, len(self.ports) + 1))

    @property
    def bootstrap(self) -> str:
        """Every node's address, comma-separated (clients take any that answers)."""
        return ",".join(self.node_bootstrap(node) for node in self.nodes)

    def node_bootstrap(self, node: int) -> str:
        return f"{HOST}:{self.ports[self._index(node)][0]}"

    def _index(self, node: int) -> int:
        if node not in self.nodes:
            raise BrokerError(f"no node {node}: the nodes are {self.nodes}")
        return node - 1

    def running_nodes(self) -> list[int]:
        """The nodes whose JVM is alive now."""
        return [node for node in self.nodes if _node_pid(self.state_dir, node) is not None]

    def stop(self, timeout: float = DEFAULT_STOP_TIMEOUT) -> None:
        """Stop every node (SIGTERM, SIGKILL after ``timeout``); idempotent; data stays."""
        atexit.unregister(self.stop)
        if self._stopped:
            return
        try:
            stop(self.state_dir, timeout)
            self._stopped = True
            for broker in self.brokers.values():
                broker._stopped = True
        finally:
            if _OWNED_CLUSTERS.get(self.state_dir) is self:
                del _OWNED_CLUSTERS[self.state_dir]
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    def stop_node(self, node: int, timeout: float = DEFAULT_STOP_TIMEOUT) -> bool:
        """Stop one node cleanly (controlled shutdown); whether it was running."""
        self._index(node)
        return stop_node(self.state_dir, node, timeout)

    def kill_node(self, node: int) -> bool:
        """SIGKILL one node (a crash); whether it was running."""
        self._index(node)
        return kill_node(self.state_dir, node)

    def start_node(self, node: int, timeout: float = DEFAULT_START_TIMEOUT) -> Broker:
        """Start one stopped node again (its data, ports) and wait until it serves."""
        self._index(node)
        broker = _start_node_locked(self.state_dir, node, timeout)
        self.brokers[node] = broker
        return broker

    def restart_node(self, node: int, timeout: float = DEFAULT_START_TIMEOUT) -> Broker:
        self.stop_node(node)
        return self.start_node(node, timeout)

    def client_settings(self, user: str = ADMIN_USER) -> dict[str, str]:
        return client_settings(self.state_dir, self.security, self.bootstrap, user)

    def client_auth(self, user: str = ADMIN_USER) -> ClientAuth | None:
        return client_auth(read_credentials(self.state_dir, self.security), user)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_OWNED_CLUSTERS: dict[Path, Cluster] = {}
"""The clusters this process started and has not stopped, by state dir (their locks)."""


def _start_node_locked(state: Path, node: int, timeout: float) -> Broker:
    """Start node ``node`` of the cluster in ``state`` (the caller holds the dir's lock)."""
    remembered = _remembered_cluster(state, node)
    directory = node_dir(state, node)
    client, controller = remembered.node_ports[node - 1]
    version = remembered.version or kafka_version()
    credentials = read_credentials(state, remembered.security)
    auth = client_auth(credentials)
    address = f"{HOST}:{client}"
    pid = _node_pid(state, node)
    if pid is not None:
        wait_until_ready(address, timeout, pid=pid, auth=auth, expect=[node])
        return Broker(
            address,
            pid,
            directory,
            version,
            kept=True,
            security=remembered.security,
            node_id=node,
            home=state,
        )
    for wanted in (client, controller):
        if not port_free(wanted):
            raise BrokerError(f"node {node}: {_port_taken(wanted, 'remembered', state)}")
    settings = cluster_properties(
        state, remembered.node_ports, version, remembered.overrides, credentials=credentials
    )[node]
    _write_properties(directory / "server.properties", settings)
    began = time.monotonic()
    pid = _launch(_java(), ensure_jars(version), directory, version, CLUSTER_JVM_OPTS)
    try:
        wait_until_ready(address, timeout, pid=pid, auth=auth, expect=[node])
    except BaseException as exc:
        _terminate(pid, 5.0)
        _clear_state_files(directory, pid)
        if isinstance(exc, BrokerError):
            raise BrokerError(
                f"node {node}: {exc}\n--- {directory / LOGFILE} ---\n{log_tail(directory)}"
            ) from None
        raise
    _write_info(directory, pid, address, version, controller, remembered.security, node)
    seconds = time.monotonic() - began
    _say(f"node {node} is up at {address} (pid {pid}, {seconds:.1f} s)")
    return Broker(
        address,
        pid,
        directory,
        version,
        startup_seconds=seconds,
        cluster_id=formatted_cluster_id(directory),
        kept=True,
        security=remembered.security,
        node_id=node,
        home=state,
    )


def start_node(
    state_dir: Path | str | None, node: int, *, timeout: float = DEFAULT_START_TIMEOUT
) -> Broker:
    """Start node ``node`` of the cluster in ``state_dir`` again (its data and ports).

    Waits until it serves (lists itself in Metadata: registered and caught up); a node
    already running is left alone.  Takes the state dir's lock for the while, unless a
    :class:`Cluster` of this process holds it.
    """
    state = Path(state_dir or default_state_dir()).absolute()
    owned = _OWNED_CLUSTERS.get(state)
    if owned is not None:
        return owned.start_node(node, timeout)
    _remembered_cluster(state, node)
    lock_fd = _lock_state_dir(state)
    try:
        return _start_node_locked(state, node, timeout)
    finally:
        os.close(lock_fd)


def restart_node(
    state_dir: Path | str | None, node: int, *, timeout: float = DEFAULT_START_TIMEOUT
) -> Broker:
    """Stop node ``node`` (if it runs) and start it again."""
    stop_node(state_dir, node)
    return start_node(state_dir, node, timeout=timeout)
