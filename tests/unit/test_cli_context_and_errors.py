"""A context's name is checked once for every command that takes `--context` (exit code 2,
a value the command cannot take), and `tickwheel timers list` shows a row's last error
(#22)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

import app.cli.timers
from app.cli import cli
from app.cli.common import CONFIG_ERROR
from tables import AggregateRef, CommandSpec, OnceRule, Timer, TimerStatus

OWNER = AggregateRef(context="shop", aggregate="order", id="o-1")


@pytest.mark.parametrize(
    "args",
    [
        ["timers", "ledger", "--context", "a/b"],
        ["dead-letters", "list", "--context", "a/b"],
        ["dead-letters", "show", "--context", "a/b", "--partition", "0", "--offset", "0"],
        ["dead-letters", "replay", "--context", "a/b", "--partition", "0", "--offset", "0"],
    ],
)
def test_a_bad_context_name_exits_2_with_one_message(args: list[str]) -> None:
    # An unreachable broker: the name is refused before anything would connect.
    result = CliRunner().invoke(cli, [*args, "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == CONFIG_ERROR, result.output
    assert result.stderr == "error: context 'a/b' must be letters, digits, '_' or '-'\n"


def _row(key: str, error_code: str | None, error_text: str | None) -> Timer:
    return Timer(
        id=f"t-{key}",
        owner=OWNER,
        key=key,
        version=1,
        partition=0,
        status=TimerStatus.PARKED if error_code else TimerStatus.PENDING,
        rule=OnceRule(at=1_000),
        target=OWNER,
        command=CommandSpec(type="Remind"),
        slot_due_at=1_000,
        due_at=1_000,
        attempts=3 if error_code else 0,
        error_code=error_code,
        error_text=error_text,
    )


ROWS = [_row("failed", "REJECTED", "no such order\tgone"), _row("fine", None, None)]


@pytest.fixture
def rows(monkeypatch: pytest.MonkeyPatch) -> None:
    async def read_timers(bootstrap: Any, type_name: str, **kw: Any) -> Sequence[Timer]:
        assert type_name == "shop.order"
        return ROWS

    monkeypatch.setattr(app.cli.timers, "read_timers", read_timers)


@pytest.mark.usefixtures("rows")
def test_timers_list_shows_a_rows_error_code_and_text() -> None:
    result = CliRunner().invoke(
        cli, ["timers", "list", "--type", "shop.order", "--bootstrap", "b:1"]
    )
    assert result.exit_code == 0, result.output
    failed, fine = result.stdout.splitlines()
    # The text quoted as JSON: a tab in it does not split the line's columns.
    assert failed.endswith('\terror REJECTED "no such order\\tgone"'), failed
    assert failed.split("\t")[1] == "PARKED"
    assert "error" not in fine


@pytest.mark.usefixtures("rows")
def test_timers_list_json_has_the_error_fields() -> None:
    result = CliRunner().invoke(
        cli, ["timers", "list", "--type", "shop.order", "--bootstrap", "b:1", "--json"]
    )
    assert result.exit_code == 0, result.output
    got = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert [(r.get("error_code"), r.get("error_text")) for r in got] == [
        ("REJECTED", "no such order\tgone"),
        (None, None),
    ]
