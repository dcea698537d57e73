"""`tickwheel … | head`: the reader of stdout gone before the command is done. A command
ended there with `error: unexpected BrokenPipeError` and exit 1 (the help too, from
click's or rich's own handling, exit 1); now quietly, exit 141 (`READER_GONE`), whichever
writes it: a command's `typer.echo`, the help (rich), the last flush at the exit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli.main import READER_GONE

ROOT = Path(__file__).resolve().parents[2]


def run_into_a_closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    """Runs `tickwheel args` with stdout a pipe whose reader has gone (closed before the
    command starts: its first write fails, with no race on how much a reader took)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [sys.executable, "-m", "app.cli", *args],
            cwd=ROOT,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    finally:
        os.close(write)


@pytest.mark.parametrize(
    "args",
    [
        ["schemas", "--dir", "{tmp}"],  # a command's own lines (typer.echo)
        ["--help"],  # the root's help, by rich
        ["timers", "--help"],  # a group's, parsed inside the root's invoke
        ["--version"],  # one short line: fails at the last flush
    ],
    ids=["command", "help", "group-help", "flush-at-exit"],
)
def test_a_reader_gone_ends_the_command_quietly(args: list[str], tmp_path: Path) -> None:
    done = run_into_a_closed_pipe(*(a.format(tmp=tmp_path) for a in args))
    assert done.stderr == ""
    assert done.returncode == READER_GONE == 141
