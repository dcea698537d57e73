"""A single local broker: :class:`Broker` (also each node of a cluster), :func:`start`,
:func:`restart` and one start attempt. May import: constants, credentials, jars, jvm,
ports, processes, properties, state_dir, wire; and cluster only inside
:meth:`Broker.restart`, at call time (a cluster's node restarts through it; cluster
imports this module).
"""

from __future__ import annotations

import atexit
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .constants import (
    _META,
    ADMIN_USER,
    DATA,
    DEFAULT_START_TIMEOUT,
    DEFAULT_STOP_TIMEOUT,
    HOST,
    JVM_OPTS,
    LOGFILE,
    NODE_ID,
    SECURITY_PROTOCOLS,
    BrokerError,
    _say,
    default_state_dir,
    kafka_version,
)
from .credentials import (
    Credentials,
    client_auth,
    client_settings,
    ensure_credentials,
    listener_name,
    read_credentials,
)
from .jars import ensure_jars
from .jvm import _cluster_id, _format_storage, _java, _launch
from .oidc import TokenServer, allowed_urls_option, maybe_start, oauth_properties
from .ports import choose_ports, plan_start
from .processes import _alive, _kill, _terminate, stop, stop_token_server
from .properties import _write_properties, server_properties
from .state_dir import (
    Remembered,
    _clear_state_files,
    _cluster_formatted,
    _lock_state_dir,
    _log_lines,
    _remove_node_dirs,
    _write_info,
    formatted_cluster_id,
    log_tail,
    read_remembered,
    write_remembered,
)
from .wire import ClientAuth, wait_until_ready


@dataclass
class Broker:
    """A running local broker started by :func:`start` (or :func:`restart`).

    Also each node of a :class:`Cluster` (then ``state_dir`` is the node's dir,
    ``node_id`` its id and ``home`` the cluster's state dir).
    """

    bootstrap: str
    pid: int
    state_dir: Path
    version: str
    startup_seconds: float = 0.0
    cluster_id: str | None = None
    kept: bool = False
    """Whether this start kept the data of the dir's earlier broker (not formatted anew)."""
    security: str = "plaintext"
    node_id: int = NODE_ID
    home: Path | None = None
    """The state dir holding the certificates and passwords (None: ``state_dir``)."""
    _lock_fd: int | None = field(default=None, repr=False)
    _stop_at_exit: bool = field(default=True, repr=False)
    _stopped: bool = field(default=False, repr=False)

    @property
    def log_file(self) -> Path:
        return self.state_dir / LOGFILE

    def running(self) -> bool:
        return not self._stopped and _alive(self.pid)

    def stop(self, timeout: float = DEFAULT_STOP_TIMEOUT) -> None:
        """SIGTERM the broker's process group, SIGKILL after ``timeout``; idempotent.

        The data stays in the state dir: a later ``start(..., fresh=False)`` or
        :func:`restart` serves it again.
        """
        self._end(lambda: _terminate(self.pid, timeout))

    def kill(self) -> None:
        """SIGKILL the broker's process group (a crash: no clean shutdown); idempotent."""
        self._end(lambda: _kill(self.pid))

    def _end(self, how: Callable[[], None]) -> None:
        atexit.unregister(self.stop)
        if self._stopped:
            return
        try:
            how()
            _clear_state_files(self.state_dir, self.pid)
            if self.home is None:
                stop_token_server(self.state_dir)
            self._stopped = True
        finally:
            if _OWNED.get(self.state_dir) is self:
                del _OWNED[self.state_dir]
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    def restart(self, timeout: float = DEFAULT_START_TIMEOUT) -> Broker:
        """Stop this broker and start it again with its data and address: see :func:`restart`."""
        if self.home is not None:
            from .cluster import restart_node  # at call time: cluster imports this module

            return restart_node(self.home, self.node_id, timeout=timeout)
        return restart(self.state_dir, timeout=timeout, stop_at_exit=self._stop_at_exit)

    def client_settings(self, user: str = ADMIN_USER) -> dict[str, str]:
        """The ``KAFKA_*`` variables for ``user`` (see :func:`client_settings`)."""
        return client_settings(self.home or self.state_dir, self.security, self.bootstrap, user)

    def client_auth(self, user: str = ADMIN_USER) -> ClientAuth | None:
        return client_auth(read_credentials(self.home or self.state_dir, self.security), user)

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_OWNED: dict[Path, Broker] = {}
"""The brokers this process started and has not stopped, by state dir (their locks)."""


def resolve_security(requested: str | None, remembered: Remembered, *, keep: bool) -> str:
    """``--security`` for this start: the one asked for, else the remembered one.

    A broker whose data is kept keeps its security (its users and ACLs are in that data):
    asking for another one is an error that names ``--fresh``.
    """
    if requested is not None and requested not in SECURITY_PROTOCOLS:
        raise BrokerError(f"security must be one of {', '.join(SECURITY_PROTOCOLS)}")
    if requested is None:
        return remembered.security
    if keep and requested != remembered.security:
        raise BrokerError(
            f"this broker's data was made with --security {remembered.security}: "
            f"`start --fresh --security {requested}` for an empty one (or omit --security)"
        )
    return requested


def start(
    state_dir: Path | str | None = None,
    *,
    fresh: bool = True,
    version: str | None = None,
    timeout: float = DEFAULT_START_TIMEOUT,
    port: int | None = None,
    overrides: Mapping[str, str] | None = None,
    security: str | None = None,
    stop_at_exit: bool = True,
) -> Broker:
    """Start a single-node KRaft broker in ``state_dir`` and wait until it answers.

    ``fresh=True`` (the library's default, so that tests and benchmarks always get an
    empty broker): wipe ``data/`` and format it anew with a new cluster id; the port is
    ``port``, else the one remembered in ``cluster.json`` if it is free, else a free one.

    ``fresh=False`` (the CLI's ``start``, and :func:`restart`): a dir formatted before keeps
    its data, cluster id and remembered port (a :class:`BrokerError` naming the port if
    something else holds it; ``port`` moves the broker).  A dir never formatted (or with
    no port remembered) is formatted / gets a free port as above.

    ``security`` (``plaintext``, ``ssl``, ``sasl_ssl``; None: the remembered one, at first
    ``plaintext``): see :func:`security_properties`; the certificates and passwords are
    made once and kept in the state dir (:func:`ensure_credentials`).

    Any broker left running in ``state_dir`` is stopped first.  Raises
    :class:`BrokerError` (with the tail of the broker log) on failure, leaving no process
    behind.
    """
    version = version or kafka_version()
    state = Path(state_dir or default_state_dir()).absolute()
    state.mkdir(parents=True, exist_ok=True)
    lock_fd = _lock_state_dir(state)
    try:
        remembered = read_remembered(state)
        if remembered.nodes > 1 and not fresh:
            raise BrokerError(
                f"{state} holds a {remembered.nodes}-node cluster: start it with "
                "`start` (start_cluster), or `start --fresh --brokers 1` for one empty broker"
            )
        plan = plan_start(remembered, formatted_cluster_id(state), fresh=fresh, port=port)
        chosen = resolve_security(security, remembered, keep=plan.keep)
        stop(state)  # only once the start is sure to be tried: a refused one changes nothing
        credentials = ensure_credentials(state, chosen, keep=plan.keep)
        token_server = maybe_start(state, chosen)
        libs = ensure_jars(version)
        java = _java()
        if plan.keep:
            _say(
                f"keeping the data of cluster {plan.cluster_id} in {state / DATA} (--fresh: empty)"
            )
        else:
            _remove_node_dirs(state)
            _say(f"formatting an empty broker in {state / DATA}")
        cluster_id = plan.cluster_id or _cluster_id()
        began = time.monotonic()
        attempts = 3
        attempt_plan = plan
        for attempt in range(1, attempts + 1):
            ports = choose_ports(attempt_plan, state_dir=state)
            broker = _start_once(
                state,
                libs,
                java,
                version,
                ports[0],
                ports[1],
                timeout,
                overrides,
                lock_fd,
                format_cluster=None if plan.keep else cluster_id,
                retry_on_port_clash=attempt < attempts,
                credentials=credentials,
                token_server=token_server,
            )
            if broker is not None:
                broker.startup_seconds = time.monotonic() - began
                broker.cluster_id = formatted_cluster_id(state) or cluster_id
                broker.kept = plan.keep
                broker._stop_at_exit = stop_at_exit
                write_remembered(
                    state,
                    Remembered(
                        cluster_id=broker.cluster_id,
                        port=ports[0],
                        controller_port=ports[1],
                        version=version,
                        overrides=dict(overrides or {}),
                        security=chosen,
                    ),
                )
                _say(
                    f"Apache Kafka {broker.version} is up at {broker.bootstrap} "
                    f"({listener_name(chosen)}, pid {broker.pid}, "
                    f"{broker.startup_seconds:.1f} s, log {broker.log_file})"
                )
                _OWNED[state] = broker
                if stop_at_exit:
                    atexit.register(broker.stop)
                return broker
            _say(f"port clash on attempt {attempt}; retrying on other ports")
            attempt_plan = plan.after_port_clash()
        raise BrokerError(
            f"could not bind free ports after {attempts} attempts:\n{log_tail(state)}"
        )
    except BaseException:
        stop_token_server(state)
        os.close(lock_fd)
        raise


def restart(
    state_dir: Path | str | None = None,
    *,
    timeout: float = DEFAULT_START_TIMEOUT,
    stop_at_exit: bool = True,
) -> Broker:
    """Stop the broker of ``state_dir`` (if it runs) and start it again; the new Broker.

    Same data, cluster id, port (so the same bootstrap address), Kafka version, security
    and ``--set`` settings as its last start.  A broker that this process started is
    stopped through its :class:`Broker` (which holds the dir's lock); the ``Broker`` of
    the old process is stopped and must not be used any more.  Raises
    :class:`BrokerError` when the dir has no broker to restart (never formatted), when
    its port is taken meanwhile, or when another live process holds the dir (or when it
    holds a cluster: :func:`restart_cluster`).
    """
    state = Path(state_dir or default_state_dir()).absolute()
    if read_remembered(state).nodes > 1:
        raise BrokerError(f"{state} holds a cluster: restart it with restart_cluster")
    check_restartable(state)
    owned = _OWNED.get(state)
    if owned is not None:
        owned.stop()
    remembered = read_remembered(state)
    return start(
        state,
        fresh=False,
        version=remembered.version,
        timeout=timeout,
        overrides=remembered.overrides,
        security=remembered.security,
        stop_at_exit=stop_at_exit,
    )


def check_restartable(state_dir: Path) -> None:
    """Raise :class:`BrokerError` unless ``state_dir`` holds a formatted broker (or cluster)."""
    remembered = read_remembered(state_dir)
    if remembered.nodes > 1 and _cluster_formatted(state_dir, remembered.nodes) is not None:
        return
    if formatted_cluster_id(state_dir) is None:
        raise BrokerError(
            f"no broker to restart in {state_dir}: it was never started there "
            f"(no {DATA}/{_META}); use `start`"
        )


def _start_once(
    state: Path,
    libs: Path,
    java: str,
    version: str,
    port: int,
    controller_port: int,
    timeout: float,
    overrides: Mapping[str, str] | None,
    lock_fd: int,
    format_cluster: str | None,
    retry_on_port_clash: bool,
    credentials: Credentials | None = None,
    token_server: TokenServer | None = None,
) -> Broker | None:
    """One start attempt: the Broker, or None when the ports were taken meanwhile.

    Formats the storage first for ``format_cluster`` (None: keep ``data/`` as it is).
    ``token_server``: a SASL_SSL broker's listener takes OAUTHBEARER too, its tokens.
    """
    props = state / "server.properties"
    jvm_opts = JVM_OPTS
    if token_server is not None:
        overrides = {**oauth_properties(token_server), **(overrides or {})}
        jvm_opts = (*JVM_OPTS, allowed_urls_option(token_server))
    settings = server_properties(
        state, port, controller_port, version, overrides, credentials=credentials
    )
    _write_properties(props, settings)
    if format_cluster is not None:
        _format_storage(java, libs, state, props, version, format_cluster, credentials)
    bootstrap = f"{HOST}:{port}"
    pid = _launch(java, libs, state, version, jvm_opts)
    try:
        wait_until_ready(bootstrap, timeout, pid=pid, auth=client_auth(credentials))
    except BrokerError as exc:
        _terminate(pid, 5.0)
        _clear_state_files(state, pid)
        if any("Address already in use" in line for line in _log_lines(state)):
            if retry_on_port_clash:
                return None
            exc = BrokerError(f"{exc}: port {port} or {controller_port} is already in use")
        raise BrokerError(f"{exc}\n--- {state / LOGFILE} ---\n{log_tail(state)}") from None
    except BaseException:
        _terminate(pid, 5.0)
        _clear_state_files(state, pid)
        raise
    security = credentials.security if credentials is not None else "plaintext"
    _write_info(state, pid, bootstrap, version, controller_port, security)
    return Broker(
        bootstrap=bootstrap,
        pid=pid,
        state_dir=state,
        version=version,
        security=security,
        _lock_fd=lock_fd,
    )
