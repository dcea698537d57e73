"""The local multi-node cluster (``start --brokers 3``) and the node commands, without a JVM.

Each node's server.properties, the ports a cluster takes, what ``cluster.json`` keeps, and
the command line (``--node``, ``kill``, ``grant``, ``env --user``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import kafka_broker  # registered by tests/conftest.py
import pytest

script = kafka_broker.load_kafka_local()
Remembered = script.Remembered

PORTS = ((39092, 39093), (39192, 39193), (39292, 39293))


def parse(*argv: str) -> argparse.Namespace:
    args: argparse.Namespace = script.build_parser().parse_args(list(argv))
    return args


# --------------------------------------------------------------------------- properties


def test_every_node_is_broker_and_controller_with_all_three_voters(tmp_path: Path) -> None:
    nodes = script.cluster_properties(tmp_path, PORTS, "3.9.2")
    assert sorted(nodes) == [1, 2, 3]
    voters = "1@127.0.0.1:39093,2@127.0.0.1:39193,3@127.0.0.1:39293"
    for node, (client, controller) in zip((1, 2, 3), PORTS, strict=True):
        props = nodes[node]
        assert props["node.id"] == str(node)
        assert props["process.roles"] == "broker,controller"
        assert props["controller.quorum.voters"] == voters
        assert props["listeners"] == (
            f"PLAINTEXT://127.0.0.1:{client},CONTROLLER://127.0.0.1:{controller}"
        )
        assert props["advertised.listeners"] == f"PLAINTEXT://127.0.0.1:{client}"
        assert props["log.dirs"] == str(tmp_path / f"node-{node}" / "data")


def test_a_cluster_replicates_its_internal_topics_and_its_defaults(tmp_path: Path) -> None:
    props = script.cluster_properties(tmp_path, PORTS, "3.9.2")[2]
    assert props["default.replication.factor"] == "3"
    assert props["min.insync.replicas"] == "2"
    assert props["offsets.topic.replication.factor"] == "3"
    assert props["transaction.state.log.replication.factor"] == "3"
    assert props["transaction.state.log.min.isr"] == "2"
    assert props["auto.create.topics.enable"] == "false"
    assert "share.coordinator.state.topic.replication.factor" not in props
    props4 = script.cluster_properties(tmp_path, PORTS, "4.1.2")[1]
    assert props4["share.coordinator.state.topic.replication.factor"] == "3"
    assert props4["share.coordinator.state.topic.min.isr"] == "2"
    single = script.server_properties(tmp_path, 9092, 9093, "3.9.2")
    assert single["default.replication.factor"] == single["min.insync.replicas"] == "1"


def test_overrides_apply_to_every_node(tmp_path: Path) -> None:
    nodes = script.cluster_properties(tmp_path, PORTS, "3.9.2", {"min.insync.replicas": "1"})
    assert {props["min.insync.replicas"] for props in nodes.values()} == {"1"}


def test_a_secured_cluster_talks_sasl_ssl_between_its_brokers(tmp_path: Path) -> None:
    credentials = script.Credentials(tmp_path, "sasl_ssl", {"admin": "a", "tickwheel": "t"})
    props = script.cluster_properties(tmp_path, PORTS, "3.9.2", credentials=credentials)[3]
    assert props["listeners"] == "SASL_SSL://127.0.0.1:39292,CONTROLLER://127.0.0.1:39293"
    assert props["inter.broker.listener.name"] == "SASL_SSL"
    assert props["ssl.keystore.location"] == str(tmp_path / "tls" / "broker.pem")
    assert (
        'username="admin" password="a"'
        in props["listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config"]
    )


# --------------------------------------------------------------------------- ports


def _free(*ports: int) -> Callable[[int], list[int]]:
    return lambda count: list(ports[:count])


def test_a_new_cluster_takes_six_distinct_free_ports() -> None:
    ports = script.choose_cluster_ports(
        3, Remembered(), keep=False, is_free=lambda p: True, free_ports=_free(*range(1, 20))
    )
    assert ports == ((1, 4), (2, 5), (3, 6))


def test_a_kept_cluster_takes_its_ports() -> None:
    remembered = Remembered("c", nodes=3, node_ports=PORTS)
    ports = script.choose_cluster_ports(
        3, remembered, keep=True, is_free=lambda p: True, free_ports=_free()
    )
    assert ports == PORTS


def test_a_kept_cluster_whose_client_port_is_taken_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("kafka_local_parts.ports.probe", lambda bootstrap, timeout=3.0, **kw: False)
    remembered = Remembered("c", nodes=3, node_ports=PORTS)
    with pytest.raises(script.BrokerError, match=r"node 2: port 39192 of this broker"):
        script.choose_cluster_ports(
            3,
            remembered,
            keep=True,
            state_dir=tmp_path,
            is_free=lambda p: p != 39192,
            free_ports=_free(1, 2, 3),
        )


def test_taken_controller_ports_and_fresh_client_ports_are_replaced() -> None:
    remembered = Remembered("c", nodes=3, node_ports=PORTS)
    ports = script.choose_cluster_ports(
        3,
        remembered,
        keep=False,
        is_free=lambda p: p not in (39192, 39293),
        free_ports=_free(39092, 7, 8, 9, 10),
    )
    assert ports == ((39092, 39093), (7, 39193), (39292, 8))
    retry = script.choose_cluster_ports(
        3,
        remembered,
        keep=True,
        new_controller_ports=True,
        is_free=lambda p: True,
        free_ports=_free(*range(1, 20)),
    )
    assert [client for client, _ in retry] == [39092, 39192, 39292]
    assert len({port for pair in retry for port in pair}) == 6


def test_port_gives_consecutive_required_client_ports() -> None:
    ports = script.choose_cluster_ports(
        3, Remembered(), keep=False, port=40000, is_free=lambda p: True, free_ports=_free(1, 2, 3)
    )
    assert ports == ((40000, 1), (40001, 2), (40002, 3))
    with pytest.raises(script.BrokerError, match=r"node 3: port 40002 \(--port\)"):
        script.choose_cluster_ports(
            3,
            Remembered(),
            keep=False,
            port=40000,
            is_free=lambda p: p != 40002,
            free_ports=_free(1, 2, 3),
        )


def test_remembered_ports_of_another_node_count_are_not_used() -> None:
    remembered = Remembered("c", nodes=3, node_ports=PORTS)
    ports = script.choose_cluster_ports(
        5, remembered, keep=False, is_free=lambda p: True, free_ports=_free(*range(1, 30))
    )
    assert [client for client, _ in ports] == [1, 2, 3, 4, 5]


# --------------------------------------------------------------------------- kept state


def test_a_cluster_is_remembered_with_every_node(tmp_path: Path) -> None:
    kept = Remembered("c", 39092, 39093, "3.9.2", {}, "sasl_ssl", 3, PORTS)
    script.write_remembered(tmp_path, kept)
    assert script.read_remembered(tmp_path) == kept
    assert kept.bootstrap() == "127.0.0.1:39092,127.0.0.1:39192,127.0.0.1:39292"
    assert script.is_cluster(tmp_path)
    assert Remembered("c", 39092).bootstrap() == "127.0.0.1:39092"
    assert Remembered().bootstrap() is None


def test_an_old_cluster_json_is_one_plaintext_node(tmp_path: Path) -> None:
    (tmp_path / script.CLUSTERFILE).write_text('{"cluster_id": "c", "port": 39092}')
    remembered = script.read_remembered(tmp_path)
    assert (remembered.nodes, remembered.security, remembered.node_ports) == (1, "plaintext", ())
    assert not script.is_cluster(tmp_path)


@pytest.mark.parametrize(
    "extra",
    [
        '"nodes": 99, "security": "kerberos", "node_ports": [[1, 2], [3]]',
        '"nodes": "3", "node_ports": "x"',
        '"nodes": 3, "node_ports": [[1, 70000], [0, 2], null]',
    ],
)
def test_unreadable_cluster_fields_are_ignored(tmp_path: Path, extra: str) -> None:
    (tmp_path / script.CLUSTERFILE).write_text('{"cluster_id": "c", ' + extra + "}")
    remembered = script.read_remembered(tmp_path)
    assert remembered.security == "plaintext"
    assert remembered.node_ports in ((), ((1, 2),))


def test_a_cluster_is_formatted_when_every_node_has_the_same_cluster_id(tmp_path: Path) -> None:
    for node, cluster_id in ((1, "c"), (2, "c"), (3, "c")):
        data = script.node_dir(tmp_path, node) / "data"
        data.mkdir(parents=True)
        (data / "meta.properties").write_text(f"node.id={node}\ncluster.id={cluster_id}\n")
    assert script._cluster_formatted(tmp_path, 3) == "c"
    assert script._cluster_formatted(tmp_path, 4) is None  # no node 4
    (script.node_dir(tmp_path, 3) / "data" / "meta.properties").write_text("cluster.id=other\n")
    assert script._cluster_formatted(tmp_path, 3) is None


# --------------------------------------------------------------------------- command line


def test_start_takes_security_brokers_and_node() -> None:
    args = parse("start")
    assert (args.security, args.brokers, args.node, args.timeout) == (None, None, None, None)
    args = parse("start", "--security", "sasl_ssl", "--brokers", "3", "--fresh")
    assert (args.security, args.brokers, args.fresh) == ("sasl_ssl", 3, True)
    assert parse("start", "--node", "2").node == 2
    with pytest.raises(SystemExit):
        parse("start", "--security", "sasl_plaintext")


@pytest.mark.parametrize("command", ["stop", "kill", "restart", "start"])
def test_node_commands(command: str) -> None:
    args = parse(command, "--node", "3", "--dir", "/tmp/k")
    assert (args.command, args.node, args.dir) == (command, 3, Path("/tmp/k"))


def test_env_takes_a_user() -> None:
    assert parse("env").user == "admin"
    assert parse("env", "--user", "tickwheel").user == "tickwheel"
    with pytest.raises(SystemExit):
        parse("env", "--user", "root")


def test_grant_takes_one_resource_and_operations() -> None:
    args = parse("grant", "--topic", "orders", "--operation", "READ", "--operation", "describe")
    assert (args.user, args.topic, args.operation, args.prefixed) == (
        "tickwheel",
        "orders",
        ["read", "describe"],
        False,
    )
    args = parse("grant", "--group", "tw-", "--prefixed", "--operation", "all", "--user", "bob")
    assert (args.group, args.prefixed, args.user) == ("tw-", True, "bob")
    assert parse("grant", "--cluster", "--operation", "idempotent-write").operation == [
        "idempotent_write"
    ]
    with pytest.raises(SystemExit):
        parse("grant", "--topic", "a", "--group", "b", "--operation", "read")
    with pytest.raises(SystemExit):
        parse("grant", "--topic", "a")  # no operation
    with pytest.raises(SystemExit):
        parse("grant", "--topic", "a", "--operation", "fly")


def test_the_help_names_the_new_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("--help")
    out = capsys.readouterr().out
    for word in ("kill", "grant", "--security sasl_ssl", "--brokers 3", "--node 2"):
        assert word in out


def test_start_node_takes_no_other_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert script.main(["start", "--dir", str(tmp_path), "--node", "2", "--fresh"]) == 1
    assert "takes only --dir and --timeout" in capsys.readouterr().err


def test_node_commands_where_no_cluster_ran(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Only node 1 of a single broker: nothing runs, so nothing to stop (and no Java).
    assert script.main(["stop", "--dir", str(tmp_path), "--node", "1"]) == 0
    assert capsys.readouterr().out == "stopped (was not running)\n"
    assert script.main(["kill", "--dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "killed (was not running)\n"
    assert script.main(["kill", "--dir", str(tmp_path), "--node", "2"]) == 1
    assert "its only node is 1" in capsys.readouterr().err
    script.write_remembered(tmp_path, Remembered("c", 39092, 39093, nodes=3, node_ports=PORTS))
    assert script.main(["start", "--dir", str(tmp_path), "--node", "2"]) == 1
    assert "never formatted" in capsys.readouterr().err
    with pytest.raises(script.BrokerError, match="no cluster"):
        script.kill_node(tmp_path / "elsewhere", 1)


def test_a_stopped_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script.write_remembered(tmp_path, Remembered("c", 39092, 39093, nodes=3, node_ports=PORTS))
    for node in (1, 2, 3):
        data = script.node_dir(tmp_path, node) / "data"
        data.mkdir(parents=True)
        (data / "meta.properties").write_text(f"node.id={node}\ncluster.id=c\n")
    assert [(s.node, s.running, s.bootstrap) for s in script.cluster_status(tmp_path)] == [
        (1, False, "127.0.0.1:39092"),
        (2, False, "127.0.0.1:39192"),
        (3, False, "127.0.0.1:39292"),
    ]
    assert script.main(["status", "--dir", str(tmp_path)]) == 3
    assert capsys.readouterr().out == "stopped\n"
    assert script.main(["env", "--dir", str(tmp_path)]) == 3
    assert "no broker is running" in capsys.readouterr().err
    assert script.main(["stop", "--dir", str(tmp_path), "--node", "3"]) == 0
    assert capsys.readouterr().out == "node 3 stopped (was not running)\n"
    assert script.main(["kill", "--dir", str(tmp_path), "--node", "4"]) == 1
    assert "its nodes are 1 to 3" in capsys.readouterr().err
    with pytest.raises(script.BrokerError, match="holds a 3-node cluster"):
        script.start(tmp_path, fresh=False)
    with pytest.raises(script.BrokerError, match="restart_cluster"):
        script.restart(tmp_path)


def test_a_refused_start_stops_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stopped: list[object] = []
    # Where start (broker.py) and start_cluster (cluster_start.py) look stop up.
    for module in ("broker", "cluster_start"):
        monkeypatch.setattr(
            f"kafka_local_parts.{module}.stop", lambda *args, **kwargs: stopped.append(args)
        )
    cluster, single = tmp_path / "cluster", tmp_path / "single"
    cluster.mkdir()
    script.write_remembered(cluster, Remembered("c", nodes=3, node_ports=PORTS))
    for node in (1, 2, 3):
        data = script.node_dir(cluster, node) / "data"
        data.mkdir(parents=True)
        (data / "meta.properties").write_text("cluster.id=c\n")
    with pytest.raises(script.BrokerError, match="holds a 3-node cluster"):
        script.start(cluster, fresh=False)  # `start --brokers 1` on a running cluster
    with pytest.raises(script.BrokerError, match="--fresh --security ssl"):
        script.start_cluster(cluster, nodes=3, fresh=False, security="ssl")
    (single / "data").mkdir(parents=True)
    (single / "data" / "meta.properties").write_text("cluster.id=s\n")
    script.write_remembered(single, Remembered("s", 39092, 39093, security="sasl_ssl"))
    with pytest.raises(script.BrokerError, match="--fresh --security plaintext"):
        script.start(single, fresh=False, security="plaintext")
    with pytest.raises(script.BrokerError, match="holds one broker"):
        script.start_cluster(single, nodes=3, fresh=False)
    assert stopped == []
