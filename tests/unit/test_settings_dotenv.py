"""A `.env` file of odd content, read as python-dotenv reads it (quotes, `export`,
comments, CRLF, a BOM, `${VAR}` resolved) and never slowly: reading it looks at the
environment a bounded number of times, not once per line of the file. A line that
cannot be read is an error when it names a setting (python-dotenv passed it over)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from dotenv import dotenv_values

from app.errors import ConfigError
from app.node.settings import Settings
from app.node.variables import MAX_ENV_FILE_BYTES, _dotenv, read_variables

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


@pytest.mark.parametrize(
    ("text", "lines"),
    [
        ('TICKWHEEL_GROUP_ID="shop-timers\n', "line 1 is"),  # an unclosed quote
        ("A=1\n  KAFKA_SASL_PASSWORD='s3cret\n", "line 2 is"),
        ('TICKWHEEL GROUP_ID=g\nexport TICKWHEEL_PARTITIONS=\'4\nB="x" y\n', "lines 1, 2 are"),
    ],
)
def test_a_line_naming_a_setting_that_cannot_be_read_is_an_error(
    tmp_path: Path, text: str, lines: str
) -> None:
    # python-dotenv passed it over with a warning: the group id silently the default one.
    dotenv = tmp_path / "x.env"
    dotenv.write_text(text)
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"TICKWHEEL_ENV_FILE": str(dotenv)})
    assert str(caught.value) == (
        f"TICKWHEEL_ENV_FILE: cannot read {dotenv}: {lines} no VARIABLE=value (an unclosed "
        "quote, a blank in a name?) naming a setting, which would be left unset"
    )
    assert "s3cret" not in str(caught.value)


def test_another_programs_line_that_cannot_be_read_is_passed_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dotenv = tmp_path / "x.env"
    dotenv.write_text('COMPOSE_X="unclosed\nTICKWHEEL_PARTITIONS=4\n')
    assert Settings.from_env({"TICKWHEEL_ENV_FILE": str(dotenv)}).partitions == 4
    assert f"line 1 of {dotenv} is no VARIABLE=value: passed over" in caplog.text


@pytest.mark.parametrize(
    ("text", "line"),
    [
        # Each line twice the one above: 2 KiB on line 2, 1 MiB past on line 12. Another 16
        # lines and python-dotenv's values filled any memory (this stops at 16 MiB).
        (
            "A0="
            + "x" * 1024
            + "\n"
            + "".join(f"A{i}=${{A{i - 1}}}${{A{i - 1}}}\n" for i in range(1, 15)),
            12,
        ),
        ("A=" + "x" * 1024 + "\nB=" + "${A}" * 2_000 + "\n", 2),  # 2 MiB on one line
    ],
)
def test_a_value_that_grows_past_the_files_bound_is_an_error(
    tmp_path: Path, text: str, line: int
) -> None:
    dotenv = tmp_path / "x.env"
    dotenv.write_text(text)
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"TICKWHEEL_ENV_FILE": str(dotenv)})
    assert str(caught.value) == (
        f"TICKWHEEL_ENV_FILE: cannot read {dotenv}: line {line}'s value, its ${{…}} replaced, "
        f"is longer than {MAX_ENV_FILE_BYTES} characters"
    )


def test_a_file_variable_whose_path_holds_a_nul_is_an_error(tmp_path: Path) -> None:
    # os.stat raised ValueError ("embedded null byte"): the command's catch-all, exit code 1.
    dotenv = tmp_path / "x.env"
    dotenv.write_text("TICKWHEEL_WEB_TOKEN_FILE=/run/secrets/a\x00b\n")
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"TICKWHEEL_ENV_FILE": str(dotenv)})
    assert str(caught.value) == (
        f"TICKWHEEL_WEB_TOKEN_FILE (in {dotenv}): cannot read '/run/secrets/a\\x00b': "
        "a NUL character in the path"
    )
