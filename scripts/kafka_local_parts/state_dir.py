"""What a state dir holds and how it is read and written, without running anything.

The running broker's files (``kafka.pid``, ``broker.json``, ``broker.log`` and its tail),
the kept ``cluster.json`` (:class:`Remembered`), the formatted cluster id in
``data/meta.properties``, a cluster's ``node-N/`` dirs, the dir's lock, and
``_write_private`` (a file of mode 0600). May import: constants.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .constants import (
    _LOCKFILE,
    _META,
    CLUSTERFILE,
    DATA,
    HOST,
    INFOFILE,
    LOGFILE,
    MAX_NODES,
    NODE_ID,
    PIDFILE,
    SECURITY_PROTOCOLS,
    BrokerError,
)


def _read_pid(state_dir: Path) -> int | None:
    try:
        return int((state_dir / PIDFILE).read_text().strip())
    except (OSError, ValueError):
        return None


def _read_info(state_dir: Path) -> dict[str, object]:
    try:
        info = json.loads((state_dir / INFOFILE).read_text())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def _log_lines(state_dir: Path) -> list[str]:
    try:
        return (state_dir / LOGFILE).read_text(errors="replace").splitlines()
    except OSError:
        return []


def log_tail(state_dir: Path, lines: int = 30) -> str:
    """The first ERROR/FATAL lines of the broker log (with the line after), then its tail."""
    text = _log_lines(state_dir)
    if not text:
        return "(empty broker log)"
    errors: list[str] = []
    for i, line in enumerate(text[:-lines]):
        if " ERROR " in line or " FATAL " in line:
            errors += text[i : i + 2]
            if len(errors) >= 10:
                break
    head = ["...first errors:", *errors, "...last lines:"] if errors else []
    return "\n".join(head + text[-lines:])


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, readable by this user only (mode 0600)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Remembered:
    """What ``cluster.json`` remembers of the broker last started in a state dir."""

    cluster_id: str | None = None
    port: int | None = None
    controller_port: int | None = None
    version: str | None = None
    overrides: dict[str, str] = field(default_factory=dict)
    security: str = "plaintext"
    """``--security``: ``plaintext``, ``ssl`` or ``sasl_ssl``."""
    nodes: int = 1
    """``--brokers``: one node (in the state dir itself) or a cluster (``node-N/`` dirs)."""
    node_ports: tuple[tuple[int, int], ...] = ()
    """A cluster's (client, controller) ports, node 1 first (empty for one node)."""

    def bootstrap(self) -> str | None:
        """The client address(es) remembered: every node's, comma-separated."""
        if self.node_ports:
            return ",".join(f"{HOST}:{port}" for port, _ in self.node_ports)
        return f"{HOST}:{self.port}" if self.port is not None else None


def _port_or_none(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536:
        return value
    return None


def read_remembered(state_dir: Path | str) -> Remembered:
    """The ``cluster.json`` of ``state_dir``; an empty Remembered if missing or unreadable."""
    try:
        raw = json.loads((Path(state_dir) / CLUSTERFILE).read_text())
    except (OSError, ValueError):
        return Remembered()
    if not isinstance(raw, dict):
        return Remembered()
    cluster_id, version, overrides = raw.get("cluster_id"), raw.get("version"), raw.get("overrides")
    security, nodes = raw.get("security"), raw.get("nodes")
    node_ports: list[tuple[int, int]] = []
    for pair in raw.get("node_ports") or []:
        ports = [_port_or_none(p) for p in pair] if isinstance(pair, list) else []
        if len(ports) == 2 and ports[0] is not None and ports[1] is not None:
            node_ports.append((ports[0], ports[1]))
    return Remembered(
        cluster_id=cluster_id if isinstance(cluster_id, str) and cluster_id else None,
        port=_port_or_none(raw.get("port")),
        controller_port=_port_or_none(raw.get("controller_port")),
        version=version if isinstance(version, str) and version else None,
        overrides=(
            {str(k): str(v) for k, v in overrides.items()} if isinstance(overrides, dict) else {}
        ),
        security=security if security in SECURITY_PROTOCOLS else "plaintext",
        nodes=nodes if isinstance(nodes, int) and 1 <= nodes <= MAX_NODES else 1,
        node_ports=tuple(node_ports),
    )


def write_remembered(state_dir: Path | str, remembered: Remembered) -> None:
    """Write ``cluster.json`` (atomically: a crash leaves the old one or the new one)."""
    path = Path(state_dir) / CLUSTERFILE
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(asdict(remembered), indent=2, sort_keys=True) + "\n")
    os.replace(temporary, path)


def formatted_cluster_id(state_dir: Path | str) -> str | None:
    """The cluster id in ``data/meta.properties``; None if that storage was never formatted."""
    try:
        lines = (Path(state_dir) / DATA / _META).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        key, sep, value = line.partition("=")
        if sep and key.strip() == "cluster.id" and value.strip():
            return value.strip()
    return None


def _clear_state_files(state_dir: Path, pid: int | None = None) -> None:
    if pid is not None and _read_pid(state_dir) not in (None, pid):
        return  # someone else's broker by now
    for name in (PIDFILE, INFOFILE):
        with contextlib.suppress(FileNotFoundError):
            (state_dir / name).unlink()


def _lock_state_dir(state_dir: Path) -> int:
    fd = os.open(state_dir / _LOCKFILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise BrokerError(
            f"the Kafka state dir {state_dir} is in use by another live process (pid {holder}); "
            "stop it or use another dir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _write_info(
    node_dir: Path,
    pid: int,
    bootstrap: str,
    version: str,
    controller_port: int,
    security: str,
    node_id: int = NODE_ID,
) -> None:
    info = {
        "pid": pid,
        "bootstrap": bootstrap,
        "version": version,
        "controller_port": controller_port,
        "cluster_id": formatted_cluster_id(node_dir),
        "security": security,
        "node": node_id,
    }
    (node_dir / INFOFILE).write_text(json.dumps(info) + "\n")


def node_dir(state_dir: Path, node: int) -> Path:
    """The dir of node ``node`` (1, 2, ...) of a cluster: its properties, ``data/``, log."""
    return Path(state_dir) / f"node-{node}"


def _node_dirs_on_disk(state_dir: Path) -> list[tuple[int, Path]]:
    found: list[tuple[int, Path]] = []
    for path in Path(state_dir).glob("node-*"):
        suffix = path.name.removeprefix("node-")
        if path.is_dir() and suffix.isdigit():
            found.append((int(suffix), path))
    return sorted(found)


def _remove_node_dirs(state_dir: Path) -> None:
    for _, path in _node_dirs_on_disk(state_dir):
        shutil.rmtree(path, ignore_errors=True)


def _cluster_formatted(state_dir: Path, nodes: int) -> str | None:
    """The cluster id if all ``nodes`` node dirs are formatted for the same one."""
    ids = {formatted_cluster_id(node_dir(state_dir, n)) for n in range(1, nodes + 1)}
    if len(ids) != 1:
        return None
    return ids.pop()


def _remembered_cluster(state: Path, node: int | None = None) -> Remembered:
    remembered = read_remembered(state)
    if remembered.nodes < 2 or len(remembered.node_ports) != remembered.nodes:
        raise BrokerError(f"no cluster in {state}: start one with `start --brokers 3`")
    if _cluster_formatted(state, remembered.nodes) is None:
        raise BrokerError(f"the cluster in {state} was never formatted: use `start`")
    if node is not None and not 1 <= node <= remembered.nodes:
        raise BrokerError(f"no node {node} in {state}: its nodes are 1 to {remembered.nodes}")
    return remembered
