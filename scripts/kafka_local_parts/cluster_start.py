"""Starting a multi-node cluster: :func:`start_cluster` (every node formatted and launched
at once, retried on a port clash) and :func:`restart_cluster`. May import: broker,
cluster, constants, credentials, jars, jvm, ports, processes, properties, state_dir, wire.
"""

from __future__ import annotations

import atexit
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from .broker import Broker, resolve_security
from .cluster import _OWNED_CLUSTERS, Cluster
from .constants import (
    CLUSTER_JVM_OPTS,
    DATA,
    DEFAULT_CLUSTER_START_TIMEOUT,
    HOST,
    LOGFILE,
    MAX_NODES,
    BrokerError,
    _say,
    default_state_dir,
    kafka_version,
)
from .credentials import Credentials, client_auth, ensure_credentials, listener_name
from .jars import ensure_jars
from .jvm import _cluster_id, _format_nodes, _java, _launch
from .ports import choose_cluster_ports
from .processes import _terminate_all, stop
from .properties import _write_properties, cluster_properties
from .state_dir import (
    Remembered,
    _clear_state_files,
    _cluster_formatted,
    _lock_state_dir,
    _log_lines,
    _remembered_cluster,
    _remove_node_dirs,
    _write_info,
    formatted_cluster_id,
    log_tail,
    node_dir,
    read_remembered,
    write_remembered,
)
from .wire import wait_until_ready


def _check_nodes(nodes: int) -> None:
    if not 1 <= nodes <= MAX_NODES:
        raise BrokerError(f"--brokers must be from 1 to {MAX_NODES}, not {nodes}")


def _start_cluster_once(
    state: Path,
    libs: Path,
    java: str,
    version: str,
    ports: tuple[tuple[int, int], ...],
    timeout: float,
    overrides: Mapping[str, str] | None,
    credentials: Credentials | None,
    format_cluster: str | None,
    retry_on_port_clash: bool,
) -> dict[int, Broker] | None:
    """One start attempt of every node: the Brokers, or None on a port clash."""
    settings = cluster_properties(state, ports, version, overrides, credentials=credentials)
    dirs = {node: node_dir(state, node) for node in settings}
    for node, props in settings.items():
        dirs[node].mkdir(parents=True, exist_ok=True)
        _write_properties(dirs[node] / "server.properties", props)
    if format_cluster is not None:
        pairs = [(d, d / "server.properties") for d in dirs.values()]
        _format_nodes(java, libs, pairs, version, format_cluster, credentials)
    pids: dict[int, int] = {}
    security = credentials.security if credentials is not None else "plaintext"
    auth = client_auth(credentials)
    try:
        for node, directory in dirs.items():
            pids[node] = _launch(java, libs, directory, version, CLUSTER_JVM_OPTS)
        deadline = time.monotonic() + timeout
        for node, (client, controller) in enumerate(ports, start=1):
            remaining = max(1.0, deadline - time.monotonic())
            address = f"{HOST}:{client}"
            try:
                wait_until_ready(address, remaining, pid=pids[node], auth=auth, expect=list(dirs))
            except BrokerError as exc:
                raise BrokerError(f"node {node}: {exc}") from None
            _write_info(dirs[node], pids[node], address, version, controller, security, node)
    except BrokerError as exc:
        _terminate_all(list(pids.values()), 5.0)
        for node, pid in pids.items():
            _clear_state_files(dirs[node], pid)
        clash = ("Address already in use" in line for d in dirs.values() for line in _log_lines(d))
        if retry_on_port_clash and any(clash):
            return None
        tails = "\n".join(f"--- {d / LOGFILE} ---\n{log_tail(d, 15)}" for d in dirs.values())
        raise BrokerError(f"{exc}\n{tails}") from None
    except BaseException:
        _terminate_all(list(pids.values()), 5.0)
        for node, pid in pids.items():
            _clear_state_files(dirs[node], pid)
        raise
    return {
        node: Broker(
            bootstrap=f"{HOST}:{ports[node - 1][0]}",
            pid=pids[node],
            state_dir=dirs[node],
            version=version,
            security=security,
            node_id=node,
            home=state,
        )
        for node in dirs
    }


def start_cluster(
    state_dir: Path | str | None = None,
    *,
    nodes: int = 3,
    fresh: bool = True,
    version: str | None = None,
    timeout: float = DEFAULT_CLUSTER_START_TIMEOUT,
    port: int | None = None,
    overrides: Mapping[str, str] | None = None,
    security: str | None = None,
    stop_at_exit: bool = True,
) -> Cluster:
    """Start a ``nodes``-node KRaft cluster in ``state_dir``; wait until every node serves.

    Each node is broker and controller (``controller.quorum.voters`` of all), with a
    256 MiB heap, in ``node-N/``; internal topics and ``default.replication.factor`` are
    replicated 3 times, ``min.insync.replicas=2``.  ``fresh``, ``port`` (node N gets
    ``port + N - 1``), ``overrides`` and ``security`` as for :func:`start`.  Ready means
    every node lists every node in Metadata.  The :class:`Cluster` holds the state dir's
    lock until :meth:`Cluster.stop`.
    """
    _check_nodes(nodes)
    if nodes < 2:
        raise BrokerError("a cluster has two nodes or more: use start() for one")
    version = version or kafka_version()
    state = Path(state_dir or default_state_dir()).absolute()
    state.mkdir(parents=True, exist_ok=True)
    lock_fd = _lock_state_dir(state)
    try:
        remembered = read_remembered(state)
        formatted = _cluster_formatted(state, nodes)
        if (
            not fresh
            and remembered.nodes != nodes
            and (
                formatted_cluster_id(state) is not None
                or _cluster_formatted(state, remembered.nodes) is not None
            )
        ):
            held = "one broker" if remembered.nodes == 1 else f"a {remembered.nodes}-node cluster"
            raise BrokerError(
                f"{state} holds {held}: `start --fresh --brokers {nodes}` for an empty "
                f"{nodes}-node cluster"
            )
        keep = not fresh and formatted is not None and remembered.nodes == nodes
        chosen = resolve_security(security, remembered, keep=keep)
        stop(state)  # only once the start is sure to be tried: a refused one changes nothing
        credentials = ensure_credentials(state, chosen, keep=keep)
        libs = ensure_jars(version)
        java = _java()
        if keep:
            _say(f"keeping the data of cluster {formatted} in {state}/node-* (--fresh: empty)")
        else:
            shutil.rmtree(state / DATA, ignore_errors=True)  # a single broker's, if any
            _remove_node_dirs(state)
            _say(f"formatting an empty {nodes}-node cluster in {state}/node-*")
        cluster_id = (formatted if keep else None) or _cluster_id()
        began = time.monotonic()
        attempts = 3
        for attempt in range(1, attempts + 1):
            ports = choose_cluster_ports(
                nodes,
                remembered,
                keep=keep,
                port=port,
                new_controller_ports=attempt > 1,
                state_dir=state,
            )
            brokers = _start_cluster_once(
                state,
                libs,
                java,
                version,
                ports,
                timeout,
                overrides,
                credentials,
                format_cluster=None if keep else cluster_id,
                retry_on_port_clash=attempt < attempts,
            )
            if brokers is not None:
                cluster = Cluster(
                    state_dir=state,
                    version=version,
                    security=chosen,
                    cluster_id=cluster_id,
                    ports=ports,
                    brokers=brokers,
                    startup_seconds=time.monotonic() - began,
                    kept=keep,
                    _lock_fd=lock_fd,
                    _stop_at_exit=stop_at_exit,
                )
                write_remembered(
                    state,
                    Remembered(
                        cluster_id=cluster_id,
                        port=ports[0][0],
                        controller_port=ports[0][1],
                        version=version,
                        overrides=dict(overrides or {}),
                        security=chosen,
                        nodes=nodes,
                        node_ports=ports,
                    ),
                )
                _say(
                    f"Apache Kafka {version} {nodes}-node cluster is up at {cluster.bootstrap} "
                    f"({listener_name(chosen)}, {cluster.startup_seconds:.1f} s, logs "
                    f"{state}/node-*/{LOGFILE})"
                )
                _OWNED_CLUSTERS[state] = cluster
                if stop_at_exit:
                    atexit.register(cluster.stop)
                return cluster
            _say(f"port clash on attempt {attempt}; retrying on other ports")
            if port is None and not keep:
                remembered = replace(remembered, node_ports=())
        raise BrokerError(f"could not bind free ports after {attempts} attempts")
    except BaseException:
        os.close(lock_fd)
        raise


def restart_cluster(
    state_dir: Path | str | None = None,
    *,
    timeout: float = DEFAULT_CLUSTER_START_TIMEOUT,
    stop_at_exit: bool = True,
) -> Cluster:
    """Stop every node of the cluster in ``state_dir`` and start them all again.

    Same data, addresses, version, security and settings as its last start.
    """
    state = Path(state_dir or default_state_dir()).absolute()
    remembered = _remembered_cluster(state)
    owned = _OWNED_CLUSTERS.get(state)
    if owned is not None:
        owned.stop()
    return start_cluster(
        state,
        nodes=remembered.nodes,
        fresh=False,
        version=remembered.version,
        timeout=timeout,
        overrides=remembered.overrides,
        security=remembered.security,
        stop_at_exit=stop_at_exit,
    )
