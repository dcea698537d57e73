"""A `.env` file of odd content, read as python-dotenv reads it (quotes, `export`,
comments, CRLF, a BOM, `${VAR}` resolved) and never slowly: reading it looks at the
environment a bounded number of times, not once per line of the file."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from dotenv import dotenv_values

from app.node.variables import _dotenv, read_variables

ODD = [
    "# a comment\nA=1\n\nexport B='two words'\nC=\"x\\ny\"\n",
    "A=1\r\nB=2\r\n",  # CRLF
    "A=1\rB=2\r",  # CR alone
    "\ufeffA=1\n",  # a BOM
    "A=1\nA=2\n",  # a duplicate key: the last one
    "A\nB=\nC= spaced \n",  # no value, an empty one, blanks
    "A=x\nB=${A}-${HOME}-${NOPE}-${NOPE:-d}-${A:-unused}\nC='${A}'\nD=${B}${B}\n",
    "B=${A}\nA=later\n",  # a variable above it, else the environment's
    "A\nB=${A:-d}\n",  # a variable of no value is empty, not its default
]


@pytest.mark.parametrize("text", ODD)
def test_a_dotenv_file_reads_as_python_dotenv_reads_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, text: str
) -> None:
    dotenv = tmp_path / "x.env"
    dotenv.write_bytes(text.encode())
    monkeypatch.setenv("HOME", "/home/h")
    monkeypatch.setenv("A", "from-env")
    got = _dotenv(dotenv, "x.env", os.environ)
    assert got == dotenv_values(dotenv, encoding="utf-8")


class Watched(Mapping[str, str]):
    """An environment that counts its reads (each variable looked up or listed)."""

    def __init__(self, values: Mapping[str, str]) -> None:
        self._values = dict(values)
        self.reads = 0

    def __getitem__(self, key: str) -> str:
        self.reads += 1
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        self.reads += len(self._values)
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


def test_a_dotenv_file_of_many_lines_reads_the_environment_once(tmp_path: Path) -> None:
    # python-dotenv copied the whole environment for each variable of the file: 60,000
    # short lines (under the 1 MiB bound) took three minutes before the worker started.
    lines = 3_000
    dotenv = tmp_path / "x.env"
    dotenv.write_text("".join(f"OTHER_{i}=v{i}\n" for i in range(lines)))
    environ = Watched({"TICKWHEEL_ENV_FILE": str(dotenv), **{f"E{i}": "e" for i in range(100)}})
    with pytest.MonkeyPatch.context() as mp:  # put back before pytest writes to it
        mp.setattr(os, "environ", environ)
        assert read_variables() == {}
    assert environ.reads < lines, environ.reads  # was some 600,000
