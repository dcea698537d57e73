"""`--help` shows every command's and option's text as written: typer renders it as rich
markup, where a bracket that opens a tag (`[@<start>]`, `[bold]`, `[/x]`) is eaten and
must be written `\\[`. `rules next` and `timers set` lost the interval's start syntax,
`interval:<every>[@<start>]`, that way."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import typer
from rich.errors import MarkupError
from rich.markup import render
from typer.testing import CliRunner

from app.cli import cli


def _texts(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, str]]:
    """Each help text of the command tree under `command`: (where, text)."""
    where = " ".join(("tickwheel", *path))
    yield where, command.help or ""
    for param in command.params:
        yield f"{where} {param.name}", getattr(param, "help", None) or ""
    for name, sub in getattr(command, "commands", {}).items():
        yield from _texts(sub, (*path, name))


def _lost(text: str) -> str | None:
    """What rich markup makes of `text` when it is not the text as written."""
    try:
        shown = render(text).plain
    except MarkupError as exc:
        return f"markup error: {exc}"
    return None if shown == text.replace("\\[", "[") else shown


def test_no_help_text_is_lost_to_markup() -> None:
    texts = list(_texts(typer.main.get_command(cli)))
    assert len(texts) > 100  # the whole tree was walked
    lost = {where: shown for where, text in texts if (shown := _lost(text)) is not None}
    assert lost == {}


@pytest.mark.parametrize("command", [["rules", "next"], ["timers", "set"]])
def test_the_help_shows_the_interval_start(command: list[str]) -> None:
    result = CliRunner().invoke(cli, [*command, "--help"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "interval:<every>[@<start>], once:<instant>" in result.stdout, result.stdout
