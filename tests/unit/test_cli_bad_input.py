"""Bad input on the command line found by `test_cli_fuzz.py`, each by example: one
`error:` line and exit code 2 for a value the command cannot take (1 for a command that
ran and failed), never the catch-all's `unexpected …`, and nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

import app.cli.timer_changes
import app.cli.timers
import app.cli.worker
from app.cli import cli
from app.kafka.memory import MemoryLog
from app.node import node_topics
from app.protocol.topics import AggregateTopics

REFUSED = ["--bootstrap", "127.0.0.1:1"]  # nothing listens there: refused at once
SERVICE = ["--service", "app.demo:service", "--context", "shop", "--job", "unpaid-report"]


def invoke(args: list[str]) -> Result:
    return CliRunner().invoke(cli, args)


def one_error(result: Result, code: int) -> str:
    assert result.exit_code == code, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ") and "unexpected" not in line, line
    return line


# --- a value that is not UTF-8 -----------------------------------------------------------
# On POSIX a command line's bytes that are not UTF-8 reach Python as lone surrogates
# (`tickwheel timers retry … --request-id $'\xff'`).


@pytest.mark.parametrize(
    ("args", "where"),
    [
        (
            [
                *("timers", "retry", "--type", "shop.order", "--target-id", "t"),
                "--request-id",
                "a\udcff",
            ],
            "the value after --request-id",
        ),
        (
            ["timers", "skip", "--type", "shop.order", "--target-id", "t", "--request-id=\udcff"],
            "the value of --request-id",
        ),
        (["jobs", "trigger", *SERVICE, "--request-id", "\udcff"], "the value after --request-id"),
        (["jobs", "enable", *SERVICE, "--request-id", "\udcff"], "the value after --request-id"),
        (
            [
                *("timers", "set", "--type", "shop.order", "--owner", "o", "--key", "k"),
                *("--rule", "cron:* * * * *", "--target-type", "shop.order", "--command", "C"),
                *("--body", '{"a": "\udcff"}'),
            ],
            "the value after --body",
        ),
        (["rules", "next", "cron:\udcff"], "argument 3 of the command line"),
    ],
)
def test_a_value_not_utf8_is_refused_before_anything_is_sent(
    monkeypatch: pytest.MonkeyPatch, args: list[str], where: str
) -> None:
    # A cluster that takes anything: without the check, the commands failed as they built
    # what they would send (`unexpected ValidationError`, over 4 lines; `unexpected
    # TypeError` for --body), exit code 1.
    log = MemoryLog(node_topics([AggregateTopics("shop", "order")], 12))
    monkeypatch.setattr(app.cli.timers, "clients_for", lambda settings: log)
    line = one_error(invoke([*args, *REFUSED] if args[0] != "rules" else args), 2)
    assert line == f"error: {where} is not valid UTF-8 text"
    assert not [t for t in log.topic_names() for p in range(log.partitions(t)) if log.records(t, p)]


def test_a_schemas_directory_not_utf8_is_refused_and_nothing_written(tmp_path: Path) -> None:
    # It was written, and printing its path failed on a strict stdout (exit code 1).
    where = tmp_path / "a\udcffb"
    line = one_error(invoke(["schemas", "--dir", str(where)]), 2)
    assert line == "error: the value after --dir is not valid UTF-8 text"
    assert list(tmp_path.iterdir()) == []


# --- tickwheel schemas --dir -------------------------------------------------------------


def test_a_schemas_directory_the_system_cannot_name_is_a_bad_option(tmp_path: Path) -> None:
    # The OS's error went to the catch-all: `unexpected OSError`, exit code 1.
    where = tmp_path / ("x" * 300)  # past any file system's longest name
    for check in ([], ["--check"]):
        line = one_error(invoke(["schemas", "--dir", str(where), *check]), 2)
        cut = f"{str(where)[:80]}…({len(str(where))} characters)"  # as any long value
        assert line == f"error: --dir {cut}: File name too long"


def test_an_empty_schemas_directory_is_a_bad_option(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # "" was the working directory: the schemas written there.
    monkeypatch.chdir(tmp_path)
    line = one_error(invoke(["schemas", "--dir", ""]), 2)
    assert line.startswith("error: Invalid value for '--dir' / '--directory': a directory path")
    assert list(tmp_path.iterdir()) == []


def test_a_schemas_directory_with_a_nul_character_is_a_bad_option() -> None:
    # pathlib's is_dir said False for it, then the write raised ValueError: "unexpected".
    for check in ([], ["--check"]):
        line = one_error(invoke(["schemas", "--dir", "./x\x00", *check]), 2)
        assert "a directory path holds no NUL character" in line, line


def test_schemas_that_cannot_be_written_say_where(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    where = tmp_path / "a-file" / "schemas"  # a file in the way: no directory can be made
    line = one_error(invoke(["schemas", "--dir", str(where)]), 1)
    assert line == f"error: cannot write the schemas in {where}: Not a directory"
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"]


# --- --log-level ---------------------------------------------------------------------------


def test_a_log_level_is_ascii_as_the_variables_is(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A dotless i upper-cased is an ASCII I: "\u0131nfo" was INFO here (the worker started),
    # and is refused as TICKWHEEL_LOG_LEVEL.
    started = []

    async def run_worker(settings: object, service: object) -> None:
        started.append(settings)

    monkeypatch.setattr(app.cli.worker, "_run_worker", run_worker)
    for args in (
        ["--log-level", "\u0131nfo", "schemas", "--dir", str(tmp_path)],
        ["worker", "--log-level", "\u0131nfo"],
    ):
        line = one_error(invoke(args), 2)
        assert line.startswith("error: Invalid value for '--log-level': '\u0131nfo' is not one")
    assert list(tmp_path.iterdir()) == [] and started == []


@pytest.mark.parametrize("data_dir", ["", "  "])
def test_an_empty_data_dir_is_a_bad_option(monkeypatch: pytest.MonkeyPatch, data_dir: str) -> None:
    # Click made Path("") of "": the worker started on the working directory as its data
    # directory (an unset shell variable, `--data-dir "$DIR"`).
    started = []

    async def run_worker(settings: object, service: object) -> None:
        started.append(settings)

    monkeypatch.setattr(app.cli.worker, "_run_worker", run_worker)
    line = one_error(invoke(["worker", "--data-dir", data_dir]), 2)
    assert line.startswith("error: Invalid value for '--data-dir': a directory path, not empty")
    assert started == []


# --- rebuild --type ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a/b", "nodot", ""])
def test_a_rebuild_type_that_names_no_type_is_a_bad_option(name: str) -> None:
    # Exit code 2, as `timers list --type a/b` (was 1, as for a cluster that failed).
    line = one_error(invoke(["rebuild", "--type", name, "--dry-run", *REFUSED]), 2)
    assert line == (
        f"error: aggregate type {name!r} must be '<context>.<aggregate>' "
        "(letters, digits, '_' or '-')"
    )


# --- --request-id --------------------------------------------------------------------------

TIMER = ["--type", "shop.order", "--owner", "o", "--key", "k"]
SET = ["--rule", "cron:* * * * *", "--target-type", "shop.payment", "--command", "C"]
SENDS_CHANGES = [
    ["timers", "set", *TIMER, *SET],
    *(["timers", action, *TIMER] for action in ("cancel", "pause", "resume", "trigger")),
    *(
        ["timers", action, "--type", "shop.order", "--target-id", "t"]
        for action in ("retry", "skip")
    ),
    *(["jobs", action, *SERVICE] for action in ("enable", "disable", "reschedule", "trigger")),
]


@pytest.mark.parametrize(
    "request_id", ["", " ", "\t", " r-1", "r-1\n", "r\n1", "r\x1b[2J1", "r\x00"]
)
@pytest.mark.parametrize("args", SENDS_CHANGES, ids=lambda args: " ".join(args[:2]))
def test_a_blank_or_control_request_id_is_a_bad_option(
    monkeypatch: pytest.MonkeyPatch, args: list[str], request_id: str
) -> None:
    # The timers commands took them (and the jobs ones one with a control character
    # inside): a blank one as none (`cancel --request-id ''` made a fresh one, which the
    # same command line sent again could not repeat), and a newline in the one printed to
    # send it again broke that line in two. A cluster that takes anything: nothing sent.
    log = MemoryLog(node_topics([AggregateTopics("shop", "order")], 12))
    for module in (app.cli.timers, app.cli.timer_changes):
        monkeypatch.setattr(module, "clients_for", lambda settings: log)
    wait = [] if args[1] in ("retry", "skip") else ["--wait", "0"]  # no answer waited for
    line = one_error(invoke([*args, "--request-id", request_id, *wait, *REFUSED]), 2)
    # The jobs' message (`app.ops.job_api`), with the command's own longest.
    longest = 300 if args[1] in ("set", "cancel", "pause", "resume") else 200
    longest = 298 if args[:2] == ["timers", "trigger"] else longest
    assert line == (
        f"error: --request-id {request_id!r}: give 1-{longest} characters, "
        "no surrounding spaces or control characters"
    )
    assert not [t for t in log.topic_names() for p in range(log.partitions(t)) if log.records(t, p)]


@pytest.mark.parametrize("seconds", ["inf", "1e309", "86401"])
def test_the_demos_seconds_are_bounded(seconds: str) -> None:
    """`inf` (or 1e309) ran the demo for ever: refused before anything is made."""
    result = invoke(["demo", *REFUSED, "--seconds", seconds])
    assert result.exit_code == 2, result.output
    assert "--seconds" in result.output
