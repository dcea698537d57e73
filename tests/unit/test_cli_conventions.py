"""What every `tickwheel` command shares: `--version`; the exit codes (2: the command line or
the configuration, 1: the command ran and failed), each error one line on stderr and no
traceback; `--json` on every command that prints results, and no option accepted and
ignored; the log's level and format, on every command, put back when it ends."""

from __future__ import annotations

import importlib.metadata
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import typer
from typer.testing import CliRunner, Result

import app.cli.job_options
import app.cli.timers
import app.demo
import app.ops.rebuild
from app.cli import cli
from app.cli.logs import JsonFormatter
from app.kafka.ports import Clients
from app.ops.op_answers import Answered
from app.ops.rebuild import PartitionPlan, RebuildPlan, Span, TypePlan
from app.protocol.topics import AggregateTopics
from app.protocol.wire import TimerOp
from tables import AggregateRef, CommandSpec, OnceRule, Timer

DEMO = ["--service", "app.demo:service"]
JOB = [*DEMO, "--context", "shop", "--job", "unpaid-report"]

EVERY_COMMAND: dict[str, list[str]] = {
    "worker": [],
    "demo": ["--seconds", "0"],
    "rebuild": ["--type", "shop.order", "--dry-run"],
    "schemas": ["--check"],
    "timers list": ["--type", "shop.order"],
    "timers ledger": ["--context", "shop"],
    "timers show": ["--type", "shop.order", "--owner", "o-1"],
    "timers upcoming": ["--type", "shop.order"],
    "timers retry": ["--type", "shop.order", "--target-id", "t-1"],
    "timers skip": ["--type", "shop.order", "--target-id", "t-1"],
    "timers set": [
        "--type",
        "shop.reminders",
        "--owner",
        "o-1",
        "--key",
        "k",
        "--rule",
        "once:0",
        "--target-type",
        "shop.order",
        "--command",
        "Remind",
    ],
    "timers cancel": ["--type", "shop.reminders", "--owner", "o-1", "--key", "k"],
    "timers pause": ["--type", "shop.reminders", "--owner", "o-1", "--key", "k"],
    "timers resume": ["--type", "shop.reminders", "--owner", "o-1", "--key", "k"],
    "timers trigger": ["--type", "shop.reminders", "--owner", "o-1", "--key", "k"],
    "jobs list": DEMO,
    "jobs enable": JOB,
    "jobs disable": JOB,
    "jobs reschedule": [*JOB, "--rule", "null"],
    "jobs trigger": JOB,
    "jobs backfill": [*JOB, "--from", "0", "--until", "60000"],
    "rules next": ["cron:0 9 * * *"],
    "dead-letters list": ["--context", "shop"],
    "dead-letters show": ["--context", "shop", "--offset", "0"],
    "dead-letters replay": ["--context", "shop", "--offset", "0"],
}
"""Each command with what it needs to start."""


def invoke(args: list[str], env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, args, env=env)


def commands() -> Iterator[tuple[str, Any]]:
    """Every command: its name (`timers list`) and its click command."""
    root: Any = typer.main.get_command(cli)
    for name, command in root.commands.items():
        if hasattr(command, "commands"):
            for sub, leaf in command.commands.items():
                yield f"{name} {sub}", leaf
        else:
            yield name, command


def options(command: Any) -> set[str]:
    return {o for p in command.params for o in p.opts}


def one_error_line(result: Result) -> str:
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


def test_the_list_here_is_every_command() -> None:
    assert {name for name, _ in commands()} == set(EVERY_COMMAND)


def test_version() -> None:
    result = invoke(["--version"])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"tickwheel {importlib.metadata.version('tickwheel')}\n"


def test_no_command_shows_the_help_and_no_error() -> None:
    for args in ([], ["timers"], ["jobs"]):
        result = invoke(args)
        assert "Usage" in result.output and "error:" not in result.output, args


# --- exit codes ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(EVERY_COMMAND))
@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"TICKWHEEL_PARTITONS": "3"},
            "error: TICKWHEEL_PARTITONS (in the environment) is no setting: "
            "did you mean TICKWHEEL_PARTITIONS?",
        ),
        (
            {"TICKWHEEL_PARTITIONS": "0"},
            "error: bad configuration: TICKWHEEL_PARTITIONS: Input should be greater than or "
            "equal to 1 (got '0')",
        ),
        (
            {"TICKWHEEL_LOG_LEVEL": "loud"},
            "error: bad configuration: TICKWHEEL_LOG_LEVEL: Input should be 'DEBUG', 'INFO', "
            "'WARNING' or 'ERROR' (got 'LOUD')",
        ),
    ],
)
def test_a_configuration_error_exits_2_on_every_command(
    name: str, env: dict[str, str], message: str
) -> None:
    result = invoke([*name.split(), *EVERY_COMMAND[name]], env)
    assert result.exit_code == 2, result.output
    assert one_error_line(result) == message


def test_a_file_setting_that_cannot_be_read_exits_2(tmp_path: Path) -> None:
    env = {"TICKWHEEL_WEB_TOKEN_FILE": str(tmp_path / "nope")}
    result = invoke(["jobs", "list", *DEMO], env)
    assert result.exit_code == 2
    assert one_error_line(result).startswith("error: TICKWHEEL_WEB_TOKEN_FILE (in the environment)")


@pytest.mark.parametrize(
    "args",
    [
        ["worker", "--log-level", "foo"],
        ["--log-level", "foo", "jobs", "list", *DEMO],
    ],
)
def test_a_bad_log_level_is_a_usage_error_naming_the_levels(args: list[str]) -> None:
    result = invoke(args)
    assert result.exit_code == 2, result.output
    line = one_error_line(result)
    assert "Invalid value for '--log-level': 'foo' is not one of DEBUG, INFO, WARNING, ERROR" in (
        line
    )


def test_a_bad_log_format_is_a_usage_error() -> None:
    result = invoke(["--log-format", "xml", "schemas", "--check"])
    assert result.exit_code == 2
    assert "'xml' is not one of text, json" in one_error_line(result)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["timers", "list"], "error: Missing option '--type' (see '"),
        (["timers", "list", "--type", "a.b", "--partitions", "3"], "No such option: --partitions"),
        (["jobs", "list", *DEMO, "--partitions", "0"], "Invalid value for '--partitions'"),
        (["nope"], "error: No such command 'nope'"),
    ],
)
def test_a_usage_error_exits_2_with_one_line(args: list[str], message: str) -> None:
    result = invoke(args)
    assert result.exit_code == 2, result.output
    assert message in one_error_line(result)
    assert "Usage:" not in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["timers", "list", "--type", "a.b"],
        ["timers", "show", "--type", "a.b", "--owner", "o"],
        ["timers", "upcoming", "--type", "a.b"],
        ["dead-letters", "list", "--context", "shop"],
        ["dead-letters", "replay", "--context", "shop", "--offset", "0"],
        ["timers", "cancel", "--type", "a.b", "--owner", "o", "--key", "k"],
        ["jobs", "list", *DEMO, "--state"],
        ["jobs", "trigger", *JOB],
        ["jobs", "backfill", *JOB, "--from", "0", "--until", "60000", "--dry-run"],
        ["rebuild", "--type", "a.b", "--dry-run"],
        ["demo", "--seconds", "0"],
    ],
)
def test_no_broker_exits_1_with_one_line(args: list[str]) -> None:
    result = invoke([*args, "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 1, result.output
    assert "127.0.0.1:1" in one_error_line(result)


def test_a_service_that_cannot_be_loaded_exits_1_on_every_command_that_takes_one() -> None:
    for args in (
        ["worker"],
        ["rebuild", "--dry-run"],
        ["jobs", "list"],
        ["jobs", "enable", "--context", "shop", "--job", "x"],
    ):
        result = invoke([*args, "--service", "no.such.module:svc"])
        assert result.exit_code == 1, (args, result.output)
        assert "cannot load service 'no.such.module:svc'" in one_error_line(result)


def test_a_relative_name_or_a_module_whose_import_raises_is_no_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both ended in "unexpected TypeError" (importlib's for '../x') or the module's own."""
    (tmp_path / "raising_service.py").write_text("1 / 0\n")
    (tmp_path / "broken_service.py").write_text("def (:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for spec, why in (
        ("../x:y", "TypeError"),
        ("raising_service:service", "ZeroDivisionError"),
        ("broken_service:service", "SyntaxError"),
    ):
        result = invoke(["worker", "--service", spec])
        assert result.exit_code == 1, (spec, result.output)
        line = one_error_line(result)
        assert f"cannot load service {spec!r}: {why}" in line, line


def test_an_unexpected_exception_exits_1_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(*args: Any, **kwargs: Any) -> list[Timer]:
        raise RuntimeError("boom")

    monkeypatch.setattr(app.cli.timers, "read_timers", broken)
    result = invoke(["timers", "list", "--type", "a.b"])
    assert result.exit_code == 1
    assert one_error_line(result) == "error: unexpected RuntimeError: boom"
    # Its traceback is the DEBUG log's.
    result = invoke(
        ["timers", "list", "--type", "a.b"],
        {"TICKWHEEL_LOG_LEVEL": "debug", "TICKWHEEL_LOG_FORMAT": "json"},
    )
    assert result.exit_code == 1
    logged, error = result.stderr.splitlines()[-2:]
    assert error == "error: unexpected RuntimeError: boom"
    record = orjson.loads(logged)
    assert (record["level"], record["logger"]) == ("DEBUG", "tickwheel")
    assert "Traceback" in record["exception"] and "RuntimeError: boom" in record["exception"]


# --- --json, and no option ignored --------------------------------------------------------


def test_every_command_that_prints_results_takes_json() -> None:
    without = {name for name, command in commands() if "--json" not in options(command)}
    assert without == {"worker"}  # it prints nothing but its log (TICKWHEEL_LOG_FORMAT=json)


def test_commands_that_read_every_partition_take_no_partition_count() -> None:
    found = dict(commands())
    assert "--partitions" not in options(found["timers list"])
    assert "--partitions" not in options(found["timers ledger"])
    assert "--partitions" not in options(found["timers upcoming"])
    for name in ("timers retry", "timers skip", "jobs list", "jobs enable"):
        assert "--partitions" in options(found[name]), name


def test_retry_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, str, AggregateRef, int]] = []

    async def retry(
        clients: Clients, type_name: str, op: TimerOp, partitions: int, wait_s: float
    ) -> Any:
        asked.append((clients.admin().where(), type_name, op.target, partitions))
        return Answered(op, partitions)  # sent, not waited for

    monkeypatch.setattr(app.cli.timers, "request_answered", retry)
    args = ["timers", "retry", "--type", "shop.order", "--target-id", "t-1", "--partitions", "3"]
    result = invoke([*args, "--bootstrap", "b:1", "--json", "--wait", "0"])
    assert result.exit_code == 0, result.output
    (line,) = result.stdout.splitlines()
    op = orjson.loads(line)
    target = AggregateRef(context="shop", aggregate="order", id="t-1")
    assert asked == [("b:1", "shop.order", target, 3)]
    assert (op["action"], op["type"], op["partitions"]) == ("retry", "shop.order", 3)
    assert op["target"] == target.model_dump(mode="json") and op["request_id"]


def test_jobs_enable_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    async def send(
        bootstrap: str, partitions: int, commands: Any, wait: float, replication: Any
    ) -> dict[str, Any]:
        return {}

    monkeypatch.setattr(app.cli.job_options, "send_and_wait", send)
    result = invoke(["jobs", "enable", *JOB, "--wait", "0", "--json"])
    assert result.exit_code == 0, result.output
    (line,) = result.stdout.splitlines()
    sent = orjson.loads(line)
    assert (sent["action"], sent["code"], sent["message"]) == ("enable", None, None)
    assert sent["instance"]["id"] == "unpaid-report" and sent["request_id"]


def test_rebuild_dry_run_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    topics = AggregateTopics("shop", "order")
    plan = RebuildPlan(
        group_id="g",
        members=0,
        types=(TypePlan(topics, (PartitionPlan(0, 2, 5, 7, Span(0, 9)),)),),
    )

    async def planned(bootstrap: str, group_id: str, types: Any) -> RebuildPlan:
        return plan

    monkeypatch.setattr(app.ops.rebuild, "plan_rebuild", planned)
    result = invoke(["rebuild", "--type", "shop.order", "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    (line,) = result.stdout.splitlines()
    assert orjson.loads(line) == {
        "outcome": "dry run",
        "may_run": True,
        "replay": None,
        "plan": {
            "group": "g",
            "members": 0,
            "types": [
                {
                    "type": "shop.order",
                    "changelog": "shop.order.timers",
                    "log": "shop.order.events",
                    "partitions": [
                        {
                            "partition": 0,
                            "changelog_start": 2,
                            "changelog_end": 5,
                            "committed": 7,
                            "replay_start": 0,
                            "replay_end": 9,
                        }
                    ],
                }
            ],
        },
    }


def test_the_demo_as_json_prints_its_timers_and_tells_its_story_on_stderr(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    owner = AggregateRef(context="shop", aggregate="order", id="order-1")
    row = Timer(
        id="t",
        owner=owner,
        key="deadline",
        version=1,
        partition=0,
        rule=OnceRule(at=5),
        target=owner,
        command=CommandSpec(type="Expire"),
        slot_due_at=5,
        due_at=5,
    )

    async def demo(clients: object, partitions: int, **kwargs: Any) -> dict[bytes, Timer]:
        kwargs["show"]("placed order-1")
        return {b"k": row}

    monkeypatch.setattr(app.demo, "run_demo", demo)
    result = invoke(["demo", "--json"])
    assert result.exit_code == 0, result.output
    assert result.stderr == "placed order-1\n"
    (line,) = result.stdout.splitlines()
    assert orjson.loads(line) == row.model_dump(mode="json")


def test_schemas_as_json(tmp_path: Path) -> None:
    written = invoke(["schemas", "--directory", str(tmp_path), "--json"])
    assert written.exit_code == 0, written.output
    paths = [orjson.loads(line)["written"] for line in written.stdout.splitlines()]
    assert paths and all(Path(p).parent == tmp_path for p in paths)
    checked = invoke(["schemas", "--check", "--directory", str(tmp_path), "--json"])
    assert checked.exit_code == 0
    assert orjson.loads(checked.stdout) == {"directory": str(tmp_path), "stale": []}
    Path(paths[0]).write_text("{}")
    stale = invoke(["schemas", "--check", "--directory", str(tmp_path), "--json"])
    assert stale.exit_code == 1
    assert orjson.loads(stale.stdout)["stale"] == [Path(paths[0]).name]


# --- the log -------------------------------------------------------------------------------


@pytest.fixture
def logs_something(monkeypatch: pytest.MonkeyPatch) -> None:
    async def listed(*args: Any, **kwargs: Any) -> list[Timer]:
        logging.getLogger("app.somewhere").info("read %d timers", 0)
        logging.getLogger("app.somewhere").debug("details")
        return []

    monkeypatch.setattr(app.cli.timers, "read_timers", listed)


@pytest.mark.usefixtures("logs_something")
def test_the_log_format_and_level_apply_to_a_command() -> None:
    result = invoke(["timers", "list", "--type", "a.b"], {"TICKWHEEL_LOG_FORMAT": "json"})
    assert result.exit_code == 0, result.output
    logged, summary = result.stderr.splitlines()
    record = orjson.loads(logged)
    assert set(record) == {"time", "level", "logger", "message"}
    assert (record["level"], record["logger"], record["message"]) == (
        "INFO",
        "app.somewhere",
        "read 0 timers",
    )
    assert summary == "0 timer(s)"

    text = invoke(["--log-level", "warning", "timers", "list", "--type", "a.b"])
    assert text.stderr == "0 timer(s)\n"
    debug = invoke(["--log-level", "DEBUG", "timers", "list", "--type", "a.b"])
    lines = [line for line in debug.stderr.splitlines() if "app.somewhere" in line]
    assert lines[0].endswith(" INFO    app.somewhere: read 0 timers")
    assert lines[1].endswith(" DEBUG   app.somewhere: details")


@pytest.mark.usefixtures("logs_something")
def test_a_command_leaves_logging_as_it_found_it() -> None:
    root, client = logging.getLogger(), logging.getLogger("aiokafka")
    before = (list(root.handlers), root.level, client.level)
    result = invoke(["--log-level", "DEBUG", "timers", "list", "--type", "a.b"])
    assert result.exit_code == 0
    assert (list(root.handlers), root.level, client.level) == before


def test_the_dotenv_of_the_working_directory_configures_a_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TICKWHEEL_PARTITIONS", raising=False)
    (tmp_path / ".env").write_text("TICKWHEEL_PARTITIONS=4\n")
    result = invoke(["jobs", "list", *DEMO])
    assert result.exit_code == 0, result.output
    assert result.stderr.endswith("1 context(s) with jobs, 4 partition(s)\n")
    (tmp_path / ".env").write_text("TICKWHEEL_PARTITION=4\n")
    result = invoke(["jobs", "list", *DEMO])
    assert result.exit_code == 2
    assert one_error_line(result) == (
        "error: TICKWHEEL_PARTITION (in .env) is no setting: did you mean TICKWHEEL_PARTITIONS?"
    )


def test_a_json_log_line_carries_the_exception() -> None:
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed %s", ("it",), None)
    try:
        raise ValueError("bad")
    except ValueError:
        record.exc_info = sys.exc_info()
    line = orjson.loads(JsonFormatter().format(record))
    assert (line["level"], line["logger"], line["message"]) == ("ERROR", "x", "failed it")
    assert line["exception"].startswith("Traceback") and "ValueError: bad" in line["exception"]
    assert line["time"].endswith("+00:00")


@pytest.mark.parametrize("wait", ["inf", "1e308", "601"])
def test_a_jobs_wait_past_ten_minutes_is_refused(wait: str) -> None:
    """With a broker and no worker, an endless wait never returned."""
    result = invoke(["jobs", "enable", *JOB, "--wait", wait])
    assert result.exit_code == 2, result.output
    assert "--wait" in result.output


def test_schemas_in_a_file_or_a_missing_directory_exit_2(tmp_path: Path) -> None:
    """A file as the directory was "unexpected FileExistsError"; a check of a directory
    that does not exist said its schemas were stale."""
    afile = tmp_path / "afile"
    afile.write_text("")
    for args in (["schemas", "--dir", str(afile)], ["schemas", "--check", "--dir", str(afile)]):
        result = invoke(args)
        assert result.exit_code == 2, result.output
        assert "is not a directory" in one_error_line(result)
    missing = tmp_path / "missing"
    result = invoke(["schemas", "--check", "--dir", str(missing)])
    assert result.exit_code == 2, result.output
    assert "no directory" in one_error_line(result) and not missing.exists()
    result = invoke(["schemas", "--dir", str(missing)])  # written: made as before
    assert result.exit_code == 0, result.output
    assert any(missing.iterdir())


def test_timers_set_refuses_a_zone_its_rule_keeps_not() -> None:
    """A once or interval rule has no zone: `--zone` with one was dropped without a word."""
    for rule in ("once:2030-01-01T00:00:00Z", "interval:1h"):
        result = invoke(
            [
                "timers", "set", "--type", "shop.reminders", "--owner", "o-42", "--key", "pay",
                "--rule", rule, "--target-type", "shop.order", "--command", "RemindToPay",
                "--zone", "Europe/Berlin", "--bootstrap", "127.0.0.1:1",
            ]
        )  # fmt: skip
        assert result.exit_code == 2, result.output
        assert "--zone" in one_error_line(result) and "cron" in one_error_line(result)
