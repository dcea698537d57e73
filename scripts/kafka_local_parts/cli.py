"""The ``kafka-local`` commands (``start``, ``restart``, ``stop``, ``kill``, ``status``,
``env``, ``grant``, ``fetch``) and :func:`main`, their exit codes and output. May import
every sibling module; none imports this one.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from .acls import CLUSTER_RESOURCE, grant
from .admin_tools import tool_env_lines
from .broker import restart, start
from .cli_parser import build_parser
from .cluster import restart_node, start_node
from .cluster_start import _check_nodes, restart_cluster, start_cluster
from .constants import (
    ADMIN_USER,
    APP_USER,
    DEFAULT_CLUSTER_START_TIMEOUT,
    DEFAULT_START_TIMEOUT,
    BrokerError,
    _say,
    default_state_dir,
    kafka_version,
)
from .credentials import client_settings, env_lines, listener_name
from .jars import ensure_jars
from .oidc import oauth_client_settings
from .processes import kill, kill_node, stop, stop_node
from .state_dir import _cluster_formatted, node_dir, read_remembered
from .status import cluster_status, is_cluster, status


def env_line(bootstrap: str) -> str:
    """The shell line that points ``tickwheel`` (and any Kafka client) at ``bootstrap``."""
    return f"export KAFKA_BOOTSTRAP_SERVERS={shlex.quote(bootstrap)}"


def _hint(bootstrap: str, state: Path | None = None, security: str = "plaintext") -> None:
    if security == "plaintext" or state is None:
        _say(f"to use it in a shell: {env_line(bootstrap)}")
        return
    command = f"scripts/kafka-local env --dir {shlex.quote(str(state))}"
    _say(
        f'to use it in a shell: eval "$({command})"  ({listener_name(security)} as '
        f"{ADMIN_USER}; add --user {APP_USER} for the user without ACLs)"
    )


def _parse_settings(pairs: Sequence[str]) -> dict[str, str]:
    settings: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"kafka-local: --set expects key=value, got {pair!r}")
        settings[key.strip()] = value.strip()
    return settings


def _is_single(state: Path, node: int | None) -> bool:
    """Whether a ``--node`` command addresses a single broker (only node 1 exists)."""
    if node is None or is_cluster(state):
        return node is None
    if node != 1:
        raise BrokerError(f"{state} holds a single broker: its only node is 1")
    return True


def _print_ready(state: Path) -> None:
    remembered = read_remembered(state)
    bootstrap = remembered.bootstrap() or ""
    _hint(bootstrap, state, remembered.security)
    print(bootstrap, flush=True)


def _start_command(args: argparse.Namespace, state: Path) -> int:
    if args.node is not None:
        extras = [args.fresh, args.port, args.brokers, args.security, args.set, args.kafka_version]
        if any(value not in (None, False, []) for value in extras):
            raise BrokerError("start --node N takes only --dir and --timeout")
        if _is_single(state, args.node):
            args.node = None
            return _start_command(args, state)
        start_node(state, args.node, timeout=args.timeout or DEFAULT_START_TIMEOUT)
        _print_ready(state)
        return 0
    remembered = read_remembered(state)
    nodes = args.brokers if args.brokers is not None else remembered.nodes
    _check_nodes(nodes)
    overrides = _parse_settings(args.set)
    if nodes == 1:
        current = status(state) if remembered.nodes == 1 else None
        running = current is not None and current.running and current.answering
        if running and current is not None and current.bootstrap and not args.fresh:
            if args.security is not None and args.security != current.security:
                raise BrokerError(
                    f"the broker in {state} runs with --security {current.security}: "
                    f"`start --fresh --security {args.security}` for an empty one"
                )
            _say(f"already running (pid {current.pid}) in {state}")
            if args.port is not None and not current.bootstrap.endswith(f":{args.port}"):
                _say(f"warning: --port {args.port} ignored: stop it first to move it")
            _hint(current.bootstrap, state, current.security)
            print(current.bootstrap)
            return 0
        broker = start(
            state,
            fresh=args.fresh,
            version=args.kafka_version,
            timeout=args.timeout or DEFAULT_START_TIMEOUT,
            port=args.port,
            overrides=overrides,
            security=args.security,
            stop_at_exit=False,
        )
        _hint(broker.bootstrap, state, broker.security)
        print(broker.bootstrap, flush=True)
        return 0
    timeout = args.timeout or DEFAULT_CLUSTER_START_TIMEOUT
    formatted = remembered.nodes == nodes and _cluster_formatted(state, nodes) is not None
    if not args.fresh and formatted:
        nodes_now = cluster_status(state)
        if any(s.running for s in nodes_now):
            if args.security is not None and args.security != remembered.security:
                raise BrokerError(
                    f"the cluster in {state} runs with --security {remembered.security}: "
                    f"`start --fresh --security {args.security}` for an empty one"
                )
            if args.port is not None:
                _say(f"warning: --port {args.port} ignored: stop the cluster first to move it")
            stopped = [s.node for s in nodes_now if not s.running]
            if not stopped:
                _say(f"already running in {state}")
            for number in stopped:
                _say(f"starting node {number} (the others run)")
                start_node(state, number, timeout=timeout)
            _print_ready(state)
            return 0
    cluster = start_cluster(
        state,
        nodes=nodes,
        fresh=args.fresh,
        version=args.kafka_version,
        timeout=timeout,
        port=args.port,
        overrides=overrides,
        security=args.security,
        stop_at_exit=False,
    )
    _hint(cluster.bootstrap, state, cluster.security)
    print(cluster.bootstrap, flush=True)
    return 0


def _restart_command(args: argparse.Namespace, state: Path) -> int:
    if not _is_single(state, args.node):
        restart_node(state, args.node, timeout=args.timeout or DEFAULT_START_TIMEOUT)
        _print_ready(state)
        return 0
    if is_cluster(state):
        timeout = args.timeout or DEFAULT_CLUSTER_START_TIMEOUT
        cluster = restart_cluster(state, timeout=timeout, stop_at_exit=False)
        _hint(cluster.bootstrap, state, cluster.security)
        print(cluster.bootstrap, flush=True)
        return 0
    broker = restart(state, timeout=args.timeout or DEFAULT_START_TIMEOUT, stop_at_exit=False)
    _hint(broker.bootstrap, state, broker.security)
    print(broker.bootstrap, flush=True)
    return 0


def _stop_command(args: argparse.Namespace, state: Path, hard: bool) -> int:
    word = "killed" if hard else "stopped"
    if _is_single(state, args.node):
        was_running = kill(state) if hard else stop(state, args.timeout)
        print(word if was_running else f"{word} (was not running)")
        return 0
    node: int = args.node
    was_running = kill_node(state, node) if hard else stop_node(state, node, args.timeout)
    print(f"node {args.node} {word}" + ("" if was_running else " (was not running)"))
    return 0


def _not_running(state: Path) -> int:
    print(
        f"kafka-local: no broker is running in {state} "
        f"(start one: scripts/kafka-local start --dir {shlex.quote(str(state))})",
        file=sys.stderr,
    )
    return 3


def _env_command(args: argparse.Namespace, state: Path) -> int:
    if is_cluster(state):
        remembered = read_remembered(state)
        nodes = cluster_status(state)
        if not any(s.running for s in nodes):
            return _not_running(state)
        bootstrap = remembered.bootstrap() or ""
        settings = client_settings(state, remembered.security, bootstrap, args.user)
        print("\n".join(env_lines(settings) + _tool_lines(state, remembered.security)))
        down = [s.node for s in nodes if not s.answering]
        if len(down) == len(nodes):
            _say("warning: no node of the cluster answers (yet?)")
            return 1
        if down:
            _say(f"warning: node(s) {', '.join(map(str, down))} do not answer")
        return 0
    current = status(state)
    if not current.running or not current.bootstrap:
        return _not_running(state)
    if getattr(args, "oauth", False):
        if current.security != "sasl_ssl":
            raise BrokerError("--oauth is for a broker started with --security sasl_ssl")
        settings = oauth_client_settings(state, current.bootstrap, args.user)
    else:
        settings = client_settings(state, current.security, current.bootstrap, args.user)
    print("\n".join(env_lines(settings) + _tool_lines(state, current.security)))
    if not current.answering:
        _say(f"warning: the broker at {current.bootstrap} does not answer (yet?)")
        return 1
    return 0


def _tool_lines(state: Path, security: str) -> list[str]:
    """A secured broker's: Kafka's ``kafka-acls.sh`` on PATH, the super user's config."""
    if security == "plaintext":
        return []
    version = read_remembered(state).version or kafka_version()
    return tool_env_lines(state, security, version)


def _status_command(state: Path) -> int:
    if is_cluster(state):
        remembered = read_remembered(state)
        nodes = cluster_status(state)
        if not any(s.running for s in nodes):
            print("stopped")
            return 3
        healthy = all(s.answering for s in nodes)
        word = (
            "running"
            if healthy
            else "degraded"
            if any(s.answering for s in nodes)
            else ("unresponsive")
        )
        print(
            f"{word} {remembered.bootstrap()} nodes={len(nodes)} kafka={remembered.version} "
            f"cluster={remembered.cluster_id} security={remembered.security} dir={state}"
        )
        for s in nodes:
            state_word = "running" if s.answering else "unresponsive" if s.running else "stopped"
            pid = f" pid={s.pid}" if s.pid is not None else ""
            print(f"node {s.node} {state_word} {s.bootstrap}{pid} dir={node_dir(state, s.node)}")
        return 0 if healthy else 1
    current = status(state)
    if not current.running:
        print("stopped")
        return 3
    word = "running" if current.answering else "unresponsive"
    security = f" security={current.security}" if current.security != "plaintext" else ""
    print(
        f"{word} {current.bootstrap} pid={current.pid} kafka={current.version} "
        f"cluster={current.cluster_id}{security} dir={state}"
    )
    return 0 if current.answering else 1


def _grant_command(args: argparse.Namespace, state: Path) -> int:
    if args.cluster:
        kind, name = "cluster", CLUSTER_RESOURCE
    elif args.topic is not None:
        kind, name = "topic", args.topic
    elif args.group is not None:
        kind, name = "group", args.group
    else:
        kind, name = "transactional_id", args.transactional_id
    pattern = "prefixed" if args.prefixed else "literal"
    for acl in grant(state, args.user, kind, name, args.operation, pattern=pattern):
        what = f"{acl.operation} on {acl.resource_type} {acl.name} ({acl.pattern})"
        print(f"allowed {acl.principal} {what}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "fetch":
            print(ensure_jars(args.kafka_version))
            return 0
        state: Path = (args.dir or default_state_dir()).absolute()
        if args.command == "start":
            return _start_command(args, state)
        if args.command == "restart":
            return _restart_command(args, state)
        if args.command in ("stop", "kill"):
            return _stop_command(args, state, hard=args.command == "kill")
        if args.command == "env":
            return _env_command(args, state)
        if args.command == "grant":
            return _grant_command(args, state)
        return _status_command(state)
    except BrokerError as exc:
        print(f"kafka-local: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
