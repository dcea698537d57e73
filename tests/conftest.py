from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

if TYPE_CHECKING:
    from kafka_broker import KafkaCluster, SecuredKafka


def _load_kafka_broker() -> ModuleType:
    """tests/kafka_broker.py by path, so it works under any pytest import mode."""
    if "kafka_broker" in sys.modules:
        return sys.modules["kafka_broker"]
    spec = importlib.util.spec_from_file_location(
        "kafka_broker", Path(__file__).with_name("kafka_broker.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["kafka_broker"] = module
    spec.loader.exec_module(module)
    return module


kafka_broker = _load_kafka_broker()

# No per-example time limit: on a loaded 2-core machine one example of a correct test can
# take 400 ms; how long code takes is for bench/, never a test's verdict.
settings.register_profile("tickwheel", deadline=None)
# CI (`CI` set, as .ci/run runs) explores the same examples every run, so that a red run
# is one anyone can repeat; runs elsewhere explore new ones, and print how to repeat them.
settings.register_profile("ci", deadline=None, derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "tickwheel")


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Bootstrap address of the session's real Kafka broker, started on first request."""
    with kafka_broker.bootstrap_servers() as bootstrap:
        yield bootstrap


@pytest.fixture(scope="session")
def kafka_secured() -> Iterator[SecuredKafka]:
    """A SASL_SSL broker of the session's own (TLS, SCRAM users, ACLs: super user ``admin``,
    ``tickwheel`` with no ACL until a test grants it some), started once, when a test first
    asks for it."""
    with kafka_broker.secured_kafka("sasl_ssl") as broker:
        yield broker


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[KafkaCluster]:
    """A three-node KRaft cluster of the session's own (replication factor 3,
    min.insync.replicas=2), started once, when a test first asks for it. A test that stops
    or kills a node starts it again before it ends."""
    with kafka_broker.kafka_cluster(3) as cluster:
        yield cluster


@pytest.fixture
def topic_factory(
    kafka_bootstrap: str, request: pytest.FixtureRequest
) -> Callable[..., Awaitable[str]]:
    """``name = await topic_factory(partitions=4)``: a fresh topic named after the test."""
    factory: Callable[..., Awaitable[str]] = kafka_broker.TopicFactory(
        kafka_bootstrap, prefix=request.node.name
    )
    return factory
