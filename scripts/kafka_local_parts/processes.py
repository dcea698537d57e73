"""Processes: whether a pid lives (and is the broker of a dir), spawning one detached,
SIGTERM then SIGKILL of a process group (one, or a cluster's all at once with
:data:`STRAGGLER_GRACE`), and the stopping and killing of the broker(s) of a state dir
(:func:`stop`, :func:`kill`) or of one node of a cluster (:func:`stop_node`,
:func:`kill_node`). May import: constants, state_dir.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path

from .constants import DEFAULT_STOP_TIMEOUT, OIDC, BrokerError, _say, default_state_dir
from .state_dir import (
    _clear_state_files,
    _node_dirs_on_disk,
    _read_pid,
    _remembered_cluster,
    node_dir,
)


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as dead; reaps our own children)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            return False
    except OSError:
        pass
    else:
        return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_broker(pid: int, state_dir: Path) -> bool:
    """Whether ``pid`` is the Kafka JVM of ``state_dir`` (guards against pid reuse)."""
    if not _alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc: trust the pidfile
    args = cmdline.split(b"\0")
    return b"kafka.Kafka" in args and str(state_dir / "server.properties").encode() in args


def _is_token_server(pid: int, state_dir: Path) -> bool:
    """Whether ``pid`` is the token server of ``state_dir`` (``oidc_server.py``)."""
    if not _alive(pid):
        return False
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # no /proc: trust the pidfile
    return any(a.endswith(b"oidc_server.py") for a in args) and str(state_dir).encode() in args


def stop_token_server(state_dir: Path) -> bool:
    """Stop the token server of ``state_dir`` (a SASL_SSL broker's); whether one ran."""
    directory = Path(state_dir) / OIDC
    try:
        pid: int | None = int((directory / "server.pid").read_text().strip())
    except (OSError, ValueError):
        pid = None
    running = pid is not None and _is_token_server(pid, Path(state_dir))
    if running and pid is not None:
        _terminate(pid, 5.0)
    for name in ("server.pid", "server.json"):
        (directory / name).unlink(missing_ok=True)
    return running


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass
    # Anything else left in the group (the JVM starts no children; this is a safety net).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _terminate(pid: int, timeout: float) -> None:
    if not _alive(pid):
        return
    _signal_group(pid, signal.SIGTERM)
    if _wait_gone(pid, timeout):
        _signal_group(pid, signal.SIGKILL)  # stragglers in the group, if any
        return
    _say(f"broker pid {pid} did not exit within {timeout:.0f} s of SIGTERM; sending SIGKILL")
    _signal_group(pid, signal.SIGKILL)
    if not _wait_gone(pid, 10.0):
        raise BrokerError(f"broker pid {pid} survived SIGKILL")


def _spawn(argv: Sequence[str], log_file: Path) -> int:
    """Start ``argv`` detached in a new session (own process group), output to ``log_file``."""
    log_fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        return os.posix_spawn(
            argv[0],
            list(argv),
            dict(os.environ),
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, log_fd, 1),
                (os.POSIX_SPAWN_DUP2, log_fd, 2),
            ],
            setsid=True,
        )
    finally:
        os.close(log_fd)


def _kill(pid: int) -> None:
    if not _alive(pid):
        return
    _signal_group(pid, signal.SIGKILL)
    if not _wait_gone(pid, 10.0):
        raise BrokerError(f"broker pid {pid} survived SIGKILL")


def _node_pid(state_dir: Path, node: int) -> int | None:
    directory = node_dir(state_dir, node)
    pid = _read_pid(directory)
    return pid if pid is not None and _is_broker(pid, directory) else None


def stop_node(
    state_dir: Path | str | None, node: int, timeout: float = DEFAULT_STOP_TIMEOUT
) -> bool:
    """Stop node ``node`` of a cluster (SIGTERM, then SIGKILL); whether it was running."""
    state = Path(state_dir or default_state_dir()).absolute()
    _remembered_cluster(state, node)
    directory = node_dir(state, node)
    pid = _node_pid(state, node)
    if pid is not None:
        _terminate(pid, timeout)
    _clear_state_files(directory)
    return pid is not None


def kill_node(state_dir: Path | str | None, node: int) -> bool:
    """SIGKILL node ``node`` of a cluster (a crash); whether it was running."""
    state = Path(state_dir or default_state_dir()).absolute()
    _remembered_cluster(state, node)
    directory = node_dir(state, node)
    pid = _node_pid(state, node)
    if pid is not None:
        _kill(pid)
    _clear_state_files(directory)
    return pid is not None


STRAGGLER_GRACE = 8.0
"""Once one node of a cluster has exited on SIGTERM, how long the others get before SIGKILL.

With the quorum going away, a node still in its controlled shutdown may wait for an active
controller that will never come; a clean one takes a few seconds (the last controller gives
up resigning its leadership after 5 s).
"""


def _terminate_all(pids: Sequence[int], timeout: float) -> None:
    """SIGTERM every pid at once (a cluster's nodes shut down together), then SIGKILL.

    SIGKILL after ``timeout``, or :data:`STRAGGLER_GRACE` after the first one exited.
    """
    alive = [pid for pid in pids if _alive(pid)]
    for pid in alive:
        _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    pending = list(alive)
    while pending and time.monotonic() < deadline:
        time.sleep(0.05)
        still = [pid for pid in pending if _alive(pid)]
        if len(still) < len(pending) and len(alive) > 1:
            deadline = min(deadline, time.monotonic() + STRAGGLER_GRACE)
        pending = still
    for pid in pending:
        _say(f"broker pid {pid} did not exit in time after SIGTERM; sending SIGKILL")
    for pid in alive:
        _signal_group(pid, signal.SIGKILL)  # stragglers in the group, if any
    for pid in alive:
        if not _wait_gone(pid, 10.0):
            raise BrokerError(f"broker pid {pid} survived SIGKILL")


def stop(state_dir: Path | str | None = None, timeout: float = DEFAULT_STOP_TIMEOUT) -> bool:
    """Stop the broker recorded in ``state_dir`` (every node of a cluster); whether one ran.

    Its data stays: the next ``start`` (without ``--fresh``) serves it again.
    """
    state = Path(state_dir or default_state_dir()).absolute()
    dirs = [state] + [path for _, path in _node_dirs_on_disk(state)]
    pids: list[int] = []
    for directory in dirs:
        pid = _read_pid(directory)
        if pid is not None and _is_broker(pid, directory):
            pids.append(pid)
    if pids:
        _terminate_all(pids, timeout)
    for directory in dirs:
        _clear_state_files(directory)
    stop_token_server(state)
    return bool(pids)


def kill(state_dir: Path | str | None = None) -> bool:
    """SIGKILL the broker of ``state_dir`` (every node of a cluster); whether one ran."""
    state = Path(state_dir or default_state_dir()).absolute()
    dirs = [state] + [path for _, path in _node_dirs_on_disk(state)]
    killed = False
    for directory in dirs:
        pid = _read_pid(directory)
        if pid is not None and _is_broker(pid, directory):
            _kill(pid)
            killed = True
        _clear_state_files(directory)
    stop_token_server(state)
    return killed
