"""The real Apache Kafka broker for the test session, and topic helpers.

Where the broker comes from, first match wins:

1. ``KAFKA_BOOTSTRAP_SERVERS`` set: that broker (it must have
   ``auto.create.topics.enable=false``-proof tests in mind: topics are always created
   explicitly here, so either setting works);
2. a Docker engine answers (``docker info`` within 3 s) and ``TICKWHEEL_BROKER`` is not
   ``local``: the official ``apache/kafka`` image (KRaft) through testcontainers;
3. otherwise ``scripts/kafka_local.py``: Apache Kafka's own jars from Maven Central, run
   with the machine's Java (``TICKWHEEL_BROKER=local`` forces this).

2 and 3 run ``TICKWHEEL_KAFKA_VERSION`` (default: the pinned ``kafka_local.KAFKA_VERSION``),
as do the tests that start brokers of their own through ``kafka_local.start``.

A broker that cannot start raises :class:`BrokerUnavailable`; tests are never skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
KAFKA_LOCAL = ROOT / "scripts" / "kafka_local.py"


class BrokerUnavailable(RuntimeError):
    """No real Kafka broker could be had for the tests."""


def load_kafka_local() -> ModuleType:
    """Import ``scripts/kafka_local.py`` (a script, not a package) by its path."""
    name = "tickwheel_kafka_local"
    module = sys.modules.get(name)
    if module is not None:
        return module
    spec = importlib.util.spec_from_file_location(name, KAFKA_LOCAL)
    if spec is None or spec.loader is None:
        raise BrokerUnavailable(f"cannot load {KAFKA_LOCAL}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


# --------------------------------------------------------------------------- broker


def docker_available(timeout: float = 3.0) -> bool:
    """Whether a Docker engine answers, within ``timeout`` seconds, silently."""
    docker = shutil.which("docker")
    if docker is None:
        return False
    try:
        result = subprocess.run(
            [docker, "info", "--format", "{{.ServerVersion}}"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0 and bool(result.stdout.strip())


@contextlib.contextmanager
def bootstrap_servers() -> Iterator[str]:
    """Yield a bootstrap address of a real broker for the whole session; stop it after."""
    given = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    if given:
        yield given
        return
    choice = os.environ.get("TICKWHEEL_BROKER", "auto").strip().lower()
    if choice not in ("auto", "docker", "local"):
        raise BrokerUnavailable(f"TICKWHEEL_BROKER must be auto, docker or local, not {choice!r}")
    if choice == "docker" or (choice == "auto" and docker_available()):
        with _docker_broker() as bootstrap:
            yield bootstrap
    else:
        with _local_broker() as bootstrap:
            yield bootstrap


@contextlib.contextmanager
def _local_broker() -> Iterator[str]:
    kafka_local = load_kafka_local()
    state_dir = Path(f"{kafka_local.default_state_dir()}-pytest")
    temporary: Path | None = None
    try:
        try:
            broker = kafka_local.start(state_dir)
        except kafka_local.BrokerError as exc:
            if "in use by another live process" not in str(exc):
                raise
            # Another test session owns the usual dir: run a second broker beside it.
            temporary = Path(tempfile.mkdtemp(prefix="tickwheel-kafka-"))
            broker = kafka_local.start(temporary)
    except kafka_local.BrokerError as exc:
        raise BrokerUnavailable(f"could not start the local Apache Kafka broker: {exc}") from exc
    try:
        yield str(broker.bootstrap)
    finally:
        broker.stop()
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)


def _docker_settings(host_port: int) -> dict[str, str]:
    """The apache/kafka image's KAFKA_* variables for a single KRaft node."""
    kafka_local = load_kafka_local()
    host = "127.0.0.1"
    docker_host = os.environ.get("DOCKER_HOST", "")
    if docker_host.startswith(("tcp://", "ssh://")):
        host = urlparse(docker_host).hostname or host
    settings: dict[str, str] = {
        "node.id": "1",
        "process.roles": "broker,controller",
        "listeners": "PLAINTEXT://:9092,CONTROLLER://:9093",
        "advertised.listeners": f"PLAINTEXT://{host}:{host_port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "controller.quorum.voters": "1@localhost:9093",
        **kafka_local.BROKER_SETTINGS,
    }
    env = {"KAFKA_" + key.upper().replace(".", "_"): value for key, value in settings.items()}
    env["TICKWHEEL_BOOTSTRAP"] = f"{host}:{host_port}"
    return env


def docker_image() -> str:
    """``TICKWHEEL_KAFKA_IMAGE``, else ``apache/kafka`` of the version the local broker runs."""
    version = load_kafka_local().kafka_version()
    return os.environ.get("TICKWHEEL_KAFKA_IMAGE") or f"apache/kafka:{version}"


@contextlib.contextmanager
def _docker_broker() -> Iterator[str]:
    from testcontainers.core.container import DockerContainer

    kafka_local = load_kafka_local()
    image = docker_image()
    host_port = kafka_local.free_port()
    env = _docker_settings(host_port)
    bootstrap = env.pop("TICKWHEEL_BOOTSTRAP")
    container: Any = None
    try:
        container = DockerContainer(image).with_bind_ports(9092, host_port)
        for key, value in env.items():
            container = container.with_env(key, value)
        container.start()
    except Exception as exc:
        if container is not None:
            with contextlib.suppress(Exception):
                container.stop()
        raise BrokerUnavailable(f"could not start the {image} container: {exc}") from exc
    try:
        try:
            kafka_local.wait_until_ready(bootstrap, timeout=180.0)
        except kafka_local.BrokerError as exc:
            stdout, stderr = container.get_logs()
            tail = "\n".join((stdout + stderr).decode(errors="replace").splitlines()[-40:])
            raise BrokerUnavailable(f"{image}: {exc}\n{tail}") from exc
        yield bootstrap
    finally:
        container.stop()


# --------------------------------------------------------------------------- topics


_TOPIC_CHARS = re.compile(r"[^a-zA-Z0-9._-]+")


def unique_topic(prefix: str = "t") -> str:
    """A topic name no other test (or earlier run against the same broker) uses."""
    clean = _TOPIC_CHARS.sub("-", prefix).strip("-.") or "t"
    return f"{clean[:200]}-{uuid.uuid4().hex[:10]}"


async def create_topics(
    bootstrap: str,
    names: Sequence[str],
    partitions: int = 1,
    *,
    configs: Mapping[str, str] | None = None,
    wait_seconds: float = 30.0,
) -> None:
    """Create ``names`` (replication factor 1) and wait until every partition has a leader.

    A topic that already exists with the same partition count is fine.
    """
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError, for_code

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    await admin.start()
    try:
        response = await admin.create_topics(
            [NewTopic(name, partitions, 1, topic_configs=dict(configs or {})) for name in names]
        )
        for topic, code, *rest in response.topic_errors:
            if code not in (0, TopicAlreadyExistsError.errno):
                message = rest[0] if rest else ""
                raise RuntimeError(f"creating topic {topic}: {for_code(code).__name__} {message}")
        deadline = time.monotonic() + wait_seconds
        while True:
            described: list[dict[str, Any]] = await admin.describe_topics(list(names))
            pending = [t["topic"] for t in described if not _topic_ready(t, partitions)]
            pending += sorted(set(names) - {t["topic"] for t in described})
            if not pending:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"topics without leaders after {wait_seconds:.0f} s: {pending}")
            await asyncio.sleep(0.1)
    finally:
        await admin.close()


def _topic_ready(topic: Mapping[str, Any], partitions: int) -> bool:
    parts = topic.get("partitions") or []
    if topic.get("error_code", 0) != 0:
        return False
    return len(parts) == partitions and all(
        p.get("error_code", 0) == 0 and p.get("leader", -1) >= 0 for p in parts
    )


class TopicFactory:
    """``await topics(partitions=4)`` creates a fresh, uniquely named topic; returns its name."""

    def __init__(self, bootstrap: str, prefix: str = "t") -> None:
        self.bootstrap = bootstrap
        self.prefix = prefix
        self.created: list[str] = []

    async def __call__(
        self,
        partitions: int = 1,
        *,
        prefix: str | None = None,
        configs: Mapping[str, str] | None = None,
    ) -> str:
        name = unique_topic(prefix or self.prefix)
        await create_topics(self.bootstrap, [name], partitions, configs=configs)
        self.created.append(name)
        return name


# --------------------------------------------------------------------------- secured, cluster
#
# Always scripts/kafka_local.py (never Docker, never KAFKA_BOOTSTRAP_SERVERS): a broker with
# TLS, SCRAM users and ACLs, or a three-node cluster, started once per test session by the
# session fixtures that wrap these context managers (see test_kafka_local_secured.py).


def client_kwargs(settings: Mapping[str, str], **overrides: Any) -> dict[str, Any]:
    """aiokafka keyword arguments for the ``KAFKA_*`` variables that ``kafka-local env`` prints.

    ``KAFKA_BOOTSTRAP_SERVERS``, ``KAFKA_SECURITY_PROTOCOL``, ``KAFKA_SSL_CAFILE`` (and
    ``KAFKA_SSL_CERTFILE``/``KAFKA_SSL_KEYFILE``), ``KAFKA_SASL_MECHANISM``,
    ``KAFKA_SASL_USERNAME``, ``KAFKA_SASL_PASSWORD_FILE``; ``overrides`` win.
    """
    from aiokafka.helpers import create_ssl_context

    protocol = settings.get("KAFKA_SECURITY_PROTOCOL", "PLAINTEXT").upper()
    kwargs: dict[str, Any] = {
        "bootstrap_servers": settings["KAFKA_BOOTSTRAP_SERVERS"],
        "security_protocol": protocol,
    }
    if protocol in ("SSL", "SASL_SSL"):
        kwargs["ssl_context"] = create_ssl_context(
            cafile=settings["KAFKA_SSL_CAFILE"],
            certfile=settings.get("KAFKA_SSL_CERTFILE"),
            keyfile=settings.get("KAFKA_SSL_KEYFILE"),
        )
    if protocol.startswith("SASL_"):
        kwargs["sasl_mechanism"] = settings["KAFKA_SASL_MECHANISM"]
        kwargs["sasl_plain_username"] = settings["KAFKA_SASL_USERNAME"]
        password = Path(settings["KAFKA_SASL_PASSWORD_FILE"]).read_text().strip()
        kwargs["sasl_plain_password"] = password
    kwargs.update(overrides)
    return kwargs


_Started = TypeVar("_Started")


class SecuredKafka:
    """A local broker with ``--security`` (``sasl_ssl`` or ``ssl``), its users and ACLs.

    ``admin`` is a super user; ``tickwheel`` has no ACL until a test grants it some
    (:meth:`grant`: use topics, groups and transactional ids of the test's own names).
    """

    def __init__(self, broker: Any) -> None:
        self.broker = broker  # a kafka_local.Broker
        self.bootstrap: str = broker.bootstrap
        self.state_dir: Path = broker.state_dir
        self.security: str = broker.security

    def env(self, user: str = "admin") -> dict[str, str]:
        """The ``KAFKA_*`` variables for ``user``, as ``kafka-local env --user`` prints them."""
        settings: dict[str, str] = self.broker.client_settings(user)
        return settings

    def client_kwargs(self, user: str = "admin", **overrides: Any) -> dict[str, Any]:
        """aiokafka keyword arguments (producer, consumer, admin) to connect as ``user``."""
        return client_kwargs(self.env(user), **overrides)

    def oauth_env(self, user: str = "tickwheel") -> dict[str, str]:
        """The ``KAFKA_*`` variables to log in as ``user`` with OAUTHBEARER (``sasl_ssl``:
        the broker's token server), as ``kafka-local env --oauth --user`` prints them."""
        settings: dict[str, str] = load_kafka_local().oauth_client_settings(
            self.state_dir, self.bootstrap, user
        )
        return settings

    def password(self, user: str = "admin") -> str:
        password: str | None = load_kafka_local().read_password(self.state_dir, user)
        if password is None:
            raise BrokerUnavailable(f"no password for {user} in {self.state_dir}")
        return password

    def grant(
        self,
        resource_type: str,
        name: str,
        operations: Sequence[str],
        *,
        user: str = "tickwheel",
        pattern: str = "literal",
    ) -> None:
        """Allow ``user`` ``operations`` (``read``, ``write``, ``describe``, ...) on a
        ``topic``/``group``/``transactional_id``/``cluster``; returns once applied."""
        load_kafka_local().grant(
            self.state_dir, user, resource_type, name, operations, pattern=pattern
        )


def _start_in_own_dir(
    suffix: str, start: Callable[[Path], _Started]
) -> tuple[_Started, Path | None]:
    """``start`` in ``$TICKWHEEL_STATE-pytest-SUFFIX``, or in a temporary dir (returned, for
    removal) when another test session holds that one."""
    kafka_local = load_kafka_local()
    try:
        return start(Path(f"{kafka_local.default_state_dir()}-pytest-{suffix}")), None
    except kafka_local.BrokerError as exc:
        if "in use by another live process" not in str(exc):
            raise
    temporary = Path(tempfile.mkdtemp(prefix=f"tickwheel-kafka-{suffix}-"))
    try:
        return start(temporary), temporary
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise


@contextlib.contextmanager
def secured_kafka(security: str = "sasl_ssl") -> Iterator[SecuredKafka]:
    """A fresh local broker with ``security`` for the whole session; stopped after."""
    kafka_local = load_kafka_local()
    try:
        broker, temporary = _start_in_own_dir(
            security, lambda state: kafka_local.start(state, security=security)
        )
    except kafka_local.BrokerError as exc:
        raise BrokerUnavailable(f"could not start a {security} local broker: {exc}") from exc
    try:
        yield SecuredKafka(broker)
    finally:
        broker.stop()
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)


class KafkaCluster:
    """A local multi-node KRaft cluster (``kafka-local start --brokers 3``).

    Every node is broker and controller; replication factor 3 by default,
    ``min.insync.replicas=2``.  The node methods block (a start waits until the node
    serves again): call them through ``asyncio.to_thread`` from async tests.  A test that
    stops or kills a node starts it again before it ends (the cluster is the session's).
    """

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster  # a kafka_local.Cluster
        self.bootstrap: str = cluster.bootstrap
        self.state_dir: Path = cluster.state_dir
        self.nodes: list[int] = list(cluster.nodes)

    def node_bootstrap(self, node: int) -> str:
        address: str = self.cluster.node_bootstrap(node)
        return address

    def client_kwargs(self, **overrides: Any) -> dict[str, Any]:
        """aiokafka keyword arguments for the cluster (every node's address)."""
        return client_kwargs(self.cluster.client_settings(), **overrides)

    def kill_node(self, node: int) -> bool:
        """SIGKILL node ``node`` (``kafka-local kill --node N``); whether it was running."""
        killed: bool = self.cluster.kill_node(node)
        return killed

    def stop_node(self, node: int) -> bool:
        stopped: bool = self.cluster.stop_node(node)
        return stopped

    def start_node(self, node: int) -> None:
        """Start node ``node`` again and wait until it serves (``start --node N``)."""
        self.cluster.start_node(node)

    def running_nodes(self) -> list[int]:
        running: list[int] = self.cluster.running_nodes()
        return running


@contextlib.contextmanager
def kafka_cluster(nodes: int = 3) -> Iterator[KafkaCluster]:
    """A fresh local ``nodes``-node cluster for the whole session; every node stopped after."""
    kafka_local = load_kafka_local()
    try:
        cluster, temporary = _start_in_own_dir(
            f"cluster{nodes}", lambda state: kafka_local.start_cluster(state, nodes=nodes)
        )
    except kafka_local.BrokerError as exc:
        raise BrokerUnavailable(f"could not start a {nodes}-node local cluster: {exc}") from exc
    try:
        yield KafkaCluster(cluster)
    finally:
        cluster.stop()
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)


async def create_topics_with(
    client: Mapping[str, Any],
    names: Sequence[str],
    partitions: int = 1,
    replication: int = 1,
    *,
    configs: Mapping[str, str] | None = None,
    wait_seconds: float = 30.0,
) -> None:
    """:func:`create_topics` with aiokafka ``client`` arguments (:func:`client_kwargs`) and a
    replication factor; waits until every partition has a leader and all its replicas in sync.
    """
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError, for_code

    admin = AIOKafkaAdminClient(request_timeout_ms=30_000, **client)
    await admin.start()
    try:
        topics = [
            NewTopic(name, partitions, replication, topic_configs=dict(configs or {}))
            for name in names
        ]
        response = await admin.create_topics(topics)
        for topic, code, *rest in response.topic_errors:
            if code not in (0, TopicAlreadyExistsError.errno):
                message = rest[0] if rest else ""
                raise RuntimeError(f"creating topic {topic}: {for_code(code).__name__} {message}")
        deadline = time.monotonic() + wait_seconds
        while True:
            described: list[dict[str, Any]] = await admin.describe_topics(list(names))
            pending = [
                t["topic"]
                for t in described
                if not _topic_ready(t, partitions)
                or any(len(p.get("isr") or []) < replication for p in t.get("partitions") or [])
            ]
            pending += sorted(set(names) - {t["topic"] for t in described})
            if not pending:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"topics not in sync after {wait_seconds:.0f} s: {pending}")
            await asyncio.sleep(0.1)
    finally:
        await admin.close()


async def partition_state(
    client: Mapping[str, Any], topic: str, partition: int = 0
) -> tuple[int, list[int]]:
    """The (leader, in-sync replicas) of ``topic``'s ``partition`` (leader -1: none)."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(request_timeout_ms=10_000, **client)
    await admin.start()
    try:
        described: list[dict[str, Any]] = await admin.describe_topics([topic])
    finally:
        await admin.close()
    for part in described[0].get("partitions") or []:
        if part.get("partition") == partition:
            return int(part.get("leader", -1)), [int(r) for r in part.get("isr") or []]
    return -1, []
