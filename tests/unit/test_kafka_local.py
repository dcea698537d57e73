"""The local broker script's pure parts."""

from __future__ import annotations

from pathlib import Path

import kafka_broker
import pytest  # registered by tests/conftest.py


def test_cluster_ids_never_look_like_an_option() -> None:
    script = kafka_broker.load_kafka_local()
    ids = [script._cluster_id() for _ in range(5_000)]
    assert not [i for i in ids if i.startswith("-")]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 22 for i in ids)


def test_the_kafka_version_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    script = kafka_broker.load_kafka_local()
    monkeypatch.delenv("TICKWHEEL_KAFKA_VERSION", raising=False)
    assert script.kafka_version() == script.KAFKA_VERSION == "3.9.2"
    monkeypatch.setenv("TICKWHEEL_KAFKA_VERSION", "4.1.2")
    assert script.kafka_version() == "4.1.2"
    # The tests' Docker broker runs the same version as the local one.
    monkeypatch.delenv("TICKWHEEL_KAFKA_IMAGE", raising=False)
    assert kafka_broker.docker_image() == "apache/kafka:4.1.2"
    monkeypatch.setenv("TICKWHEEL_KAFKA_IMAGE", "apache/kafka:latest")
    assert kafka_broker.docker_image() == "apache/kafka:latest"


def test_kafka_3_runs_with_reload4j_and_kafka_4_with_log4j2(tmp_path: Path) -> None:
    script = kafka_broker.load_kafka_local()
    pom3, pom4 = script._pom("3.9.2"), script._pom("4.1.2")
    assert "<artifactId>kafka_2.13</artifactId><version>3.9.2</version>" in pom3
    assert "slf4j-reload4j" in pom3 and "log4j-slf4j-impl" not in pom3
    assert "<artifactId>kafka_2.13</artifactId><version>4.1.2</version>" in pom4
    assert "log4j-slf4j-impl" in pom4 and "reload4j" not in pom4
    path3, prop3 = script._logging_config(tmp_path, "3.9.2", tool=False)
    assert prop3 == f"-Dlog4j.configuration=file:{path3}"
    assert "log4j.rootLogger=INFO, console" in path3.read_text()
    path4, prop4 = script._logging_config(tmp_path, "4.1.2", tool=True)
    assert prop4 == f"-Dlog4j2.configurationFile={path4}"
    assert "rootLogger.level = WARN" in path4.read_text()


def test_kafka_4_gets_its_share_coordinator_on_one_node(tmp_path: Path) -> None:
    script = kafka_broker.load_kafka_local()
    share = "share.coordinator.state.topic.replication.factor"
    props3 = script.server_properties(tmp_path, 9092, 9093, "3.9.2")
    props4 = script.server_properties(tmp_path, 9092, 9093, "4.1.2")
    assert share not in props3
    assert props4[share] == "1"
    assert props4["share.coordinator.state.topic.min.isr"] == "1"
    assert {k: v for k, v in props4.items() if not k.startswith("share.")} == props3
