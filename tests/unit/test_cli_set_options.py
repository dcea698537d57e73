"""`tickwheel timers set`'s errors name the option at fault: a bad `--target-type`,
`--command` or `--target` was named by the model's field (`type`, `id`, `target.id`),
which read as `--type` or as the owner's id."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from app.cli import cli

SET = ["timers", "set", "--type", "shop.order", "--owner", "o-1", "--key", "k", "--rule"]
SET += ["interval:1h", "--target-type", "shop.report", "--command", "Remind", "--wait", "0"]


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (["--target-type", "nodot"], "--target-type: String should match pattern"),
        (["--target-type", ""], "--target-type: String should have at least 3 characters"),
        (["--target-type", f"{'x' * 300}.y"], "--target-type: String should have at most"),
        (["--command", ""], "--command: String should have at least 1 character"),
        (["--command", "x" * 201], "--command: String should have at most 200 characters"),
        (["--target", ""], "--target: String should have at least 1 character"),
        (["--target", "a\x01"], "--target: Value error, holds the control character U+0001"),
        # as they were: the owner's options, named as owner_ref names them
        (["--owner", ""], "owner: String should have at least 1 character"),
        (["--key", ""], "key: String should have at least 1 character"),
    ],
)
def test_a_bad_option_of_set_is_named(given: list[str], said: str) -> None:
    result = CliRunner().invoke(cli, [*SET, *given, "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and result.stderr.startswith(f"error: {said}"), result.stderr
