from __future__ import annotations

import importlib.util
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest


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


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Bootstrap address of the session's real Kafka broker, started on first request."""
    with kafka_broker.bootstrap_servers() as bootstrap:
        yield bootstrap


@pytest.fixture
def topic_factory(
    kafka_bootstrap: str, request: pytest.FixtureRequest
) -> Callable[..., Awaitable[str]]:
    """``name = await topic_factory(partitions=4)``: a fresh topic named after the test."""
    factory: Callable[..., Awaitable[str]] = kafka_broker.TopicFactory(
        kafka_bootstrap, prefix=request.node.name
    )
    return factory
