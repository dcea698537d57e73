"""An `error:` line repeats a value it was given briefly and on one line: a long value its
first characters and its length (a 100,000-character value was repeated whole, a line of
100 KB), its control characters escaped (a newline in it made two lines, an escape
sequence reached the terminal). `test_cli_fuzz.py` holds every command to it."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from app.cli import cli
from app.cli.common import run
from app.errors import KafkaUnavailable

LONG = "x" * 100_000
CUT = f"{'x' * 80}…(100000 characters)"
OPTION_CUT = f"--{'x' * 78}…(100002 characters)"
REFUSED = {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"}  # nothing listens there: refused at once
SET = ["--owner", "o", "--key", "k", "--rule", "cron:* * * * *"]
SET += ["--target-type", "shop.order", "--command", "C"]


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["timers", "set", "--type", LONG, *SET], 2),  # the project's message, as repr
        (["timers", "list", "--type", "shop.order", "--status", LONG], 2),
        (["timers", "list", "--type", "shop.order", f"--{LONG}"], 2),  # click's, as it is
        (["timers", "list", "--type", "shop.order", f"--{LONG}=1"], 2),
        (["worker", "--log-level", LONG], 2),  # an option's callback
        (["rules", "next", LONG], 2),
        (["jobs", "list", "--service", "app.demo:service", "--context", LONG], 1),
        (["jobs", "list", "--service", LONG], 1),  # twice: the spec, the import's error
    ],
    ids=lambda v: " ".join(a[:20] for a in v) if isinstance(v, list) else str(v),
)
def test_an_error_repeats_a_long_value_cut(args: list[str], code: int) -> None:
    result = CliRunner().invoke(cli, args, env=REFUSED)
    assert result.exit_code == code, result.stderr[:300]
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ") and (CUT in line or OPTION_CUT in line), line[:300]
    assert len(line) < 400, line[:300]


def test_an_error_escapes_a_values_control_characters(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The message names the path as it is: its newline made a second line, its escape
    # sequence (a title change here) went to the terminal.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("")  # in the way: no directory can be made
    result = CliRunner().invoke(cli, ["schemas", "--dir", "a-file/s\n\x1b]0;owned\x07"])
    assert result.exit_code == 1, result.output
    (line,) = result.stderr.splitlines()
    assert line == (
        "error: cannot write the schemas in a-file/s\\x0a\\x1b]0;owned\\x07: Not a directory"
    )


def test_any_error_is_one_line_whoever_wrote_its_message(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A broker's (or a library's) text is repeated as it came.
    async def fails() -> None:
        raise KafkaUnavailable("broker down\nerror: forged\x1b[2J\x85\u2028" + LONG)

    with pytest.raises(typer.Exit):
        run(fails())
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: broker down\\x0aerror: forged\\x1b[2J\\x85\\u2028xxx")
    assert len(line) <= 1_000 and "characters left out" in line
