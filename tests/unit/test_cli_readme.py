"""The README's `tickwheel jobs|timers` command lines and TimerOptions table against the
real CLI and options (issue 10, item 10), and the read-only commands, which never create
a topic."""

from __future__ import annotations

import asyncio
import re
import shlex
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
import typer
from typer.testing import CliRunner

import app.cli.jobs
import app.kafka.admin
import app.ops.rebuild
import app.timers.ledger
import app.timers.operator
from app.cli import cli
from app.jobs import Job, JobScope
from app.kafka import TopicSpec, ensure_topics, existing_topics, topic_names
from app.node.settings import Settings
from app.service import Service
from app.timers.runner.options import RetryPolicy, TimerOptions
from tables import CronRule

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
DEMO = ["--service", "app.demo:service"]


def readme_commands() -> list[str]:
    """Every `tickwheel jobs …` / `tickwheel timers …` the README shows: inline code
    spans and lines of code blocks, whitespace made single."""
    spans = re.findall(r"(?<!`)`([^`]+)`(?!`)", README)
    blocks = re.findall(r"```sh\n(.*?)```", README, flags=re.S)
    lines = [line for block in blocks for line in block.splitlines()]
    found = []
    for text in [*spans, *lines]:
        text = " ".join(text.split())
        if re.match(r"tickwheel [a-z]", text):
            found.append(text)
    return found


GROUPS = ("jobs", "timers")


def expand(command: str) -> list[list[str]]:
    """The argument lists a README line stands for: `a|b` (sub)commands each, every
    optional `[…]` part given."""
    words = [w.removeprefix("[").removesuffix("]") for w in shlex.split(command)[1:]]
    if words[0] in GROUPS:
        return [[words[0], s, *words[2:]] for s in words[1].split("|")]
    return [[c, *words[1:]] for c in words[0].split("|")]


def test_the_readme_shows_commands_of_both_groups() -> None:
    groups = {c.split()[1] for c in readme_commands()}
    assert {"jobs", "timers", "worker"} <= groups
    subs = {
        (c.split()[1], s)
        for c in readme_commands()
        if c.split()[1] in GROUPS
        for s in c.split()[2].split("|")
    }
    assert {("jobs", "list"), ("jobs", "enable"), ("timers", "list"), ("timers", "retry")} <= subs


@pytest.mark.parametrize("command", readme_commands())
def test_every_readme_command_line_parses(command: str) -> None:
    root: Any = typer.main.get_command(cli)
    for args in expand(command):
        depth = 2 if args[0] in GROUPS else 1
        found = root
        for name in args[:depth]:
            found = found.commands.get(name)
            assert found is not None, f"no command {args[:depth]}"
        # Parses and validates every option as the real command would; runs nothing.
        found.make_context(" ".join(args[:depth]), args[depth:])


def test_jobs_list_takes_the_readmes_job_option() -> None:
    result = CliRunner().invoke(
        cli, ["jobs", "list", *DEMO, "--context", "shop", "--job", "unpaid-report"]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.split("\t")[:2] == ["shop", "unpaid-report"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--job", "nope"], "unknown job 'nope' in any context (jobs: unpaid-report)"),
        (["--context", "shop", "--job", "nope"], "unknown job 'nope' in shop"),
    ],
)
def test_jobs_list_of_an_unknown_job_says_which_exist(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["jobs", "list", *DEMO, *args])
    assert result.exit_code == 1 and message in result.stderr, result.output


# --- TimerOptions --------------------------------------------------------------------------


def _table_row(field: str) -> str:
    (row,) = [line for line in README.splitlines() if line.startswith(f"| `{field}` |")]
    return row


def _json_default(value: Any) -> str:
    return orjson.dumps(value).decode()


def test_the_readme_names_every_option_with_its_json_default() -> None:
    defaults = TimerOptions().model_dump(mode="json")
    retry = defaults.pop("retry")
    assert set(retry) == set(RetryPolicy.model_fields)
    for name, value in [*defaults.items(), *((f"retry.{k}", v) for k, v in retry.items())]:
        row = _table_row(name)
        assert f"`{_json_default(value)}`" in row, (name, value, row)


def test_the_readmes_timer_options_example_is_taken_as_written() -> None:
    (text,) = re.findall(r"TICKWHEEL_TIMER_OPTIONS='([^']*)'", README)
    options = Settings.from_env({"TICKWHEEL_TIMER_OPTIONS": text}).timers
    assert options.claim_timeout == 5000 and options.retry.max_attempts == 10


# --- read-only commands create no topic ----------------------------------------------------


@pytest.fixture
def no_topic_creation(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """No topic exists, and any attempt to create one, delete records or set a group's
    offsets fails the test."""
    asked: list[str] = []

    async def none_exist(bootstrap: str, names: Any) -> dict[str, int]:
        asked.extend(names)
        return {}

    async def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"a read-only command changed the cluster: {args}")

    monkeypatch.setattr(app.kafka.admin, "existing_topics", none_exist)
    monkeypatch.setattr(app.timers.operator, "existing_topics", none_exist)
    for module in (app.kafka.admin, app.timers.operator, app.timers.ledger, app.cli.jobs):
        if hasattr(module, "ensure_topics"):
            monkeypatch.setattr(module, "ensure_topics", refuse)
    for name in ("delete_records", "reset_group_offsets"):
        monkeypatch.setattr(app.ops.rebuild, name, refuse)
    return asked


@pytest.mark.parametrize(
    ("args", "asked", "message"),
    [
        (
            ["timers", "list", "--type", "shop.order"],
            ["shop.order.timers"],
            "topic shop.order.timers does not exist at broker:9092",
        ),
        (
            ["timers", "list", "--type", "shop.order", "--status", "PARKED"],
            ["shop.order.timers"],
            "topic shop.order.timers does not exist at broker:9092",
        ),
        (
            ["timers", "ledger", "--context", "shop"],
            ["shop.failure-ledger"],
            "topic shop.failure-ledger does not exist at broker:9092",
        ),
        (
            ["jobs", "list", *DEMO, "--state"],
            ["shop.schedule.events"],
            "topic shop.schedule.events does not exist at broker:9092",
        ),
        (
            ["timers", "show", "--type", "shop.order", "--owner", "o-42"],
            ["shop.order.events", "shop.order.timers"],
            "unknown type shop.order: topics shop.order.events and shop.order.timers do not "
            "exist at broker:9092",
        ),
        (
            ["rebuild", "--type", "shop.order", "--dry-run"],
            ["shop.order.events", "shop.order.timers"],
            "topic shop.order.events does not exist at broker:9092",
        ),
    ],
)
def test_a_read_only_command_says_a_topic_is_missing_and_creates_none(
    no_topic_creation: list[str], args: list[str], asked: list[str], message: str
) -> None:
    result = CliRunner().invoke(cli, [*args, "--bootstrap", "broker:9092"])
    assert result.exit_code == 1, result.output
    assert f"error: {message}" in result.stderr
    assert "nothing was created" in result.stderr
    assert "Traceback" not in result.output
    assert no_topic_creation == asked


RO_CONTEXT = f"ro{uuid.uuid4().hex[:10]}"
RO_SERVICE = Service(
    aggregates=(),
    jobs={RO_CONTEXT: (Job("nightly", JobScope.SYSTEM, CronRule(expr="0 3 * * *"), print),)},
)
"""A service of a context no other test has: its topics are not on the broker."""


def _read_only_commands(context: str) -> list[list[str]]:
    return [
        ["timers", "list", "--type", f"{context}.order"],
        ["timers", "list", "--type", f"{context}.order", "--status", "PARKED", "--json"],
        ["timers", "show", "--type", f"{context}.order", "--owner", "o-42"],
        ["timers", "show", "--type", f"{context}.order", "--owner", "o-42", "--key", "k"],
        ["timers", "ledger", "--context", context],
        ["jobs", "list", "--service", f"{__name__}:RO_SERVICE", "--state"],
        ["rebuild", "--type", f"{context}.order", "--dry-run"],
    ]


def _topics(bootstrap: str) -> set[str]:
    """The broker's topics but its own: on a new cluster the broker creates its internal
    `__consumer_offsets` on the first look-up of any group (a dry run's)."""
    return {t for t in asyncio.run(topic_names(bootstrap)) if not t.startswith("__")}


@pytest.mark.kafka
def test_read_only_commands_create_no_topic_on_a_real_broker(kafka_bootstrap: str) -> None:
    context = RO_CONTEXT
    runner = CliRunner()
    env = {"TICKWHEEL_GROUP_ID": f"g-{context}"}
    before = _topics(kafka_bootstrap)
    for args in _read_only_commands(context):
        result = runner.invoke(cli, [*args, "--bootstrap", kafka_bootstrap], env=env)
        assert result.exit_code == 1 and "not exist at" in result.stderr, (args, result.output)
        assert "nothing was created" in result.stderr, (args, result.output)
    assert _topics(kafka_bootstrap) == before

    # Once a worker made them, the same commands read them, and still create nothing.
    topics = [f"{context}.order.events", f"{context}.order.timers", f"{context}.failure-ledger"]
    topics.append(f"{context}.schedule.events")
    asyncio.run(ensure_topics(kafka_bootstrap, [TopicSpec(t, 3, compacted=True) for t in topics]))
    before = _topics(kafka_bootstrap)
    for args in _read_only_commands(context):
        result = runner.invoke(cli, [*args, "--bootstrap", kafka_bootstrap], env=env)
        if args[:2] == ["timers", "show"]:
            assert result.exit_code == 1, (args, result.output)
            assert f"{context}.order/(0)/o-42 has no timers in {context}.order.timers[" in (
                result.stderr
            )
        else:
            assert result.exit_code == 0, (args, result.output)
    assert _topics(kafka_bootstrap) == before
    assert asyncio.run(existing_topics(kafka_bootstrap, topics)) == dict.fromkeys(topics, 3)
    listed = runner.invoke(
        cli, ["timers", "list", "--type", f"{context}.order", "--bootstrap", kafka_bootstrap]
    )
    assert "0 timer(s)" in listed.stderr, listed.output
    ledger = runner.invoke(
        cli, ["timers", "ledger", "--context", context, "--bootstrap", kafka_bootstrap]
    )
    assert "0 open entries" in ledger.stderr, ledger.output


def _readme_read_only() -> list[list[str]]:
    """The README's read-only operator command lines, every optional part given."""
    found = []
    for command in readme_commands():
        for args in expand(command):
            if args[:2] in (["timers", "list"], ["timers", "show"], ["timers", "ledger"]) or (
                args[0] == "rebuild" and "--dry-run" in args
            ):
                found.append(args)
    return found


def test_the_readme_shows_the_read_only_operator_commands() -> None:
    shown = {tuple(a[:2]) for a in _readme_read_only()}
    assert {("timers", "list"), ("timers", "show"), ("timers", "ledger")} <= shown
    assert ("rebuild", "--type") in shown


@pytest.mark.kafka
@pytest.mark.parametrize("args", _readme_read_only(), ids=" ".join)
def test_the_readmes_read_only_commands_run_as_written_and_create_nothing(
    kafka_bootstrap: str, args: list[str]
) -> None:
    """Run against the broker as written: they read what is there (the shop topics exist
    where the demo ran) or say what is not, and change no topic either way."""
    before = _topics(kafka_bootstrap)
    result = CliRunner().invoke(cli, [*args, "--bootstrap", kafka_bootstrap])
    assert "Traceback" not in result.output
    if result.exit_code != 0:
        assert result.exit_code == 1, result.output
        assert re.search(r"not exist at|has no timers? |running worker", result.stderr), (
            result.output
        )
    assert _topics(kafka_bootstrap) == before
