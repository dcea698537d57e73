"""The benchmarks connect as a node does: their clients take their options from the
`KafkaConnection` that the node's own settings read from the `KAFKA_*` variables (TLS,
SASL), not a PLAINTEXT bootstrap string of their own. No broker: the client classes are
replaced by recorders of what they were given."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest

import bench.common as common
from app.node.settings import Settings

BOOTSTRAP = "b1.example.test:9096,b2.example.test:9096"


class Recorder:
    """Stands for an aiokafka client class: keeps the keyword arguments it was given."""

    made: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, *topics: str, **kwargs: Any) -> None:
        Recorder.made.append(kwargs)

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def close(self) -> None: ...

    async def list_topics(self) -> list[str]:
        return []


@pytest.fixture
def secured(tmp_path: Path) -> dict[str, str]:
    password = tmp_path / "kafka.password"
    password.write_text("the password\n")
    return {
        "KAFKA_BOOTSTRAP_SERVERS": BOOTSTRAP,
        "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "KAFKA_SASL_USERNAME": "bench",
        "KAFKA_SASL_PASSWORD_FILE": str(password),
    }


def test_a_given_broker_is_reached_with_the_nodes_security_settings(
    secured: dict[str, str],
) -> None:
    kafka = common.connection_for(BOOTSTRAP, secured)
    assert kafka == Settings.from_env(secured).kafka
    assert kafka.security_protocol == "SASL_SSL" and kafka.sasl_username == "bench"


def test_a_broker_the_bench_started_is_plaintext(secured: dict[str, str]) -> None:
    kafka = common.connection_for("127.0.0.1:9092", secured)  # not the one the env names
    assert kafka.security_protocol == "PLAINTEXT"
    assert kafka.options() == {
        "bootstrap_servers": "127.0.0.1:9092",
        "security_protocol": "PLAINTEXT",
    }


async def test_every_client_of_the_bench_takes_the_connections_options(
    secured: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AIOKafkaProducer", "AIOKafkaConsumer", "AIOKafkaAdminClient"):
        monkeypatch.setattr(common, name, Recorder)
    Recorder.made = []
    kafka = common.connection_for(BOOTSTRAP, secured)
    common.Producer(kafka)
    common.Tail(kafka, "t", [0], lambda p, records, at: None)
    async with common.admin_client(kafka):
        pass
    await common.delete_context_topics(kafka, "ctx")
    wanted = kafka.options()
    assert wanted["sasl_plain_password"] == "the password" and "ssl_context" in wanted
    assert len(Recorder.made) == 4
    for given in Recorder.made:
        assert {k: given.get(k) for k in wanted} == wanted, given
