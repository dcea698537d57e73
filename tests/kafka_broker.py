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
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any
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
