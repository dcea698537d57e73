#!/usr/bin/env python3
"""A real single-node Apache Kafka (KRaft, combined broker+controller), without Docker.

The broker is Apache Kafka's own jars, resolved once from Maven Central with the
machine's ``mvn`` and cached under ``${TICKWHEEL_CACHE:-~/.cache/tickwheel}/kafka-<version>/libs``
(a marker file records success, so later runs never call Maven again), started with
the machine's ``java`` (17+).

Usage (``scripts/kafka-local`` is a wrapper around this file)::

    kafka_local.py start   [--dir DIR] [--fresh] [--port N] [--timeout S] [--set key=value ...]
    kafka_local.py restart [--dir DIR] [--timeout S]
    kafka_local.py stop    [--dir DIR] [--timeout S]
    kafka_local.py status  [--dir DIR]
    kafka_local.py env     [--dir DIR]           # export KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:PORT
    kafka_local.py fetch                         # only resolve the jars, print their folder

The broker keeps its data between starts, like a real one.  The first ``start`` in a
state dir formats its storage (a new random cluster id, an empty log); every later
``start`` serves the same ``data/`` (topics, records, committed offsets, transactions)
with the same cluster id on the same port, which the state dir remembers in
``cluster.json``.  If that port is taken by something else, ``start`` fails with an error
naming it (``--port N`` moves the broker to another port; its data is kept); only a dir
with no remembered port gets a free one.  ``start --fresh`` wipes ``data/`` and formats
anew: an empty broker with a new cluster id (on the remembered port if it is free, else on
a free one).  If a broker is already running in DIR, ``start`` prints its address and
leaves it alone (``--fresh`` stops and wipes it).

``start`` and ``restart`` print progress on stderr, with a hint line
``export KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:PORT``, and the bootstrap address
``127.0.0.1:PORT`` as the last line on stdout once the broker answers a Metadata request
(scripts read it with ``tail -n 1``).  ``restart`` stops the broker and starts it again on
the same dir and port with its data, Kafka version and ``--set`` settings (to try recovery
after a broker outage); it fails on a dir where no broker was ever started.  ``stop``
sends SIGTERM to the broker's process group, waits (20 s by default), then SIGKILL; the
data stays.  ``status`` prints ``running 127.0.0.1:PORT pid=... kafka=... cluster=...
dir=...`` (exit 0), ``unresponsive ...`` (exit 1) or ``stopped`` (exit 3).  ``env`` prints
``export KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:PORT`` for the running broker, for
``eval "$(scripts/kafka-local env)"`` (exit 3 and a message on stderr if it is stopped).

The state dir (``--dir``, default ``${TICKWHEEL_STATE:-/tmp/tickwheel-kafka}``) holds
``server.properties`` (rewritten on every start), the logging config, ``data/``
(log.dirs, with Kafka's ``meta.properties`` naming the cluster id), ``cluster.json``
(kept across stops: cluster id, port, controller port, Kafka version, ``--set``
settings), ``broker.log`` (the broker's stdout/stderr since its last start),
``kafka.pid`` and ``broker.json`` (pid, address, version of the running broker).

Broker settings: PLAINTEXT on 127.0.0.1 only, on the port chosen as above, the
controller listener on another port (remembered too, but replaced by a free one if it
is taken: clients never see it; the voters are static config); replication factor 1 everywhere;
``auto.create.topics.enable=false`` (tests and the application create their topics
explicitly, with the partition count they need, so a typo never creates a stray
1-partition topic); ``group.initial.rebalance.delay.ms=0``; small internal topics (4
partitions) and ``group.min.session.timeout.ms=1000`` so that failover tests can use
short consumer session timeouts.

Environment: ``TICKWHEEL_KAFKA_VERSION`` overrides the pinned version (for trying
others; 4.x works too: ``scripts/test`` runs the Kafka tests again on 4.1.2),
``TICKWHEEL_KAFKA_JVM_OPTS`` adds JVM options (e.g. a bigger heap), ``JAVA_HOME`` picks
the JVM.

As a module (stdlib only)::

    broker = kafka_local.start(state_dir)   # -> Broker(bootstrap="127.0.0.1:PORT", ...)
    broker = kafka_local.restart(state_dir) # stop + start: same data and address
    ...
    broker.stop()

The library's ``start`` is *fresh by default* (``fresh=True``): tests and benchmarks
(tests/kafka_broker.py) get an empty broker every run.  ``start(state_dir, fresh=False)``
keeps the data as the CLI does; ``restart`` always keeps it and returns the new
:class:`Broker` (the old one is stopped).  A library ``start`` holds a lock on its state
dir until ``stop`` (a second live process gets a clear error instead of killing the first
one's broker), stops any broker left in that dir by a process that died, and stops its
own broker at interpreter exit if ``stop`` was never called.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

KAFKA_VERSION = "3.9.2"
"""The pinned Apache Kafka version (``org.apache.kafka:kafka_2.13``)."""

SCALA_VERSION = "2.13"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"

# Logging bindings that the binary distribution ships but the Maven POMs leave out.
_LOGGING_DEPS_3 = (
    ("org.slf4j", "slf4j-reload4j", "1.7.36"),
    ("ch.qos.reload4j", "reload4j", "1.2.25"),
)
_LOGGING_DEPS_4 = (("org.apache.logging.log4j", "log4j-slf4j-impl", "2.24.3"),)

JVM_OPTS: tuple[str, ...] = (
    "-Xms256m",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Xshare:auto",
    "-XX:-OmitStackTraceInFastThrow",
    "-Djava.awt.headless=true",
)
_TOOL_JVM_OPTS: tuple[str, ...] = (
    "-Xmx256m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Xshare:auto",
)

HOST = "127.0.0.1"
NODE_ID = 1
DEFAULT_START_TIMEOUT = 120.0
DEFAULT_STOP_TIMEOUT = 20.0

BROKER_SETTINGS: dict[str, str] = {
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "default.replication.factor": "1",
    "min.insync.replicas": "1",
    "num.partitions": "1",
    "auto.create.topics.enable": "false",
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "1000",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
}
"""Settings shared by every test broker (this script's, and the Docker one in tests/)."""

_LOCAL_SETTINGS: dict[str, str] = {
    "num.network.threads": "2",
    "num.io.threads": "4",
    "background.threads": "4",
    "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
}

PIDFILE = "kafka.pid"
INFOFILE = "broker.json"
LOGFILE = "broker.log"
CLUSTERFILE = "cluster.json"
"""Kept across stops: the cluster id, ports, Kafka version and ``--set`` settings."""
DATA = "data"
_META = "meta.properties"
_LOCKFILE = ".lock"


class BrokerError(RuntimeError):
    """The broker could not be resolved, started or stopped."""


def _say(message: str) -> None:
    print(f"kafka-local: {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- paths


def kafka_version() -> str:
    return os.environ.get("TICKWHEEL_KAFKA_VERSION") or KAFKA_VERSION


def cache_root() -> Path:
    configured = os.environ.get("TICKWHEEL_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "tickwheel"


def default_state_dir() -> Path:
    return Path(os.environ.get("TICKWHEEL_STATE") or "/tmp/tickwheel-kafka")


def _major(version: str) -> int:
    return int(version.split(".", 1)[0])


# --------------------------------------------------------------------------- jars


def _pom(version: str) -> str:
    deps = [("org.apache.kafka", f"kafka_{SCALA_VERSION}", version)]
    deps += _LOGGING_DEPS_4 if _major(version) >= 4 else _LOGGING_DEPS_3
    lines = "\n".join(
        "    <dependency><groupId>{}</groupId><artifactId>{}</artifactId>"
        "<version>{}</version></dependency>".format(*dep)
        for dep in deps
    )
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- generated by tickwheel scripts/kafka_local.py: the jars to run Apache Kafka {version} -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.tickwheel</groupId>
  <artifactId>kafka-runtime</artifactId>
  <version>{version}</version>
  <packaging>pom</packaging>
  <dependencies>
{lines}
  </dependencies>
</project>
"""


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def ensure_jars(version: str | None = None) -> Path:
    """Return the folder of Kafka's runtime jars, resolving them with Maven on first use."""
    version = version or kafka_version()
    home = cache_root() / f"kafka-{version}"
    libs = home / "libs"
    marker = home / ".resolved"
    pom = _pom(version)
    digest = hashlib.sha256(pom.encode()).hexdigest()

    def ready() -> bool:
        try:
            return marker.read_text().strip() == digest and libs.is_dir()
        except OSError:
            return False

    if ready():
        return libs
    home.mkdir(parents=True, exist_ok=True)
    with _flock(home / ".lock"):
        if ready():
            return libs
        mvn = shutil.which("mvn")
        if mvn is None:
            raise BrokerError(
                "Maven (mvn) is not on PATH: it is needed once to fetch Apache Kafka's jars "
                f"into {libs}"
            )
        pom_path = home / "pom.xml"
        pom_path.write_text(pom)
        staging = home / "libs.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        _say(f"resolving Apache Kafka {version} jars from Maven Central (first run only)")
        started = time.monotonic()
        command = [
            mvn,
            "-B",
            "-q",
            "-f",
            str(pom_path),
            f"{DEPENDENCY_PLUGIN}:copy-dependencies",
            f"-DoutputDirectory={staging}",
            "-DincludeScope=runtime",
        ]
        result = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            check=False,
        )
        main_jar = staging / f"kafka_{SCALA_VERSION}-{version}.jar"
        if result.returncode != 0 or not main_jar.is_file():
            tail = "\n".join(result.stdout.splitlines()[-40:])
            raise BrokerError(
                f"could not resolve Apache Kafka {version} with Maven "
                f"(exit {result.returncode}): {shlex.join(command)}\n{tail}"
            )
        shutil.rmtree(libs, ignore_errors=True)
        staging.rename(libs)
        marker.write_text(digest + "\n")
        jars = sum(1 for _ in libs.glob("*.jar"))
        _say(f"resolved {jars} jars in {time.monotonic() - started:.1f} s into {libs}")
    return libs


# --------------------------------------------------------------------------- processes


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise BrokerError("java is not on PATH (and JAVA_HOME is not set): Kafka needs Java 17+")
    return java


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
    return b"kafka.Kafka" in cmdline and str(state_dir).encode() in cmdline


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


# --------------------------------------------------------------------------- wire probe


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("connection closed by the broker")
        chunks += chunk
    return bytes(chunks)


def _request(
    sock: socket.socket, api_key: int, version: int, correlation: int, body: bytes
) -> bytes:
    client_id = b"tickwheel-kafka-local"
    header = struct.pack(">hhih", api_key, version, correlation, len(client_id)) + client_id
    payload = header + body
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    (size,) = struct.unpack(">i", _recv_exact(sock, 4))
    response = _recv_exact(sock, size)
    (got,) = struct.unpack_from(">i", response, 0)
    if got != correlation:
        raise ConnectionError(f"unexpected correlation id {got}")
    return response[4:]


def _api_versions(sock: socket.socket) -> dict[int, tuple[int, int]]:
    body = _request(sock, 18, 0, 1, b"")
    error, count = struct.unpack_from(">hi", body, 0)
    if error != 0:
        raise ConnectionError(f"ApiVersions error {error}")
    versions: dict[int, tuple[int, int]] = {}
    for i in range(count):
        key, low, high = struct.unpack_from(">hhh", body, 6 + 6 * i)
        versions[key] = (low, high)
    return versions


def _metadata_brokers(sock: socket.socket, version: int) -> list[tuple[int, str, int]]:
    # Metadata v4..v8 (non-flexible): topics=[] (no topics), allow_auto_topic_creation=false,
    # v8 adds the two include_*_authorized_operations flags.
    body = struct.pack(">ib", 0, 0) + (b"\x00\x00" if version >= 8 else b"")
    response = _request(sock, 3, version, 2, body)
    offset = 4  # throttle_time_ms
    (count,) = struct.unpack_from(">i", response, offset)
    offset += 4
    brokers: list[tuple[int, str, int]] = []
    for _ in range(count):
        node_id, host_len = struct.unpack_from(">ih", response, offset)
        offset += 6
        host = response[offset : offset + host_len].decode()
        offset += host_len
        port, rack_len = struct.unpack_from(">ih", response, offset)
        offset += 6 + max(rack_len, 0)
        brokers.append((node_id, host, port))
    return brokers


def probe(bootstrap: str, timeout: float = 3.0) -> bool:
    """Whether the broker at ``host:port`` answers ApiVersions and lists brokers in Metadata."""
    host, _, port = bootstrap.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as sock:
            sock.settimeout(timeout)
            versions = _api_versions(sock)
            low, high = versions.get(3, (0, -1))
            usable = [v for v in range(4, 9) if low <= v <= high]
            if not usable:
                return True  # it answered ApiVersions; this probe speaks no common Metadata
            return bool(_metadata_brokers(sock, usable[-1]))
    except (OSError, ValueError, struct.error, UnicodeDecodeError):
        return False


def wait_until_ready(
    bootstrap: str, timeout: float = DEFAULT_START_TIMEOUT, pid: int | None = None
) -> None:
    """Block until the broker answers, or raise BrokerError (also if ``pid`` dies)."""
    deadline = time.monotonic() + timeout
    while True:
        if pid is not None and not _alive(pid):
            raise BrokerError(f"the Kafka process {pid} exited during startup")
        if probe(bootstrap, timeout=2.0):
            return
        if time.monotonic() >= deadline:
            raise BrokerError(f"Kafka at {bootstrap} did not answer within {timeout:g} s")
        time.sleep(0.1)


# --------------------------------------------------------------------------- config


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


def _logging_config(state_dir: Path, version: str, tool: bool) -> tuple[Path, str]:
    """Write the log config; return it and the JVM property that selects it."""
    level = "WARN" if tool else "INFO"
    quiet = ("kafka.server.KafkaConfig", "org.apache.kafka.common.config.AbstractConfig")
    if _major(version) >= 4:
        path = state_dir / ("tools-log4j2.properties" if tool else "log4j2.properties")
        target = "SYSTEM_ERR" if tool else "SYSTEM_OUT"
        text = [
            "appender.console.type = Console",
            "appender.console.name = console",
            f"appender.console.target = {target}",
            "appender.console.layout.type = PatternLayout",
            "appender.console.layout.pattern = [%d] %p %m (%c)%n",
            f"rootLogger.level = {level}",
            "rootLogger.appenderRef.console.ref = console",
        ]
        for i, name in enumerate(quiet):
            text += [f"logger.q{i}.name = {name}", f"logger.q{i}.level = WARN"]
        prop = f"-Dlog4j2.configurationFile={path}"
    else:
        path = state_dir / ("tools-log4j.properties" if tool else "log4j.properties")
        target = "System.err" if tool else "System.out"
        text = [
            f"log4j.rootLogger={level}, console",
            "log4j.appender.console=org.apache.log4j.ConsoleAppender",
            f"log4j.appender.console.Target={target}",
            "log4j.appender.console.layout=org.apache.log4j.PatternLayout",
            "log4j.appender.console.layout.ConversionPattern=[%d] %p %m (%c)%n",
        ]
        text += [f"log4j.logger.{name}=WARN" for name in quiet]
        prop = f"-Dlog4j.configuration=file:{path}"
    path.write_text("\n".join(text) + "\n")
    return path, prop


def server_properties(
    state_dir: Path,
    port: int,
    controller_port: int,
    version: str,
    overrides: Mapping[str, str] | None = None,
) -> dict[str, str]:
    settings = {
        "process.roles": "broker,controller",
        "node.id": str(NODE_ID),
        "controller.quorum.voters": f"{NODE_ID}@{HOST}:{controller_port}",
        "listeners": f"PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(state_dir / "data"),
        **BROKER_SETTINGS,
        **_LOCAL_SETTINGS,
    }
    if _major(version) >= 4:
        settings["share.coordinator.state.topic.replication.factor"] = "1"
        settings["share.coordinator.state.topic.min.isr"] = "1"
    settings.update(overrides or {})
    return settings


def _write_properties(path: Path, settings: Mapping[str, str]) -> None:
    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace("\n", "\\n")

    lines = ["# generated by tickwheel scripts/kafka_local.py; rewritten on every start"]
    lines += [f"{key}={escape(value)}" for key, value in settings.items()]
    path.write_text("\n".join(lines) + "\n")


def _cluster_id() -> str:
    # As Kafka's own Uuid.randomUuid: an id starting with "-" would be read as an option
    # by kafka-storage (about one start in 64 failed with "expected one argument").
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


def _format_storage(
    java: str, libs: Path, state_dir: Path, props: Path, version: str, cluster_id: str
) -> None:
    """Wipe ``data/`` and format it anew for ``cluster_id`` (an empty broker)."""
    shutil.rmtree(state_dir / DATA, ignore_errors=True)
    _, log_prop = _logging_config(state_dir, version, tool=True)
    command = [
        java,
        *_TOOL_JVM_OPTS,
        log_prop,
        "-cp",
        str(libs / "*"),
        "kafka.tools.StorageTool",
        "format",
        "-t",
        cluster_id,
        "-c",
        str(props),
    ]
    result = subprocess.run(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise BrokerError(
            f"formatting KRaft storage failed (exit {result.returncode}):\n{result.stdout}"
        )


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


# --------------------------------------------------------------------------- kept state


@dataclass(frozen=True)
class Remembered:
    """What ``cluster.json`` remembers of the broker last started in a state dir."""

    cluster_id: str | None = None
    port: int | None = None
    controller_port: int | None = None
    version: str | None = None
    overrides: dict[str, str] = field(default_factory=dict)


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
    return Remembered(
        cluster_id=cluster_id if isinstance(cluster_id, str) and cluster_id else None,
        port=_port_or_none(raw.get("port")),
        controller_port=_port_or_none(raw.get("controller_port")),
        version=version if isinstance(version, str) and version else None,
        overrides=(
            {str(k): str(v) for k, v in overrides.items()} if isinstance(overrides, dict) else {}
        ),
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


# --------------------------------------------------------------------------- API


@dataclass
class Broker:
    """A running local broker started by :func:`start` (or :func:`restart`)."""

    bootstrap: str
    pid: int
    state_dir: Path
    version: str
    startup_seconds: float = 0.0
    cluster_id: str | None = None
    kept: bool = False
    """Whether this start kept the data of the dir's earlier broker (not formatted anew)."""
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
        atexit.unregister(self.stop)
        if self._stopped:
            return
        try:
            _terminate(self.pid, timeout)
            _clear_state_files(self.state_dir, self.pid)
            self._stopped = True
        finally:
            if _OWNED.get(self.state_dir) is self:
                del _OWNED[self.state_dir]
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    def restart(self, timeout: float = DEFAULT_START_TIMEOUT) -> Broker:
        """Stop this broker and start it again with its data and address: see :func:`restart`."""
        return restart(self.state_dir, timeout=timeout, stop_at_exit=self._stop_at_exit)

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_OWNED: dict[Path, Broker] = {}
"""The brokers this process started and has not stopped, by state dir (their locks)."""


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


def start(
    state_dir: Path | str | None = None,
    *,
    fresh: bool = True,
    version: str | None = None,
    timeout: float = DEFAULT_START_TIMEOUT,
    port: int | None = None,
    overrides: Mapping[str, str] | None = None,
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

    Any broker left running in ``state_dir`` is stopped first.  Raises
    :class:`BrokerError` (with the tail of the broker log) on failure, leaving no process
    behind.
    """
    version = version or kafka_version()
    state = Path(state_dir or default_state_dir()).absolute()
    state.mkdir(parents=True, exist_ok=True)
    lock_fd = _lock_state_dir(state)
    try:
        stop(state)
        plan = plan_start(
            read_remembered(state), formatted_cluster_id(state), fresh=fresh, port=port
        )
        libs = ensure_jars(version)
        java = _java()
        if plan.keep:
            _say(
                f"keeping the data of cluster {plan.cluster_id} in {state / DATA} (--fresh: empty)"
            )
        else:
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
                    ),
                )
                _say(
                    f"Apache Kafka {broker.version} is up at {broker.bootstrap} "
                    f"(pid {broker.pid}, {broker.startup_seconds:.1f} s, log {broker.log_file})"
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
        os.close(lock_fd)
        raise


def restart(
    state_dir: Path | str | None = None,
    *,
    timeout: float = DEFAULT_START_TIMEOUT,
    stop_at_exit: bool = True,
) -> Broker:
    """Stop the broker of ``state_dir`` (if it runs) and start it again; the new Broker.

    Same data, cluster id, port (so the same bootstrap address), Kafka version and
    ``--set`` settings as its last start.  A broker that this process started is stopped
    through its :class:`Broker` (which holds the dir's lock); the ``Broker`` of the old
    process is stopped and must not be used any more.  Raises :class:`BrokerError` when
    the dir has no broker to restart (never formatted), when its port is taken meanwhile,
    or when another live process holds the dir.
    """
    state = Path(state_dir or default_state_dir()).absolute()
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
        stop_at_exit=stop_at_exit,
    )


def check_restartable(state_dir: Path) -> None:
    """Raise :class:`BrokerError` unless ``state_dir`` holds a formatted broker."""
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
) -> Broker | None:
    """One start attempt: the Broker, or None when the ports were taken meanwhile.

    Formats the storage first for ``format_cluster`` (None: keep ``data/`` as it is).
    """
    props = state / "server.properties"
    _write_properties(props, server_properties(state, port, controller_port, version, overrides))
    if format_cluster is not None:
        _format_storage(java, libs, state, props, version, format_cluster)
    _, log_prop = _logging_config(state, version, tool=False)
    extra = shlex.split(os.environ.get("TICKWHEEL_KAFKA_JVM_OPTS", ""))
    argv = [java, *JVM_OPTS, *extra, log_prop, "-cp", str(libs / "*"), "kafka.Kafka", str(props)]
    bootstrap = f"{HOST}:{port}"
    pid = _spawn(argv, state / LOGFILE)
    (state / PIDFILE).write_text(f"{pid}\n")
    try:
        wait_until_ready(bootstrap, timeout, pid=pid)
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
    info = {
        "pid": pid,
        "bootstrap": bootstrap,
        "version": version,
        "controller_port": controller_port,
        "cluster_id": formatted_cluster_id(state),
    }
    (state / INFOFILE).write_text(json.dumps(info) + "\n")
    return Broker(bootstrap=bootstrap, pid=pid, state_dir=state, version=version, _lock_fd=lock_fd)


def stop(state_dir: Path | str | None = None, timeout: float = DEFAULT_STOP_TIMEOUT) -> bool:
    """Stop the broker recorded in ``state_dir``; return whether one was running.

    Its data stays: the next ``start`` (without ``--fresh``) serves it again.
    """
    state = Path(state_dir or default_state_dir()).absolute()
    pid = _read_pid(state)
    running = pid is not None and _is_broker(pid, state)
    if running and pid is not None:
        _terminate(pid, timeout)
    _clear_state_files(state)
    return running


@dataclass
class Status:
    running: bool
    answering: bool
    bootstrap: str | None
    pid: int | None
    version: str | None
    cluster_id: str | None = None


def status(state_dir: Path | str | None = None) -> Status:
    state = Path(state_dir or default_state_dir()).absolute()
    pid = _read_pid(state)
    info = _read_info(state)
    bootstrap = info.get("bootstrap")
    version = info.get("version")
    if pid is None or not _is_broker(pid, state):
        return Status(False, False, None, None, None)
    address = bootstrap if isinstance(bootstrap, str) else None
    answering = address is not None and probe(address)
    cluster = info.get("cluster_id")
    return Status(
        True,
        answering,
        address,
        pid,
        version if isinstance(version, str) else None,
        cluster if isinstance(cluster, str) else formatted_cluster_id(state),
    )


# --------------------------------------------------------------------------- CLI


def env_line(bootstrap: str) -> str:
    """The shell line that points ``tickwheel`` (and any Kafka client) at ``bootstrap``."""
    return f"export KAFKA_BOOTSTRAP_SERVERS={shlex.quote(bootstrap)}"


def _hint(bootstrap: str) -> None:
    _say(f"to use it in a shell: {env_line(bootstrap)}")


def _parse_settings(pairs: Sequence[str]) -> dict[str, str]:
    settings: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"kafka-local: --set expects key=value, got {pair!r}")
        settings[key.strip()] = value.strip()
    return settings


_DESCRIPTION = """\
Run a local single-node Apache Kafka (KRaft) from Apache Kafka's own jars, without Docker.
The broker keeps its data in the state dir between starts, like a real one: `start` again
serves the same topics, records and committed offsets on the same address; `start --fresh`
wipes them for an empty broker."""

_EPILOG = """\
examples:
  kafka-local start                      # start (or keep running); last stdout line: address
  eval "$(kafka-local env)"              # export KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:PORT
  kafka-local restart                    # stop + start: same data, same address
  kafka-local start --fresh              # an empty broker (wipes the data)
  kafka-local stop                       # stop; the data stays for the next start

exit codes: 0 ok, 1 error (or broker unresponsive), 3 not running (status, env)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kafka-local",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="state dir: settings, data/, broker.log "
        "(default ${TICKWHEEL_STATE:-/tmp/tickwheel-kafka})",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    start_cmd = commands.add_parser(
        "start",
        parents=[common],
        help="start the broker, keeping its data and address (--fresh: empty), and wait",
        description="Start the broker and wait until it answers; print its address "
        "(127.0.0.1:PORT) as the last line on stdout.  A state dir that held a broker "
        "before keeps its data, cluster id and port (an error if that port is taken by "
        "something else); a broker already running there is left alone.",
    )
    start_cmd.add_argument(
        "--fresh",
        action="store_true",
        help="wipe the data and format anew: an empty broker with a new cluster id "
        "(stops a running one first); it keeps the remembered port if that is free",
    )
    start_cmd.add_argument(
        "--port",
        type=int,
        default=None,
        help="PLAINTEXT port (default: the one remembered in the state dir, else a free one); "
        "remembered for later starts",
    )
    start_cmd.add_argument(
        "--timeout", type=float, default=DEFAULT_START_TIMEOUT, help="seconds to wait for it"
    )
    start_cmd.add_argument("--kafka-version", default=None, help=f"default {KAFKA_VERSION}")
    start_cmd.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="broker setting for this start (and its restarts); repeatable",
    )
    restart_cmd = commands.add_parser(
        "restart",
        parents=[common],
        help="stop and start again: same data, same address",
        description="Stop the broker (if it runs) and start it again on the same state dir "
        "and port, keeping its data, Kafka version and --set settings; print its address "
        "as the last line on stdout.  For trying recovery after a broker outage.",
    )
    restart_cmd.add_argument(
        "--timeout", type=float, default=DEFAULT_START_TIMEOUT, help="seconds to wait for it"
    )
    stop_cmd = commands.add_parser(
        "stop",
        parents=[common],
        help="stop the broker (its data stays for the next start)",
        description="SIGTERM the broker, SIGKILL after --timeout seconds.  The data stays in "
        "the state dir for the next start.",
    )
    stop_cmd.add_argument("--timeout", type=float, default=DEFAULT_STOP_TIMEOUT)
    commands.add_parser(
        "status",
        parents=[common],
        help="running/stopped and the address",
        description="Print `running 127.0.0.1:PORT ...` (exit 0), `unresponsive ...` "
        "(exit 1) or `stopped` (exit 3).",
    )
    commands.add_parser(
        "env",
        parents=[common],
        help="print `export KAFKA_BOOTSTRAP_SERVERS=...` for eval",
        description="Print `export KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:PORT` for the running "
        'broker, for `eval "$(scripts/kafka-local env)"`; exit 3 (nothing on stdout) if it '
        "is stopped.",
    )
    fetch_cmd = commands.add_parser("fetch", help="only resolve the jars; print their folder")
    fetch_cmd.add_argument("--kafka-version", default=None, help=f"default {KAFKA_VERSION}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "fetch":
            print(ensure_jars(args.kafka_version))
            return 0
        state: Path = (args.dir or default_state_dir()).absolute()
        if args.command == "start":
            current = status(state)
            if current.running and current.answering and current.bootstrap and not args.fresh:
                _say(f"already running (pid {current.pid}) in {state}")
                if args.port is not None and not current.bootstrap.endswith(f":{args.port}"):
                    _say(f"warning: --port {args.port} ignored: stop it first to move it")
                _hint(current.bootstrap)
                print(current.bootstrap)
                return 0
            broker = start(
                state,
                fresh=args.fresh,
                version=args.kafka_version,
                timeout=args.timeout,
                port=args.port,
                overrides=_parse_settings(args.set),
                stop_at_exit=False,
            )
            _hint(broker.bootstrap)
            print(broker.bootstrap, flush=True)
            return 0
        if args.command == "restart":
            broker = restart(state, timeout=args.timeout, stop_at_exit=False)
            _hint(broker.bootstrap)
            print(broker.bootstrap, flush=True)
            return 0
        if args.command == "stop":
            was_running = stop(state, args.timeout)
            print("stopped" if was_running else "stopped (was not running)")
            return 0
        current = status(state)
        if args.command == "env":
            if not current.running or not current.bootstrap:
                print(
                    f"kafka-local: no broker is running in {state} "
                    f"(start one: scripts/kafka-local start --dir {shlex.quote(str(state))})",
                    file=sys.stderr,
                )
                return 3
            print(env_line(current.bootstrap))
            if not current.answering:
                _say(f"warning: the broker at {current.bootstrap} does not answer (yet?)")
                return 1
            return 0
        if not current.running:
            print("stopped")
            return 3
        word = "running" if current.answering else "unresponsive"
        print(
            f"{word} {current.bootstrap} pid={current.pid} kafka={current.version} "
            f"cluster={current.cluster_id} dir={state}"
        )
        return 0 if current.answering else 1
    except BrokerError as exc:
        print(f"kafka-local: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
