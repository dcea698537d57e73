"""The local broker's kept state: what a start keeps, formats, and which ports it takes.

Pure parts of ``scripts/kafka_local.py`` only: no Java, no broker.
"""

from __future__ import annotations

import inspect
import socket
from collections.abc import Callable
from pathlib import Path

import kafka_broker  # registered by tests/conftest.py
import pytest

script = kafka_broker.load_kafka_local()
Remembered = script.Remembered

META = """#
#Sun Nov 30 21:00:00 UTC 2025
node.id=1
directory.id=Wq2cD0xYQ6GdTQ7m3yq3fA
version=1
cluster.id=Zs1gD-A1TRuZ1Atj3-voiw
"""


def _formatted(state: Path, cluster_id: str = "Zs1gD-A1TRuZ1Atj3-voiw") -> Path:
    (state / "data").mkdir(parents=True)
    (state / "data" / "meta.properties").write_text(
        META.replace("Zs1gD-A1TRuZ1Atj3-voiw", cluster_id)
    )
    return state


# --------------------------------------------------------------------------- remembered


def test_remembered_round_trips(tmp_path: Path) -> None:
    kept = Remembered("abc", 39092, 39093, "3.9.2", {"log.retention.ms": "1000"})
    script.write_remembered(tmp_path, kept)
    assert script.read_remembered(tmp_path) == kept
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize(
    "text",
    ["", "not json", "[1, 2]", '{"port": "x", "controller_port": 70000, "cluster_id": 5}'],
)
def test_unreadable_remembered_state_is_nothing_remembered(tmp_path: Path, text: str) -> None:
    (tmp_path / script.CLUSTERFILE).write_text(text)
    assert script.read_remembered(tmp_path) == Remembered()


def test_a_dir_never_started_remembers_nothing(tmp_path: Path) -> None:
    assert script.read_remembered(tmp_path / "nowhere") == Remembered()
    assert script.formatted_cluster_id(tmp_path / "nowhere") is None


def test_the_cluster_id_is_the_one_kafka_formatted(tmp_path: Path) -> None:
    assert script.formatted_cluster_id(_formatted(tmp_path)) == "Zs1gD-A1TRuZ1Atj3-voiw"


def test_storage_without_a_cluster_id_is_not_formatted(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "meta.properties").write_text("node.id=1\ncluster.id=\n")
    assert script.formatted_cluster_id(tmp_path) is None


# --------------------------------------------------------------------------- keep or fresh


def test_a_dir_never_formatted_is_formatted_on_a_free_port() -> None:
    plan = script.plan_start(Remembered(), None, fresh=False)
    assert (plan.keep, plan.cluster_id, plan.port, plan.port_required) == (False, None, None, False)


def test_a_formatted_dir_keeps_its_data_cluster_id_and_port() -> None:
    plan = script.plan_start(Remembered("c", 39092, 39093), "c", fresh=False)
    assert plan.keep and plan.cluster_id == "c"
    assert (plan.port, plan.port_required, plan.port_origin) == (39092, True, "remembered")
    assert plan.controller_port == 39093


def test_the_cluster_id_on_disk_wins_over_the_remembered_one() -> None:
    plan = script.plan_start(Remembered("old", 39092), "on-disk", fresh=False)
    assert plan.cluster_id == "on-disk"


def test_a_formatted_dir_without_a_remembered_port_gets_a_free_one() -> None:
    # A dir formatted by an older kafka_local.py (no cluster.json): data kept, any port.
    plan = script.plan_start(Remembered(), "c", fresh=False)
    assert plan.keep and plan.cluster_id == "c"
    assert (plan.port, plan.port_required) == (None, False)


def test_fresh_formats_anew_and_only_prefers_the_remembered_port() -> None:
    plan = script.plan_start(Remembered("c", 39092, 39093), "c", fresh=True)
    assert not plan.keep and plan.cluster_id is None
    assert (plan.port, plan.port_required) == (39092, False)


def test_wiped_data_is_formatted_anew_on_the_remembered_port_if_free() -> None:
    plan = script.plan_start(Remembered("c", 39092), None, fresh=False)
    assert not plan.keep
    assert (plan.port, plan.port_required) == (39092, False)


@pytest.mark.parametrize("fresh", [False, True])
@pytest.mark.parametrize("formatted", [None, "c"])
def test_an_explicit_port_is_required(fresh: bool, formatted: str | None) -> None:
    plan = script.plan_start(Remembered("c", 39092), formatted, fresh=fresh, port=40000)
    assert (plan.port, plan.port_required, plan.port_origin) == (40000, True, "--port")


def test_after_a_port_clash_only_a_required_port_stays() -> None:
    kept = script.plan_start(Remembered("c", 39092, 39093), "c", fresh=False)
    assert (kept.after_port_clash().port, kept.after_port_clash().controller_port) == (39092, None)
    fresh = script.plan_start(Remembered("c", 39092, 39093), "c", fresh=True)
    assert (fresh.after_port_clash().port, fresh.after_port_clash().controller_port) == (None, None)


def test_the_library_starts_fresh_by_default() -> None:
    # tests/kafka_broker.py calls start(state_dir) and needs an empty broker every session.
    assert inspect.signature(script.start).parameters["fresh"].default is True


# --------------------------------------------------------------------------- ports


def _free_ports(*ports: int) -> Callable[[int], list[int]]:
    return lambda count: list(ports[:count])


def test_a_taken_remembered_port_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("kafka_local_parts.ports.probe", lambda bootstrap, timeout=3.0: False)
    plan = script.plan_start(Remembered("c", 39092, 39093), "c", fresh=False)
    with pytest.raises(script.BrokerError) as error:
        script.choose_ports(
            plan, state_dir=tmp_path, is_free=lambda p: p != 39092, free_ports=_free_ports(1, 2, 3)
        )
    message = str(error.value)
    assert "port 39092" in message
    assert str(tmp_path / "cluster.json") in message
    assert "--port" in message and "--fresh" in message


def test_a_taken_port_held_by_another_kafka_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kafka_local_parts.ports.probe", lambda bootstrap, timeout=3.0: True)
    plan = script.plan_start(Remembered(), None, fresh=False, port=40000)
    with pytest.raises(script.BrokerError, match=r"port 40000 \(--port\).*another Kafka broker"):
        script.choose_ports(plan, is_free=lambda p: False, free_ports=_free_ports(1, 2, 3))


def test_a_kept_broker_takes_its_ports() -> None:
    plan = script.plan_start(Remembered("c", 39092, 39093), "c", fresh=False)
    ports = script.choose_ports(plan, is_free=lambda p: True, free_ports=_free_ports(1, 2, 3))
    assert ports == (39092, 39093)


def test_a_taken_controller_port_is_replaced_by_a_free_one() -> None:
    plan = script.plan_start(Remembered("c", 39092, 39093), "c", fresh=False)
    ports = script.choose_ports(
        plan, is_free=lambda p: p != 39093, free_ports=_free_ports(39092, 41000, 41001)
    )
    assert ports == (39092, 41000)  # never the PLAINTEXT port twice


def test_a_fresh_broker_whose_port_is_taken_gets_free_ones() -> None:
    plan = script.plan_start(Remembered("c", 39092, 39093), "c", fresh=True)
    ports = script.choose_ports(plan, is_free=lambda p: p != 39092, free_ports=_free_ports(7, 8, 9))
    assert ports == (7, 39093)


def test_nothing_remembered_takes_two_free_ports() -> None:
    plan = script.plan_start(Remembered(), None, fresh=False)
    assert script.choose_ports(plan, free_ports=_free_ports(7, 8, 9)) == (7, 8)


def test_a_listening_port_is_taken_and_its_time_wait_leftovers_are_not() -> None:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the JVM's listener
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    assert not script.port_free(port)
    client = socket.create_connection(("127.0.0.1", port))
    served, _ = listener.accept()
    served.close()  # the broker's side closes first: TIME_WAIT on the broker's port
    client.close()
    listener.close()
    assert script.port_free(port)  # as a restarted JVM binds it: SO_REUSEADDR
    plain = socket.socket()  # a bind without SO_REUSEADDR would call the port taken
    with plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))
