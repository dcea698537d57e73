"""`tickwheel timers --help` says what `retry` and `skip` do to the timer-ops topic: they
write to the one the workers made and create none (a type whose topic is not there is an
error, nothing sent), as they do and as docs/operations.md says. It said they created the
topic as a worker would."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import app.cli.common
import app.cli.timers
from app.cli import cli
from app.kafka.memory import MemoryLog


def _help() -> str:
    result = CliRunner().invoke(cli, ["timers", "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    # The text as one line: the help's box wraps it where the width falls.
    return " ".join(result.stdout.replace("│", " ").split())


@pytest.mark.parametrize("action", ["retry", "skip"])
def test_the_help_says_what_retry_and_skip_do_to_a_missing_topic(
    monkeypatch: pytest.MonkeyPatch, action: str
) -> None:
    log = MemoryLog([])

    async def no_check(kafka: object) -> None:
        return None

    monkeypatch.setattr(app.cli.timers, "clients_for", lambda settings: log)
    monkeypatch.setattr(app.cli.common, "check_access", no_check)
    args = ["timers", action, "--type", "shop.order", "--target-id", "o-42", "--wait", "0"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1 and "nothing was created or sent" in result.stderr, result.output
    assert log.topic_names() == set()
    shown = _help()
    assert "create the timer-ops topic" not in shown, shown
    assert (
        "`retry` and `skip` write requests to the timer-ops topic the workers make and create "
        "none either (not there: an error naming it, exit 1, nothing sent)"
    ) in shown, shown
