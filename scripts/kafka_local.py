#!/usr/bin/env python3
"""A real Apache Kafka (KRaft, combined broker+controller nodes), without Docker.

One node by default; a cluster of several (``--brokers 3``); PLAINTEXT by default, or
secured (``--security ssl|sasl_ssl``: TLS, SCRAM users, ACLs).

The broker is Apache Kafka's own jars, resolved once from Maven Central with the
machine's ``mvn`` and cached under ``${TICKWHEEL_CACHE:-~/.cache/tickwheel}/kafka-<version>/libs``
(a marker file records success, so later runs never call Maven again), started with
the machine's ``java`` (17+).

Usage (``scripts/kafka-local`` is a wrapper around this file)::

    kafka_local.py start   [--dir DIR] [--fresh] [--port N] [--timeout S] [--set key=value ...]
                           [--security plaintext|ssl|sasl_ssl] [--brokers N]
    kafka_local.py start   [--dir DIR] --node N   # start one node of a cluster again
    kafka_local.py restart [--dir DIR] [--node N] [--timeout S]
    kafka_local.py stop    [--dir DIR] [--node N] [--timeout S]
    kafka_local.py kill    [--dir DIR] [--node N] # SIGKILL: a crash
    kafka_local.py status  [--dir DIR]
    kafka_local.py env     [--dir DIR] [--user admin|tickwheel]  # export KAFKA_...=...
    kafka_local.py grant   [--dir DIR] [--user U] (--topic T | --group G |
                           --transactional-id X | --cluster) [--prefixed] --operation OP ...
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
settings, security, node count and ports), ``broker.log`` (the broker's stdout/stderr
since its last start), ``kafka.pid`` and ``broker.json`` (pid, address, version of the
running broker); a secured broker's ``tls/`` and ``secrets/`` too (below).

Security (``start --security``; a kept broker keeps its own, changing it takes
``--fresh``).  ``ssl``: the client listener is TLS and requires a client certificate
(``CN=name`` is the principal ``User:name``).  ``sasl_ssl``: SCRAM-SHA-512 and -256 over
TLS, no client certificate; the SCRAM users are created when the storage is formatted
(``kafka-storage format --add-scram``), and the brokers' own inter-broker traffic
authenticates as ``admin``.  Both: ``StandardAuthorizer`` with
``allow.everyone.if.no.acl.found=false``; super users ``User:admin`` and
``User:kafka-broker`` (the brokers' certificate: the controller listener is TLS with client
certificates among the nodes, never PLAINTEXT); the user ``tickwheel`` has no ACL until
one is granted (``grant``, or :func:`grant`, which waits until every node applies it).
The first secured start makes, with the machine's ``openssl``, a CA, the brokers'
certificate (``localhost``, ``127.0.0.1``) and a client certificate per user in ``tls/``
(PEM; the brokers read ``tls/broker.pem``, key and chain, with ``ssl.keystore.type=PEM``),
and a random password per user in ``secrets/USER.password``; private keys, passwords and
``server.properties`` are mode 0600.  They are kept across starts and ``--fresh``.
``env`` prints every variable a client needs: ``KAFKA_BOOTSTRAP_SERVERS``,
``KAFKA_SECURITY_PROTOCOL`` (``SSL``/``SASL_SSL``), ``KAFKA_SSL_CAFILE``, then
``KAFKA_SSL_CERTFILE`` and ``KAFKA_SSL_KEYFILE`` (ssl) or ``KAFKA_SASL_MECHANISM``
(``SCRAM-SHA-512``), ``KAFKA_SASL_USERNAME`` and ``KAFKA_SASL_PASSWORD_FILE`` (sasl_ssl);
``env --user tickwheel`` the same for that user; then, for Kafka's own ``kafka-acls.sh``
(the jars ship no ``bin/``: it is written in ``DIR/bin``, running the cached jars),
``export PATH=DIR/bin:"$PATH"`` and ``KAFKA_ADMIN_PROPERTIES`` (``DIR/admin.properties``,
mode 0600: the super user's client settings, for ``--command-config``).  This script's
own readiness probe speaks TLS and SCRAM too (stdlib only).

Clusters (``start --brokers 3``): every node is a broker and a controller in its own JVM
(256 MiB heap) with its own dir ``node-N/`` (properties, ``data/``, log, pid), client and
controller ports (``--port P``: node N on ``P+N-1``), ``controller.quorum.voters`` of all;
``default.replication.factor=3``, ``min.insync.replicas=2`` and internal topics replicated
3 times.  The address printed lists every node.  ``start`` is ready when every node lists
every node in Metadata; ``start`` on a cluster some of whose nodes run starts the others.
``stop`` stops every node at once (SIGKILL for those still up :data:`STRAGGLER_GRACE`
seconds after the first exited: without a quorum they may wait for ever); ``stop``,
``kill`` (SIGKILL, a crash), ``start`` and ``restart`` with ``--node N`` act on one node,
which keeps its data and ports.  ``status`` prints a summary (``running``, ``degraded``
when a node is down: exit 1, ``stopped``) and a line per node.

Broker settings: 127.0.0.1 only (PLAINTEXT unless secured), on the port chosen as above,
the controller listener on another port (remembered too, but replaced by a free one if it
is taken: clients never see it; the voters are static config); replication factor 1
everywhere (but in a cluster: above);
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

    broker = kafka_local.start(state_dir, security="sasl_ssl")
    broker.client_settings("tickwheel")     # the KAFKA_* variables, as `env --user` prints
    kafka_local.grant(state_dir, "tickwheel", "topic", "orders", ["read", "describe"])

    cluster = kafka_local.start_cluster(state_dir, nodes=3)  # -> Cluster(bootstrap="a,b,c")
    cluster.kill_node(2); cluster.start_node(2)
    cluster.stop()

The library's ``start`` is *fresh by default* (``fresh=True``): tests and benchmarks
(tests/kafka_broker.py) get an empty broker every run.  ``start(state_dir, fresh=False)``
keeps the data as the CLI does; ``restart`` always keeps it and returns the new
:class:`Broker` (the old one is stopped).  A library ``start`` holds a lock on its state
dir until ``stop`` (a second live process gets a clear error instead of killing the first
one's broker), stops any broker left in that dir by a process that died, and stops its
own broker at interpreter exit if ``stop`` was never called; so does ``start_cluster``
(its :class:`Cluster` holds the lock; the module's ``start_node`` in another process
then fails on it, ``stop_node`` and ``kill_node`` do not need it).
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import time
import uuid
import zipfile
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

CLUSTER_JVM_OPTS: tuple[str, ...] = ("-Xms128m", "-Xmx256m", *JVM_OPTS[2:])
"""Each JVM of a multi-node cluster (``start --brokers 3``): a 256 MiB heap."""

HOST = "127.0.0.1"
NODE_ID = 1
MAX_NODES = 9
DEFAULT_START_TIMEOUT = 120.0
DEFAULT_CLUSTER_START_TIMEOUT = 180.0
DEFAULT_STOP_TIMEOUT = 20.0

SECURITY_PROTOCOLS = ("plaintext", "ssl", "sasl_ssl")
"""``start --security``: PLAINTEXT, TLS with client certificates, or SCRAM over TLS."""
ADMIN_USER = "admin"
"""The super user (``super.users``); the brokers' own inter-broker traffic uses it too."""
APP_USER = "tickwheel"
"""A user with no ACLs at all: tests grant it exactly what they mean to (``grant``)."""
USERS = (ADMIN_USER, APP_USER)
BROKER_PRINCIPAL = "kafka-broker"
"""The CN (so the principal ``User:kafka-broker``, a super user) of the brokers' certificate."""
SASL_MECHANISM = "SCRAM-SHA-512"
SCRAM_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
PRINCIPAL_RULES = "RULE:^CN=([^,]+)$/$1/,DEFAULT"
"""A client certificate's ``CN=name`` is the principal ``User:name``."""
TLS = "tls"
"""The state dir's certificates: ``ca.pem``, ``broker.pem`` (key + chain), ``USER.crt/.key``."""
SECRETS = "secrets"
"""The state dir's generated passwords, one file per user (``USER.password``, mode 0600)."""
CERT_DAYS = 3650

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
    args = cmdline.split(b"\0")
    return b"kafka.Kafka" in args and str(state_dir / "server.properties").encode() in args


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


class AuthenticationFailed(BrokerError):
    """The broker answered but refused this script's credentials (or its TLS certificate)."""


@dataclass(frozen=True)
class ClientAuth:
    """How a client (this script's probe, or a test) reaches a secured listener.

    ``protocol`` is Kafka's name (``SSL`` or ``SASL_SSL``); ``cafile`` verifies the broker;
    ``certfile``/``keyfile`` are the client certificate (mutual TLS, ``SSL``);
    ``username``/``password`` the SCRAM credentials (``SASL_SSL``).
    """

    protocol: str
    cafile: Path
    certfile: Path | None = None
    keyfile: Path | None = None
    username: str | None = None
    password: str | None = None
    mechanism: str = SASL_MECHANISM

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.cafile))
        if self.certfile is not None:
            context.load_cert_chain(str(self.certfile), str(self.keyfile or self.certfile))
        return context


def _string(value: str | None) -> bytes:
    if value is None:
        return struct.pack(">h", -1)
    raw = value.encode()
    return struct.pack(">h", len(raw)) + raw


def _read_string(data: bytes, offset: int) -> tuple[str | None, int]:
    (size,) = struct.unpack_from(">h", data, offset)
    offset += 2
    if size < 0:
        return None, offset
    return data[offset : offset + size].decode(errors="replace"), offset + size


def _version(versions: Mapping[int, tuple[int, int]], api: int, wanted: Sequence[int]) -> int:
    low, high = versions.get(api, (0, -1))
    usable = [v for v in wanted if low <= v <= high]
    if not usable:
        raise ConnectionError(f"the broker speaks no version of API {api} among {list(wanted)}")
    return usable[-1]


def _scram_name(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


class ScramClient:
    """The client side of SCRAM-SHA-256/512 (RFC 5802, RFC 7677), without channel binding."""

    def __init__(self, mechanism: str, username: str, password: str, nonce: str | None = None):
        digest = {"SCRAM-SHA-512": "sha512", "SCRAM-SHA-256": "sha256"}.get(mechanism)
        if digest is None:
            raise AuthenticationFailed(f"unsupported SASL mechanism {mechanism}")
        self.mechanism, self.digest, self.password = mechanism, digest, password
        self.nonce = nonce or base64.b64encode(secrets.token_bytes(24)).decode()
        self.first_bare = f"n={_scram_name(username)},r={self.nonce}"
        self._expected: str | None = None

    def first(self) -> str:
        """The client-first-message."""
        return "n,," + self.first_bare

    def final(self, server_first: str) -> str:
        """The client-final-message (with the proof) for the server-first-message."""
        fields = dict(item.split("=", 1) for item in server_first.split(",") if "=" in item)
        if "e" in fields or not fields.get("r", "").startswith(self.nonce):
            raise AuthenticationFailed(f"{self.mechanism}: unexpected message {server_first!r}")
        digest = self.digest
        salt, iterations = base64.b64decode(fields["s"]), int(fields["i"])
        salted = hashlib.pbkdf2_hmac(digest, self.password.encode(), salt, iterations)
        client_key = hmac.new(salted, b"Client Key", digest).digest()
        stored_key = hashlib.new(digest, client_key).digest()
        without_proof = f"c=biws,r={fields['r']}"
        message = f"{self.first_bare},{server_first},{without_proof}".encode()
        signature = hmac.new(stored_key, message, digest).digest()
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        server_key = hmac.new(salted, b"Server Key", digest).digest()
        verifier = hmac.new(server_key, message, digest).digest()
        self._expected = "v=" + base64.b64encode(verifier).decode()
        return f"{without_proof},p={base64.b64encode(proof).decode()}"

    def verify(self, server_final: str) -> None:
        """Check the server-final-message: the server knew the password too."""
        if self._expected is None or not hmac.compare_digest(server_final, self._expected):
            raise AuthenticationFailed(f"{self.mechanism}: the broker's signature does not match")


def _sasl_scram(
    sock: socket.socket, versions: Mapping[int, tuple[int, int]], auth: ClientAuth
) -> None:
    """Authenticate ``sock`` with SCRAM over Kafka's SASL framing (SaslHandshake v1 and
    SaslAuthenticate); :class:`AuthenticationFailed` when the broker refuses."""
    if auth.username is None or auth.password is None:
        raise AuthenticationFailed("SASL_SSL needs a username and a password")
    scram = ScramClient(auth.mechanism, auth.username, auth.password)
    handshake = _request(sock, 17, _version(versions, 17, (1,)), 3, _string(auth.mechanism))
    (error,) = struct.unpack_from(">h", handshake, 0)
    if error != 0:
        raise AuthenticationFailed(f"the broker does not enable {auth.mechanism} (error {error})")
    auth_version = _version(versions, 36, (0, 1))
    correlation = iter(range(4, 100))

    def exchange(message: str) -> str:
        raw = message.encode()
        response = _request(
            sock, 36, auth_version, next(correlation), struct.pack(">i", len(raw)) + raw
        )
        (code,) = struct.unpack_from(">h", response, 0)
        text, offset = _read_string(response, 2)
        if code != 0:
            raise AuthenticationFailed(f"{auth.mechanism} as {auth.username}: {text} ({code})")
        (size,) = struct.unpack_from(">i", response, offset)
        return response[offset + 4 : offset + 4 + max(size, 0)].decode()

    scram.verify(exchange(scram.final(exchange(scram.first()))))


@contextlib.contextmanager
def _connection(
    bootstrap: str, timeout: float, auth: ClientAuth | None
) -> Iterator[tuple[socket.socket, dict[int, tuple[int, int]]]]:
    """A connection to one ``host:port`` (TLS, SASL as ``auth`` says) and its ApiVersions."""
    host, _, port = bootstrap.rpartition(":")
    host = host.strip("[]")
    with socket.create_connection((host, int(port)), timeout=timeout) as raw:
        raw.settimeout(timeout)
        sock = raw
        try:
            if auth is not None:
                sock = auth.ssl_context().wrap_socket(raw, server_hostname=host)
            versions = _api_versions(sock)
            if auth is not None and auth.protocol.upper() == "SASL_SSL":
                _sasl_scram(sock, versions, auth)
            yield sock, versions
        except ssl.SSLCertVerificationError as exc:
            raise AuthenticationFailed(f"TLS: {exc.verify_message or exc}") from exc
        finally:
            if sock is not raw:
                sock.close()


def _first(bootstrap: str) -> str:
    return bootstrap.split(",", 1)[0].strip()


def broker_ids(
    bootstrap: str, timeout: float = 3.0, auth: ClientAuth | None = None
) -> list[int] | None:
    """The node ids that the broker at ``host:port`` lists in Metadata (None: no answer).

    An empty list: it answered ApiVersions but this probe speaks no common Metadata
    version.  Raises :class:`AuthenticationFailed` when it refuses ``auth``.
    """
    try:
        with _connection(_first(bootstrap), timeout, auth) as (sock, versions):
            low, high = versions.get(3, (0, -1))
            usable = [v for v in range(4, 9) if low <= v <= high]
            if not usable:
                return []
            return [node for node, _, _ in _metadata_brokers(sock, usable[-1])]
    except AuthenticationFailed:
        raise
    except (OSError, ValueError, KeyError, struct.error, UnicodeDecodeError):
        return None


def probe(
    bootstrap: str,
    timeout: float = 3.0,
    *,
    auth: ClientAuth | None = None,
    expect: Sequence[int] = (),
) -> bool:
    """Whether the broker at ``host:port`` answers ApiVersions and lists brokers in Metadata.

    With ``auth``, over TLS (and SASL); with ``expect``, only if those node ids are among
    the brokers it lists (a cluster's nodes have all registered).  Refused credentials
    count as no answer.
    """
    try:
        ids = broker_ids(bootstrap, timeout, auth)
    except AuthenticationFailed:
        return False
    if ids is None:
        return False
    if not ids:
        return not expect  # it answered ApiVersions; this probe speaks no common Metadata
    return set(expect) <= set(ids)


def wait_until_ready(
    bootstrap: str,
    timeout: float = DEFAULT_START_TIMEOUT,
    pid: int | None = None,
    *,
    auth: ClientAuth | None = None,
    expect: Sequence[int] = (),
) -> None:
    """Block until the broker answers, or raise BrokerError (also if ``pid`` dies).

    ``auth`` and ``expect`` as for :func:`probe`; refused credentials fail at once.
    """
    deadline = time.monotonic() + timeout
    while True:
        if pid is not None and not _alive(pid):
            raise BrokerError(f"the Kafka process {pid} exited during startup")
        ids = broker_ids(bootstrap, 2.0, auth)
        if ids is not None and (set(expect) <= set(ids) if ids else not expect):
            return
        if time.monotonic() >= deadline:
            raise BrokerError(f"Kafka at {bootstrap} did not answer within {timeout:g} s")
        time.sleep(0.1)


# --------------------------------------------------------------------------- ACLs

RESOURCE_TYPES = {"topic": 2, "group": 3, "cluster": 4, "transactional_id": 5}
OPERATIONS = {
    "all": 2,
    "read": 3,
    "write": 4,
    "create": 5,
    "delete": 6,
    "alter": 7,
    "describe": 8,
    "cluster_action": 9,
    "describe_configs": 10,
    "alter_configs": 11,
    "idempotent_write": 12,
}
PATTERNS = {"literal": 3, "prefixed": 4}
_ALLOW, _ANY = 3, 1
CLUSTER_RESOURCE = "kafka-cluster"


@dataclass(frozen=True)
class Acl:
    """One ALLOW rule: ``principal`` may ``operation`` on a resource (from any host)."""

    principal: str
    resource_type: str
    name: str
    operation: str
    pattern: str = "literal"

    def __post_init__(self) -> None:
        if self.resource_type not in RESOURCE_TYPES:
            raise BrokerError(f"resource type must be one of {sorted(RESOURCE_TYPES)}")
        if self.operation not in OPERATIONS:
            raise BrokerError(f"operation must be one of {sorted(OPERATIONS)}")
        if self.pattern not in PATTERNS:
            raise BrokerError(f"pattern must be one of {sorted(PATTERNS)}")

    def encode(self) -> bytes:
        return (
            struct.pack(">b", RESOURCE_TYPES[self.resource_type])
            + _string(self.name)
            + struct.pack(">b", PATTERNS[self.pattern])
            + _string(self.principal)
            + _string("*")
            + struct.pack(">bb", OPERATIONS[self.operation], _ALLOW)
        )


def encode_create_acls(acls: Sequence[Acl]) -> bytes:
    """The body of CreateAcls v1 (non-flexible)."""
    return struct.pack(">i", len(acls)) + b"".join(acl.encode() for acl in acls)


def create_acls(bootstrap: str, auth: ClientAuth | None, acls: Sequence[Acl]) -> None:
    """Create ``acls`` (CreateAcls v1) through the broker at ``bootstrap``; BrokerError if not."""
    try:
        with _connection(_first(bootstrap), 10.0, auth) as (sock, versions):
            response = _request(sock, 30, _version(versions, 30, (1,)), 9, encode_create_acls(acls))
    except (OSError, ValueError, struct.error) as exc:
        raise BrokerError(f"CreateAcls at {bootstrap}: {exc}") from exc
    (count,) = struct.unpack_from(">i", response, 4)
    offset = 8
    errors: list[str] = []
    for acl in acls[:count]:
        (code,) = struct.unpack_from(">h", response, offset)
        text, offset = _read_string(response, offset + 2)
        if code != 0:
            errors.append(f"{acl}: {text or 'error'} ({code})")
    if errors:
        raise BrokerError("CreateAcls refused: " + "; ".join(errors))


def describe_acls(bootstrap: str, auth: ClientAuth | None) -> list[Acl]:
    """Every ALLOW ACL that the broker at ``bootstrap`` applies now (DescribeAcls v1)."""
    body = (
        struct.pack(">b", _ANY)
        + _string(None)
        + struct.pack(">b", _ANY)
        + _string(None)
        + _string(None)
        + struct.pack(">bb", _ANY, _ANY)
    )
    with _connection(_first(bootstrap), 10.0, auth) as (sock, versions):
        response = _request(sock, 29, _version(versions, 29, (1,)), 9, body)
    return parse_describe_acls(response)


def parse_describe_acls(response: bytes) -> list[Acl]:
    """The ALLOW ACLs of a DescribeAcls v1 response body (after the correlation id)."""
    (code,) = struct.unpack_from(">h", response, 4)
    text, offset = _read_string(response, 6)
    if code != 0:
        raise BrokerError(f"DescribeAcls: {text} ({code})")
    names = {v: k for k, v in RESOURCE_TYPES.items()}
    operations = {v: k for k, v in OPERATIONS.items()}
    patterns = {v: k for k, v in PATTERNS.items()}
    found: list[Acl] = []
    (resources,) = struct.unpack_from(">i", response, offset)
    offset += 4
    for _ in range(resources):
        (kind,) = struct.unpack_from(">b", response, offset)
        name, offset = _read_string(response, offset + 1)
        pattern, count = struct.unpack_from(">bi", response, offset)
        offset += 5
        for _ in range(count):
            principal, offset = _read_string(response, offset)
            _host, offset = _read_string(response, offset)
            operation, permission = struct.unpack_from(">bb", response, offset)
            offset += 2
            known = kind in names and operation in operations and pattern in patterns
            if permission == _ALLOW and known:
                found.append(
                    Acl(
                        principal or "",
                        names[kind],
                        name or "",
                        operations[operation],
                        patterns[pattern],
                    )
                )
    return found


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


def _replication_settings(nodes: int, version: str) -> dict[str, str]:
    """A multi-node cluster's internal topics and defaults: replicated, ISR of 2 of 3."""
    if nodes <= 1:
        return {}
    factor = str(min(nodes, 3))
    isr = str(max(1, min(nodes, 3) - 1))
    settings = {
        "offsets.topic.replication.factor": factor,
        "transaction.state.log.replication.factor": factor,
        "transaction.state.log.min.isr": isr,
        "default.replication.factor": factor,
        "min.insync.replicas": isr,
    }
    if _major(version) >= 4:
        settings["share.coordinator.state.topic.replication.factor"] = factor
        settings["share.coordinator.state.topic.min.isr"] = isr
    return settings


def listener_name(security: str) -> str:
    """The client listener's name (and Kafka security protocol) for ``--security``."""
    return security.upper()


def _jaas(username: str, password: str) -> str:
    return (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{username}" password="{password}";'
    )


def security_properties(credentials: Credentials | None) -> dict[str, str]:
    """The TLS, SASL and authorizer settings of a secured broker (none for PLAINTEXT).

    The client listener (also the inter-broker one) is ``SSL`` (client certificates
    required) or ``SASL_SSL`` (SCRAM; the brokers' own traffic as the super user).  The
    controller listener is TLS with client certificates: the brokers and controllers
    present the brokers' certificate, whose principal ``User:kafka-broker`` is a super
    user, as is ``User:admin``; every other principal has only the ACLs granted to it.
    """
    if credentials is None or credentials.security == "plaintext":
        return {}
    tls = credentials.tls
    settings = {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(tls.broker_keystore),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(tls.ca),
        "ssl.principal.mapping.rules": PRINCIPAL_RULES,
        "listener.name.controller.ssl.client.auth": "required",
        "authorizer.class.name": AUTHORIZER,
        "super.users": f"User:{ADMIN_USER};User:{BROKER_PRINCIPAL}",
        "allow.everyone.if.no.acl.found": "false",
    }
    if credentials.security == "ssl":
        settings["ssl.client.auth"] = "required"
        return settings
    password = credentials.passwords.get(ADMIN_USER)
    if password is None:
        raise BrokerError(f"no password for {ADMIN_USER} in {credentials.state_dir / SECRETS}")
    settings["ssl.client.auth"] = "none"
    settings["sasl.enabled.mechanisms"] = ",".join(SCRAM_MECHANISMS)
    settings["sasl.mechanism.inter.broker.protocol"] = SASL_MECHANISM
    for mechanism in SCRAM_MECHANISMS:
        key = f"listener.name.sasl_ssl.{mechanism.lower()}.sasl.jaas.config"
        settings[key] = _jaas(ADMIN_USER, password)
    return settings


def server_properties(
    state_dir: Path,
    port: int,
    controller_port: int,
    version: str,
    overrides: Mapping[str, str] | None = None,
    *,
    credentials: Credentials | None = None,
    node_id: int = NODE_ID,
    voters: Mapping[int, int] | None = None,
) -> dict[str, str]:
    """One node's ``server.properties``; ``state_dir`` is the node's dir (``data/`` in it).

    ``voters`` maps every controller's node id to its controller port (default: this
    node alone); more than one makes a replicated cluster.  ``credentials`` secure it.
    """
    voters = dict(voters or {node_id: controller_port})
    security = credentials.security if credentials is not None else "plaintext"
    listener = listener_name(security)
    controller_protocol = "PLAINTEXT" if security == "plaintext" else "SSL"
    settings = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": ",".join(
            f"{node}@{HOST}:{voters[node]}" for node in sorted(voters)
        ),
        "listeners": f"{listener}://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"{listener}://{HOST}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": listener,
        "listener.security.protocol.map": f"CONTROLLER:{controller_protocol},{listener}:{listener}",
        "log.dirs": str(state_dir / "data"),
        **BROKER_SETTINGS,
        **_LOCAL_SETTINGS,
    }
    if _major(version) >= 4:
        settings["share.coordinator.state.topic.replication.factor"] = "1"
        settings["share.coordinator.state.topic.min.isr"] = "1"
    settings.update(_replication_settings(len(voters), version))
    settings.update(security_properties(credentials))
    settings.update(overrides or {})
    return settings


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, readable by this user only (mode 0600)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _write_properties(path: Path, settings: Mapping[str, str]) -> None:
    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace("\n", "\\n")

    lines = ["# generated by tickwheel scripts/kafka_local.py; rewritten on every start"]
    lines += [f"{key}={escape(value)}" for key, value in settings.items()]
    _write_private(path, "\n".join(lines) + "\n")  # a SASL broker's holds a password


def _cluster_id() -> str:
    # As Kafka's own Uuid.randomUuid: an id starting with "-" would be read as an option
    # by kafka-storage (about one start in 64 failed with "expected one argument").
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


def scram_arguments(credentials: Credentials | None) -> list[str]:
    """``kafka-storage format`` options that create the SCRAM users (SASL_SSL only)."""
    if credentials is None or credentials.security != "sasl_ssl":
        return []
    arguments: list[str] = []
    for mechanism in SCRAM_MECHANISMS:
        for user in USERS:
            password = credentials.passwords[user]
            arguments += ["--add-scram", f"{mechanism}=[name={user},password={password}]"]
    return arguments


def _format_command(
    java: str,
    libs: Path,
    node_dir: Path,
    props: Path,
    version: str,
    cluster_id: str,
    credentials: Credentials | None,
) -> list[str]:
    _, log_prop = _logging_config(node_dir, version, tool=True)
    return [
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
        *scram_arguments(credentials),
    ]


def _format_storage(
    java: str,
    libs: Path,
    state_dir: Path,
    props: Path,
    version: str,
    cluster_id: str,
    credentials: Credentials | None = None,
) -> None:
    """Wipe ``data/`` and format it anew for ``cluster_id`` (an empty broker)."""
    _format_nodes(java, libs, [(state_dir, props)], version, cluster_id, credentials)


def _format_nodes(
    java: str,
    libs: Path,
    nodes: Sequence[tuple[Path, Path]],
    version: str,
    cluster_id: str,
    credentials: Credentials | None,
) -> None:
    """Wipe each (node dir, properties)'s ``data/`` and format it, all at once."""
    running: list[tuple[Path, subprocess.Popen[str]]] = []
    try:
        for node_dir, props in nodes:
            shutil.rmtree(node_dir / DATA, ignore_errors=True)
            command = _format_command(java, libs, node_dir, props, version, cluster_id, credentials)
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            running.append((node_dir, process))
        failures: list[str] = []
        for node_dir, process in running:
            output, _ = process.communicate()
            if process.returncode != 0:
                failures.append(f"{node_dir} (exit {process.returncode}):\n{output}")
        if failures:
            raise BrokerError("formatting KRaft storage failed: " + "\n".join(failures))
    finally:
        for _, process in running:
            if process.poll() is None:
                process.kill()
                process.wait()


# --------------------------------------------------------------------------- credentials

_OPENSSL_CONFIG = """\
# generated by tickwheel scripts/kafka_local.py: the extensions of its certificates
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[broker]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth,clientAuth
subjectAltName = DNS:localhost,IP:127.0.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""


@dataclass(frozen=True)
class TlsFiles:
    """The certificates of a state dir (``tls/``): PEM files, private keys mode 0600."""

    directory: Path

    @property
    def ca(self) -> Path:
        """The CA certificate: every client's (and broker's) trust store."""
        return self.directory / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def broker_keystore(self) -> Path:
        """The brokers' key, certificate and CA (``ssl.keystore.type=PEM``)."""
        return self.directory / "broker.pem"

    def cert(self, user: str) -> Path:
        """``user``'s client certificate (``CN=user``: the principal ``User:user``)."""
        return self.directory / f"{user}.crt"

    def key(self, user: str) -> Path:
        return self.directory / f"{user}.key"

    def complete(self) -> bool:
        paths = [self.ca, self.ca_key, self.broker_keystore]
        paths += [self.cert(user) for user in USERS] + [self.key(user) for user in USERS]
        return all(path.is_file() for path in paths)


def tls_files(state_dir: Path) -> TlsFiles:
    return TlsFiles(Path(state_dir) / TLS)


def password_file(state_dir: Path, user: str) -> Path:
    """The file holding ``user``'s generated password (no trailing newline)."""
    return Path(state_dir) / SECRETS / f"{user}.password"


def read_password(state_dir: Path, user: str) -> str | None:
    try:
        return password_file(state_dir, user).read_text().strip() or None
    except OSError:
        return None


@dataclass(frozen=True)
class Credentials:
    """A secured broker's certificates and users, kept in its state dir across starts."""

    state_dir: Path
    security: str
    passwords: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def tls(self) -> TlsFiles:
        return tls_files(self.state_dir)


def _openssl(directory: Path, *arguments: str) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise BrokerError(
            "openssl is not on PATH: it is needed once to make the TLS certificates of a "
            "secured broker (apt-get install openssl)"
        )
    result = subprocess.run(
        [openssl, *arguments],
        cwd=directory,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise BrokerError(f"openssl {shlex.join(arguments)} failed:\n{result.stderr}")


def make_tls(directory: Path) -> TlsFiles:
    """Make a CA, the brokers' certificate and a client certificate per user in ``directory``.

    With the machine's ``openssl``: RSA 2048 keys (PKCS#8 PEM, mode 0600), certificates
    valid for :data:`CERT_DAYS` days; the brokers' for ``localhost`` and ``127.0.0.1``
    (servers and clients both: brokers and controllers talk TLS to each other).  Written
    to a temporary dir first: ``directory`` holds a complete set or none.
    """
    directory = Path(directory)
    staging = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(mode=0o700, parents=True)
    try:
        conf = "openssl.cnf"
        (staging / conf).write_text(_OPENSSL_CONFIG)
        days = str(CERT_DAYS)

        def run(command: str) -> None:
            _openssl(staging, *shlex.split(command))

        def key(name: str) -> None:
            run(f"genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out {name}.key")
            os.chmod(staging / f"{name}.key", 0o600)

        def sign(name: str, common_name: str, section: str) -> None:
            key(name)
            run(f"req -new -key {name}.key -out {name}.csr -subj /CN={common_name} -config {conf}")
            serial = "0x" + secrets.token_hex(16)
            run(
                f"x509 -req -in {name}.csr -CA ca.pem -CAkey ca.key -set_serial {serial} "
                f"-days {days} -out {name}.crt -extfile {conf} -extensions {section}"
            )
            (staging / f"{name}.csr").unlink()

        key("ca")
        run(
            f"req -x509 -new -key ca.key -out ca.pem -days {days} "
            f"-subj '/CN=tickwheel kafka-local CA' -config {conf} -extensions ca"
        )
        sign("broker", BROKER_PRINCIPAL, "broker")
        for user in USERS:
            sign(user, user, "client")
        chain = [staging / "broker.key", staging / "broker.crt", staging / "ca.pem"]
        _write_private(staging / "broker.pem", "".join(path.read_text() for path in chain))
        (staging / "broker.key").unlink()
        shutil.rmtree(directory, ignore_errors=True)
        staging.rename(directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return TlsFiles(directory)


def ensure_credentials(state_dir: Path, security: str, *, keep: bool) -> Credentials | None:
    """The state dir's certificates and passwords for ``security``, made on first use.

    Kept across starts and ``--fresh`` (clients keep their CA file and passwords).  A
    SASL_SSL broker whose data is kept (``keep``) must find the passwords its SCRAM users
    were formatted with: missing ones are an error, not new ones.
    """
    if security not in SECURITY_PROTOCOLS:
        raise BrokerError(f"security must be one of {', '.join(SECURITY_PROTOCOLS)}")
    if security == "plaintext":
        return None
    state = Path(state_dir)
    tls = tls_files(state)
    if not tls.complete():
        _say(f"making a CA and certificates in {tls.directory}")
        make_tls(tls.directory)
    passwords: dict[str, str] = {}
    if security == "sasl_ssl":
        (state / SECRETS).mkdir(mode=0o700, exist_ok=True)
        for user in USERS:
            password = read_password(state, user)
            if password is None:
                if keep:
                    raise BrokerError(
                        f"{password_file(state, user)} is missing, but the broker's data "
                        "(with its SCRAM users) is kept: restore it, or `start --fresh`"
                    )
                password = secrets.token_urlsafe(18)
                _write_private(password_file(state, user), password)
            passwords[user] = password
    return Credentials(state, security, passwords)


def read_credentials(state_dir: Path, security: str) -> Credentials | None:
    """The credentials a broker of ``security`` in ``state_dir`` was started with (no new ones)."""
    if security == "plaintext":
        return None
    state = Path(state_dir)
    passwords = {user: pw for user in USERS if (pw := read_password(state, user)) is not None}
    return Credentials(state, security, passwords)


def client_auth(credentials: Credentials | None, user: str = ADMIN_USER) -> ClientAuth | None:
    """How ``user`` connects to a broker with ``credentials`` (None: PLAINTEXT)."""
    if credentials is None or credentials.security == "plaintext":
        return None
    tls = credentials.tls
    if credentials.security == "ssl":
        return ClientAuth("SSL", tls.ca, certfile=tls.cert(user), keyfile=tls.key(user))
    return ClientAuth("SASL_SSL", tls.ca, username=user, password=credentials.passwords.get(user))


def client_settings(
    state_dir: Path, security: str, bootstrap: str, user: str = ADMIN_USER
) -> dict[str, str]:
    """Every ``KAFKA_*`` variable a client needs to reach the broker as ``user``.

    ``KAFKA_BOOTSTRAP_SERVERS`` always; for a secured broker ``KAFKA_SECURITY_PROTOCOL``
    and ``KAFKA_SSL_CAFILE``, then the client certificate (``KAFKA_SSL_CERTFILE``,
    ``KAFKA_SSL_KEYFILE``: SSL) or the SCRAM user (``KAFKA_SASL_MECHANISM``,
    ``KAFKA_SASL_USERNAME``, ``KAFKA_SASL_PASSWORD_FILE``: SASL_SSL).
    """
    if user not in USERS:
        raise BrokerError(f"unknown user {user!r}: the users are {', '.join(USERS)}")
    settings = {"KAFKA_BOOTSTRAP_SERVERS": bootstrap}
    if security == "plaintext":
        if user != ADMIN_USER:
            raise BrokerError("a PLAINTEXT broker has no users (start it with --security)")
        return settings
    tls = tls_files(Path(state_dir))
    settings["KAFKA_SECURITY_PROTOCOL"] = listener_name(security)
    if security == "sasl_ssl":
        settings["KAFKA_SASL_MECHANISM"] = SASL_MECHANISM
        settings["KAFKA_SASL_USERNAME"] = user
        settings["KAFKA_SASL_PASSWORD_FILE"] = str(password_file(Path(state_dir), user))
    settings["KAFKA_SSL_CAFILE"] = str(tls.ca)
    if security == "ssl":
        settings["KAFKA_SSL_CERTFILE"] = str(tls.cert(user))
        settings["KAFKA_SSL_KEYFILE"] = str(tls.key(user))
    return settings


def env_lines(settings: Mapping[str, str]) -> list[str]:
    """``export NAME=value`` lines for ``eval``."""
    return [f"export {name}={shlex.quote(value)}" for name, value in settings.items()]


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


def _clear_state_files(state_dir: Path, pid: int | None = None) -> None:
    if pid is not None and _read_pid(state_dir) not in (None, pid):
        return  # someone else's broker by now
    for name in (PIDFILE, INFOFILE):
        with contextlib.suppress(FileNotFoundError):
            (state_dir / name).unlink()


def _kill(pid: int) -> None:
    if not _alive(pid):
        return
    _signal_group(pid, signal.SIGKILL)
    if not _wait_gone(pid, 10.0):
        raise BrokerError(f"broker pid {pid} survived SIGKILL")


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


def _jvm_argv(
    java: str, libs: Path, node_dir: Path, version: str, jvm_opts: Sequence[str]
) -> list[str]:
    _, log_prop = _logging_config(node_dir, version, tool=False)
    extra = shlex.split(os.environ.get("TICKWHEEL_KAFKA_JVM_OPTS", ""))
    props = node_dir / "server.properties"
    return [java, *jvm_opts, *extra, log_prop, "-cp", str(libs / "*"), "kafka.Kafka", str(props)]


def _launch(java: str, libs: Path, node_dir: Path, version: str, jvm_opts: Sequence[str]) -> int:
    """Spawn the broker JVM of ``node_dir`` (its server.properties written); its pid."""
    pid = _spawn(_jvm_argv(java, libs, node_dir, version, jvm_opts), node_dir / LOGFILE)
    (node_dir / PIDFILE).write_text(f"{pid}\n")
    return pid


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
) -> Broker | None:
    """One start attempt: the Broker, or None when the ports were taken meanwhile.

    Formats the storage first for ``format_cluster`` (None: keep ``data/`` as it is).
    """
    props = state / "server.properties"
    settings = server_properties(
        state, port, controller_port, version, overrides, credentials=credentials
    )
    _write_properties(props, settings)
    if format_cluster is not None:
        _format_storage(java, libs, state, props, version, format_cluster, credentials)
    bootstrap = f"{HOST}:{port}"
    pid = _launch(java, libs, state, version, JVM_OPTS)
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


# --------------------------------------------------------------------------- clusters


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


def _check_nodes(nodes: int) -> None:
    if not 1 <= nodes <= MAX_NODES:
        raise BrokerError(f"--brokers must be from 1 to {MAX_NODES}, not {nodes}")


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


def cluster_properties(
    state_dir: Path,
    ports: Sequence[tuple[int, int]],
    version: str,
    overrides: Mapping[str, str] | None = None,
    *,
    credentials: Credentials | None = None,
) -> dict[int, dict[str, str]]:
    """Each node's ``server.properties`` of a cluster on ``ports`` (node 1 first)."""
    voters = {node: controller for node, (_, controller) in enumerate(ports, start=1)}
    return {
        node: server_properties(
            node_dir(state_dir, node),
            client,
            controller,
            version,
            overrides,
            credentials=credentials,
            node_id=node,
            voters=voters,
        )
        for node, (client, controller) in enumerate(ports, start=1)
    }


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


def _node_pid(state_dir: Path, node: int) -> int | None:
    directory = node_dir(state_dir, node)
    pid = _read_pid(directory)
    return pid if pid is not None and _is_broker(pid, directory) else None


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


def _remembered_cluster(state: Path, node: int | None = None) -> Remembered:
    remembered = read_remembered(state)
    if remembered.nodes < 2 or len(remembered.node_ports) != remembered.nodes:
        raise BrokerError(f"no cluster in {state}: start one with `start --brokers 3`")
    if _cluster_formatted(state, remembered.nodes) is None:
        raise BrokerError(f"the cluster in {state} was never formatted: use `start`")
    if node is not None and not 1 <= node <= remembered.nodes:
        raise BrokerError(f"no node {node} in {state}: its nodes are 1 to {remembered.nodes}")
    return remembered


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


def restart_node(
    state_dir: Path | str | None, node: int, *, timeout: float = DEFAULT_START_TIMEOUT
) -> Broker:
    """Stop node ``node`` (if it runs) and start it again."""
    stop_node(state_dir, node)
    return start_node(state_dir, node, timeout=timeout)


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
    return killed


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


def grant(
    state_dir: Path | str | None,
    user: str,
    resource_type: str,
    name: str,
    operations: Sequence[str],
    *,
    pattern: str = "literal",
    timeout: float = 15.0,
) -> list[Acl]:
    """Allow ``user`` ``operations`` on a resource of the secured broker in ``state_dir``.

    As the super user, through the first running node; returns once every running node
    applies the new ACLs (DescribeAcls lists them).  ``resource_type``: ``topic``,
    ``group``, ``transactional_id`` or ``cluster`` (whose ``name`` is ignored);
    ``pattern``: ``literal`` or ``prefixed``.
    """
    state = Path(state_dir or default_state_dir()).absolute()
    remembered = read_remembered(state)
    if remembered.security == "plaintext":
        raise BrokerError(f"the broker in {state} is PLAINTEXT: it has no ACLs (--security)")
    principal = user if ":" in user else f"User:{user}"
    resource = CLUSTER_RESOURCE if resource_type == "cluster" else name
    acls = [Acl(principal, resource_type, resource, op.lower(), pattern) for op in operations]
    if not acls:
        raise BrokerError("grant needs at least one operation")
    auth = client_auth(read_credentials(state, remembered.security))
    if remembered.nodes > 1:
        addresses = [s.bootstrap for s in cluster_status(state) if s.answering]
    else:
        current = status(state)
        addresses = [current.bootstrap] if current.answering and current.bootstrap else []
    if not addresses:
        raise BrokerError(f"no broker answers in {state}")
    create_acls(addresses[0], auth, acls)
    deadline = time.monotonic() + timeout
    for address in addresses:
        while not set(acls) <= set(describe_acls(address, auth)):
            if time.monotonic() >= deadline:
                raise BrokerError(f"{address} does not apply the new ACLs after {timeout:g} s")
            time.sleep(0.05)
    return acls


# --------------------------------------------------------------------------- admin tools
#
# The jars ship no bin/ scripts: ``kafka-acls.sh`` is written for the broker in a state dir
# (``env`` prints the PATH line that finds it), with ``admin.properties``, the super user's
# client config for its ``--command-config``.

BIN = "bin"
ADMIN_PROPERTIES = "admin.properties"
ACL_COMMAND = {3: "kafka.admin.AclCommand", 4: "org.apache.kafka.tools.AclCommand"}
"""kafka-acls' main class: in the core jar up to 3.x, in ``kafka-tools`` (not fetched here)
from 4.0."""


def admin_properties(state_dir: Path, security: str) -> dict[str, str]:
    """The Java client settings of the super user (``--command-config`` of Kafka's tools)."""
    state = Path(state_dir)
    tls = tls_files(state)
    settings = {
        "security.protocol": listener_name(security),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(tls.ca),
    }
    if security == "ssl":
        settings["ssl.keystore.type"] = "PEM"
        settings["ssl.keystore.location"] = str(tls.directory / f"{ADMIN_USER}.keystore.pem")
        return settings
    password = read_password(state, ADMIN_USER)
    if password is None:
        raise BrokerError(f"no password for {ADMIN_USER} in {state / SECRETS}")
    settings["sasl.mechanism"] = SASL_MECHANISM
    settings["sasl.jaas.config"] = _jaas(ADMIN_USER, password)
    return settings


def _has_class(libs: Path, main_class: str) -> bool:
    entry = main_class.replace(".", "/") + ".class"
    for jar in sorted(libs.glob("kafka*.jar")):
        with contextlib.suppress(OSError, zipfile.BadZipFile), zipfile.ZipFile(jar) as archive:
            if entry in archive.namelist():
                return True
    return False


def write_admin_tools(state_dir: Path | str, security: str, version: str) -> Path:
    """Write ``bin/kafka-acls.sh`` and ``admin.properties`` (secured brokers: mode 0600) in
    ``state_dir``; return the ``bin`` folder.  On a version whose jars here lack the
    command (4.x: ``kafka-tools``), the script says so and exits 1."""
    state = Path(state_dir)
    if security != "plaintext":
        if security == "ssl":
            tls = tls_files(state)
            pieces = [tls.key(ADMIN_USER), tls.cert(ADMIN_USER), tls.ca]
            _write_private(
                tls.directory / f"{ADMIN_USER}.keystore.pem",
                "".join(path.read_text() for path in pieces),
            )
        lines = [f"{k}={v}" for k, v in admin_properties(state, security).items()]
        _write_private(state / ADMIN_PROPERTIES, "\n".join(lines) + "\n")
    libs = ensure_jars(version)
    main_class = ACL_COMMAND[min(max(_major(version), 3), 4)]
    bin_dir = state / BIN
    bin_dir.mkdir(exist_ok=True)
    if _has_class(libs, main_class):
        _, log_prop = _logging_config(state, version, tool=True)
        argv = [_java(), *_TOOL_JVM_OPTS, log_prop, "-cp", str(libs / "*"), main_class]
        body = f'exec {shlex.join(argv)} "$@"'
    else:
        said = (
            f"kafka-acls.sh: Apache Kafka {version}'s {main_class} is in the kafka-tools jar, "
            f"which kafka-local does not fetch ({libs}): use Kafka 3.9 "
            "(TICKWHEEL_KAFKA_VERSION) or a Kafka distribution's bin/kafka-acls.sh"
        )
        body = f"echo {shlex.quote(said)} >&2\nexit 1"
    script = bin_dir / "kafka-acls.sh"
    temporary = script.with_name(script.name + ".tmp")
    temporary.write_text(
        "#!/bin/sh\n# Apache Kafka's kafka-acls from the jars the local broker runs "
        f"(written by scripts/kafka-local for {state}).\n{body}\n"
    )
    temporary.chmod(0o755)
    os.replace(temporary, script)
    return bin_dir


def tool_env_lines(state_dir: Path, security: str, version: str) -> list[str]:
    """``env``'s lines for Kafka's tools: ``kafka-acls.sh`` on PATH and, secured, the super
    user's ``KAFKA_ADMIN_PROPERTIES`` for its ``--command-config``."""
    bin_dir = write_admin_tools(state_dir, security, version)
    lines = [f'export PATH={shlex.quote(str(bin_dir))}:"$PATH"']
    if security != "plaintext":
        admin = shlex.quote(str(Path(state_dir) / ADMIN_PROPERTIES))
        lines.append(f"export KAFKA_ADMIN_PROPERTIES={admin}")
    return lines


# --------------------------------------------------------------------------- CLI


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


_DESCRIPTION = """\
Run a local Apache Kafka (KRaft) from Apache Kafka's own jars, without Docker: one node,
or a cluster of several (--brokers 3); PLAINTEXT, or secured (--security ssl|sasl_ssl:
TLS, SCRAM users and ACLs).  It keeps its data in the state dir between starts, like a
real one: `start` again serves the same topics, records and committed offsets on the same
address; `start --fresh` wipes them for an empty broker."""

_EPILOG = """\
examples:
  kafka-local start                      # start (or keep running); last stdout line: address
  eval "$(kafka-local env)"              # export KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:PORT
  kafka-local restart                    # stop + start: same data, same address
  kafka-local start --fresh              # an empty broker (wipes the data)
  kafka-local stop                       # stop; the data stays for the next start

  kafka-local start --fresh --security sasl_ssl   # SCRAM-SHA-512 over TLS, ACLs enforced
  eval "$(kafka-local env)"              # + KAFKA_SECURITY_PROTOCOL, KAFKA_SASL_*, KAFKA_SSL_*
  eval "$(kafka-local env --user tickwheel)"      # the user without ACLs
  kafka-local grant --topic orders --operation read --operation describe

  kafka-local start --fresh --brokers 3  # three nodes (3 JVMs); address: all three
  kafka-local kill --node 2              # SIGKILL one node; `start --node 2` brings it back
  kafka-local status                     # one line per node

exit codes: 0 ok, 1 error (or broker unresponsive, or a node down), 3 not running."""


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
        help="state dir: settings, data/, broker.log, tls/, secrets/ "
        "(default ${TICKWHEEL_STATE:-/tmp/tickwheel-kafka})",
    )
    node = argparse.ArgumentParser(add_help=False)
    node.add_argument(
        "--node",
        type=int,
        default=None,
        metavar="N",
        help="only node N (1, 2, ...) of a cluster (--brokers); a single broker is node 1",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    start_cmd = commands.add_parser(
        "start",
        parents=[common, node],
        help="start the broker, keeping its data and address (--fresh: empty), and wait",
        description="Start the broker and wait until it answers; print its address "
        "(127.0.0.1:PORT, every node's for a cluster) as the last line on stdout.  A state "
        "dir that held a broker before keeps its data, cluster id, port, --brokers and "
        "--security (an error if that port is taken by something else); a broker already "
        "running there is left alone (a cluster's stopped nodes are started).  --node N "
        "starts one node of a cluster again.",
    )
    start_cmd.add_argument(
        "--fresh",
        action="store_true",
        help="wipe the data and format anew: an empty broker with a new cluster id "
        "(stops a running one first); it keeps the remembered port if that is free, "
        "and the certificates and passwords",
    )
    start_cmd.add_argument(
        "--port",
        type=int,
        default=None,
        help="client port (node N of a cluster: PORT+N-1; default: the one remembered in "
        "the state dir, else a free one); remembered for later starts",
    )
    start_cmd.add_argument(
        "--security",
        choices=SECURITY_PROTOCOLS,
        default=None,
        help="plaintext; ssl (TLS, client certificates required); sasl_ssl (SCRAM-SHA-512 "
        "and -256 over TLS); ssl and sasl_ssl enforce ACLs (super user admin, user "
        "tickwheel with none).  Default: the remembered one, at first plaintext",
    )
    start_cmd.add_argument(
        "--brokers",
        type=int,
        default=None,
        metavar="N",
        help="nodes (each broker and controller, its own JVM with a 256 MiB heap; with 3, "
        "replication factor 3 and min.insync.replicas=2).  Default: the remembered "
        "count, at first 1",
    )
    start_cmd.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"seconds to wait for it (default {DEFAULT_START_TIMEOUT:g}, "
        f"{DEFAULT_CLUSTER_START_TIMEOUT:g} for a cluster)",
    )
    start_cmd.add_argument("--kafka-version", default=None, help=f"default {KAFKA_VERSION}")
    start_cmd.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="broker setting for this start (and its restarts; every node); repeatable",
    )
    restart_cmd = commands.add_parser(
        "restart",
        parents=[common, node],
        help="stop and start again: same data, same address",
        description="Stop the broker (if it runs) and start it again on the same state dir "
        "and port, keeping its data, Kafka version, security and --set settings; print its "
        "address as the last line on stdout.  For trying recovery after a broker outage.  "
        "--node N: only that node of a cluster.",
    )
    restart_cmd.add_argument("--timeout", type=float, default=None, help="seconds to wait for it")
    stop_cmd = commands.add_parser(
        "stop",
        parents=[common, node],
        help="stop the broker (its data stays for the next start)",
        description="SIGTERM the broker (every node of a cluster at once, or --node N), "
        "SIGKILL after --timeout seconds.  The data stays in the state dir for the next start.",
    )
    stop_cmd.add_argument("--timeout", type=float, default=DEFAULT_STOP_TIMEOUT)
    commands.add_parser(
        "kill",
        parents=[common, node],
        help="SIGKILL the broker or one node (a crash; the data stays)",
        description="SIGKILL the broker's process group (every node, or --node N): no "
        "clean shutdown, as a crash.  The data stays; `start` (--node N) brings it back.",
    )
    commands.add_parser(
        "status",
        parents=[common],
        help="running/stopped and the address (each node of a cluster)",
        description="Print `running 127.0.0.1:PORT ...` (exit 0), `unresponsive ...` "
        "(exit 1) or `stopped` (exit 3); for a cluster a summary line (`running`, "
        "`degraded` when a node is down, exit 1) and a line per node.",
    )
    env_cmd = commands.add_parser(
        "env",
        parents=[common],
        help="print the `export KAFKA_...=...` lines for eval",
        description="Print `export KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:PORT` for the running "
        'broker, for `eval "$(scripts/kafka-local env)"`; for a secured one also '
        "KAFKA_SECURITY_PROTOCOL, KAFKA_SSL_CAFILE and KAFKA_SSL_CERTFILE/KAFKA_SSL_KEYFILE "
        "(ssl) or KAFKA_SASL_MECHANISM/KAFKA_SASL_USERNAME/KAFKA_SASL_PASSWORD_FILE "
        "(sasl_ssl), with PATH leading to Kafka's kafka-acls.sh (written in DIR/bin) and "
        "KAFKA_ADMIN_PROPERTIES, the super user's --command-config.  Exit 3 (nothing on "
        "stdout) if it is stopped.",
    )
    env_cmd.add_argument(
        "--user",
        choices=USERS,
        default=ADMIN_USER,
        help=f"a secured broker's user (default {ADMIN_USER}, the super user; "
        f"{APP_USER} has only the ACLs granted to it)",
    )
    grant_cmd = commands.add_parser(
        "grant",
        parents=[common],
        help="allow a user operations on a topic, group, transactional id or the cluster",
        description="Create ALLOW ACLs on a secured broker (as the super user) and wait "
        "until every node applies them.",
    )
    grant_cmd.add_argument("--user", default=APP_USER, help=f"default {APP_USER}")
    resource = grant_cmd.add_mutually_exclusive_group(required=True)
    resource.add_argument("--topic", metavar="NAME")
    resource.add_argument("--group", metavar="NAME")
    resource.add_argument("--transactional-id", metavar="NAME")
    resource.add_argument("--cluster", action="store_true")
    grant_cmd.add_argument(
        "--prefixed", action="store_true", help="NAME is a prefix (default: the exact name)"
    )
    grant_cmd.add_argument(
        "--operation",
        action="append",
        required=True,
        type=lambda text: text.lower().replace("-", "_"),
        choices=sorted(OPERATIONS),
        help="repeatable",
    )
    fetch_cmd = commands.add_parser("fetch", help="only resolve the jars; print their folder")
    fetch_cmd.add_argument("--kafka-version", default=None, help=f"default {KAFKA_VERSION}")
    return parser


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


if __name__ == "__main__":
    sys.exit(main())
