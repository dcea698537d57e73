"""Names in a `.env` file the settings would pass over without a word, now refused: the
file naming another (`TICKWHEEL_ENV_FILE` is read from the environment only), a setting
behind an invisible mark (a pasted zero-width space or direction mark), and thousands of
unknown names (named up to `MAX_PROBLEMS`, the rest counted: matching each for a
suggestion took a minute and a 2 MB error)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.errors import ConfigError
from app.node.settings import Settings
from app.node.variables import MAX_PROBLEMS


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith(("TICKWHEEL_", "KAFKA_")):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def test_a_file_naming_another_is_refused(tmp_path: Path) -> None:
    (tmp_path / "prod.env").write_text("TICKWHEEL_PARTITIONS=7\n")
    (tmp_path / ".env").write_text("TICKWHEEL_ENV_FILE=prod.env\n")
    with pytest.raises(ConfigError, match=r"TICKWHEEL_ENV_FILE \(in .env\) is read from"):
        Settings.from_env()


@pytest.mark.parametrize("mark", ["\u200b", "\u200f", "\ufeff\u200b"])
def test_a_setting_behind_an_invisible_mark_is_refused(tmp_path: Path, mark: str) -> None:
    env = tmp_path / "x.env"
    env.write_text(f"{mark}TICKWHEEL_PARTITIONS=7\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="holds invisible characters: TICKWHEEL_PARTITIONS"):
        Settings.from_env({"TICKWHEEL_ENV_FILE": str(env)})


def test_thousands_of_unknown_names_are_named_up_to_a_bound(tmp_path: Path) -> None:
    env = tmp_path / "x.env"
    env.write_text("".join(f"TICKWHEEL_NO_SUCH_{i}=1\n" for i in range(5_000)))
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({"TICKWHEEL_ENV_FILE": str(env)})
    said = str(raised.value)
    assert said.count("did you mean") == MAX_PROBLEMS
    assert said.endswith(f"and {5_000 - MAX_PROBLEMS} more")
