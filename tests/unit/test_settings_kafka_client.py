"""`TICKWHEEL_KAFKA_CLIENT`: which client the partitions' transactional producers use;
`TICKWHEEL_PRODUCER_THREAD`: whether aiokafka's run on a loop of their own."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
from test_node_memory import SERVICE

from app.cli.common import clients_for
from app.errors import ConfigError
from app.kafka.clients import KafkaClients
from app.kafka.memory import MemoryLog
from app.node.node import Node
from app.node.settings import Settings


def test_aiokafka_is_the_default() -> None:
    assert Settings.from_env({}).kafka_client == "aiokafka"


def test_confluent_is_read_from_its_variable() -> None:
    assert Settings.from_env({"TICKWHEEL_KAFKA_CLIENT": "confluent"}).kafka_client == "confluent"


@pytest.mark.parametrize("value", ["librdkafka", "Confluent", "java"])
def test_another_client_is_an_error_naming_the_variable(value: str) -> None:
    with pytest.raises(ConfigError, match="TICKWHEEL_KAFKA_CLIENT"):
        Settings.from_env({"TICKWHEEL_KAFKA_CLIENT": value})


def test_confluent_without_its_package_is_an_error_saying_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec

    def missing(name: str, *args: Any) -> Any:
        return None if name == "confluent_kafka" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", missing)
    with pytest.raises(
        ConfigError, match=r"TICKWHEEL_KAFKA_CLIENT.*pip install '\.\[confluent\]' from a clone"
    ):
        Settings.from_env({"TICKWHEEL_KAFKA_CLIENT": "confluent"})


def node_clients_made(monkeypatch: pytest.MonkeyPatch, settings: Settings) -> list[Any]:
    """What a node of `settings` asked its clients for (each `KafkaClients` made)."""
    asked: list[Any] = []

    def made(*args: Any, client: str, producer_thread: bool, **kwargs: Any) -> MemoryLog:
        asked.append({"client": client, "producer_thread": producer_thread})
        return MemoryLog()

    monkeypatch.setattr("app.node.node.KafkaClients", made)
    Node(settings, SERVICE)
    return asked


def test_the_commands_and_the_node_make_their_clients_with_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = Settings.from_env({"TICKWHEEL_KAFKA_CLIENT": "confluent"})
    clients = clients_for(settings)
    assert isinstance(clients, KafkaClients) and clients.client == "confluent"
    assert node_clients_made(monkeypatch, settings) == [
        {"client": "confluent", "producer_thread": False}
    ]


def test_the_producer_thread_is_off_by_default_and_read_from_its_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings.from_env({}).producer_thread is False
    assert clients_for(Settings.from_env({})).producer_thread is False
    settings = Settings.from_env({"TICKWHEEL_PRODUCER_THREAD": "true"})
    assert settings.producer_thread is True
    assert clients_for(settings).producer_thread is True
    assert node_clients_made(monkeypatch, settings) == [
        {"client": "aiokafka", "producer_thread": True}
    ]
    with pytest.raises(ConfigError, match="TICKWHEEL_PRODUCER_THREAD"):
        Settings.from_env({"TICKWHEEL_PRODUCER_THREAD": "sometimes"})


def test_the_producer_thread_with_librdkafka_is_an_error_naming_both_variables() -> None:
    """librdkafka's producers run on threads of their own: the setting would do nothing."""
    with pytest.raises(
        ConfigError, match=r"TICKWHEEL_PRODUCER_THREAD=true.*TICKWHEEL_KAFKA_CLIENT=aiokafka only"
    ):
        Settings.from_env(
            {"TICKWHEEL_KAFKA_CLIENT": "confluent", "TICKWHEEL_PRODUCER_THREAD": "true"}
        )
    plain = {"TICKWHEEL_KAFKA_CLIENT": "confluent", "TICKWHEEL_PRODUCER_THREAD": "false"}
    assert Settings.from_env(plain).producer_thread is False
    with pytest.raises(ValueError, match="aiokafka's only"):
        KafkaClients("127.0.0.1:9092", client="confluent", producer_thread=True)


@pytest.mark.parametrize("group", ["tïckwheel", "zeit-\u00fchr", "\u65f6\u95f4"])
def test_confluent_with_a_group_id_not_ascii_is_refused_at_start(group: str) -> None:
    """librdkafka refuses the group of every transaction's offsets (`group_metadata`): the
    worker started, and no partition ever committed."""
    with pytest.raises(ConfigError, match="TICKWHEEL_GROUP_ID holds a character that is not"):
        Settings.from_env({"TICKWHEEL_GROUP_ID": group, "TICKWHEEL_KAFKA_CLIENT": "confluent"})
    assert Settings.from_env({"TICKWHEEL_GROUP_ID": group}).group_id == group  # aiokafka's
    assert (
        Settings.from_env(
            {"TICKWHEEL_GROUP_ID": "tick_wheel.1-x", "TICKWHEEL_KAFKA_CLIENT": "confluent"}
        ).group_id
        == "tick_wheel.1-x"
    )
