"""The local broker's command line: parsing, and the commands that need no broker."""

from __future__ import annotations

import argparse
from pathlib import Path

import kafka_broker  # registered by tests/conftest.py
import pytest

script = kafka_broker.load_kafka_local()


def parse(*argv: str) -> argparse.Namespace:
    args: argparse.Namespace = script.build_parser().parse_args(list(argv))
    return args


def test_start_keeps_the_data_unless_fresh() -> None:
    args = parse("start")
    assert (args.command, args.fresh, args.port, args.dir, args.set) == (
        "start",
        False,
        None,
        None,
        [],
    )
    args = parse("start", "--fresh", "--dir", "/tmp/k", "--port", "39092", "--set", "a=b")
    assert (args.fresh, args.dir, args.port, args.set) == (True, Path("/tmp/k"), 39092, ["a=b"])


@pytest.mark.parametrize("command", ["restart", "env", "status", "stop"])
def test_every_broker_command_takes_a_dir(command: str) -> None:
    args = parse(command, "--dir", "/tmp/k")
    assert (args.command, args.dir) == (command, Path("/tmp/k"))
    assert parse(command).dir is None


def test_restart_takes_only_a_dir_and_a_timeout() -> None:
    assert parse("restart", "--timeout", "30").timeout == 30.0
    with pytest.raises(SystemExit):
        parse("restart", "--fresh")
    with pytest.raises(SystemExit):
        parse("restart", "--port", "1")


def test_a_command_is_required() -> None:
    with pytest.raises(SystemExit):
        parse()


def test_the_help_names_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("--help")
    out = capsys.readouterr().out
    for word in ("start", "restart", "stop", "status", "env", "fetch", "--fresh"):
        assert word in out


def test_env_line_is_an_export_for_eval() -> None:
    assert script.env_line("127.0.0.1:39092") == "export KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:39092"
    assert script.env_line("a b") == "export KAFKA_BOOTSTRAP_SERVERS='a b'"


def test_env_of_a_stopped_broker_exits_3_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert script.main(["env", "--dir", str(tmp_path)]) == 3
    out, err = capsys.readouterr()
    assert out == ""
    assert "no broker is running" in err and str(tmp_path) in err


def test_status_of_a_stopped_broker(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert script.main(["status", "--dir", str(tmp_path)]) == 3
    assert capsys.readouterr().out == "stopped\n"


def test_restart_where_no_broker_ever_ran_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert script.main(["restart", "--dir", str(tmp_path / "typo")]) == 1
    assert "no broker to restart" in capsys.readouterr().err
    assert not (tmp_path / "typo").exists()  # nothing was created, no Java was run
    with pytest.raises(script.BrokerError, match="no broker to restart"):
        script.restart(tmp_path)
