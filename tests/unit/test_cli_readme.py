"""The docs' `tickwheel` command lines (README.md and docs/*.md) and TimerOptions table
against the real CLI and options (issue 10, item 10), and the read-only commands, which
never create a topic.

Every `tickwheel …` line of the docs (inline code spans and lines of ```sh blocks) is
parsed as the real command parses it; those that need no broker run as written (`tickwheel
--version`, `tickwheel schemas …`, `tickwheel jobs list` without `--state`, with the docs'
service modules importable); the read-only ones run against the real broker
(`-m kafka`). The docs' `export` lines, `.env` example and Kubernetes probes are checked
against the settings and the HTTP edge.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import typer
import yaml
from fakes import DOCS, ROOT, doc_modules
from typer.testing import CliRunner

import app.cli.jobs
import app.kafka.admin
import app.ops.rebuild
import app.timers.ledger
import app.timers.operator
from app.cli import cli
from app.cli.main import version_line
from app.jobs import Job, JobScope
from app.kafka import TopicSpec, ensure_topics, existing_topics, topic_names
from app.node.settings import ENV_FILE_VARIABLE, TOOLING_VARIABLES, VARIABLES, Settings
from app.service import Service
from app.timers.runner.options import RetryPolicy, TimerOptions
from tables import CronRule

TEXTS = {path: path.read_text() for path in DOCS}
DEMO = ["--service", "app.demo:service"]
BACKFILL = ["jobs", "backfill", *DEMO, "--context", "shop", "--job", "unpaid-report"]
BACKFILL += ["--from", "2026-11-01T00:00:00+01:00", "--until", "2026-11-02T00:00:00+01:00"]


def sh_blocks(text: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", text, flags=re.S)


def readme_commands() -> list[str]:
    """Every `tickwheel …` the README and docs/ show: inline code spans and lines of code
    blocks, whitespace made single."""
    found = []
    for text in TEXTS.values():
        spans = re.findall(r"(?<!`)`([^`]+)`(?!`)", text)
        lines = [line for block in sh_blocks(text) for line in block.splitlines()]
        for line in [*spans, *lines]:
            line = " ".join(line.split("  #")[0].split())  # a comment after the command
            line = re.sub(r"^(?:[A-Z_]+=\S* )+", "", line)  # the environment it is given
            if re.match(r"tickwheel (?:[a-z]|--)", line):
                found.append(line)
    return found


GROUPS = ("dead-letters", "jobs", "rules", "timers")
ROOT_OPTIONS = {"--log-level": 1, "--log-format": 1, "--version": 0}
"""The root's options (before the command), with how many values each takes."""


def split_root(args: list[str]) -> tuple[list[str], list[str]]:
    """The root's options of an argument list, and the command with its own."""
    i = 0
    while i < len(args) and args[i] in ROOT_OPTIONS:
        i += 1 + ROOT_OPTIONS[args[i]]
    return args[:i], args[i:]


def _optional_parts(words: list[str]) -> list[str]:
    """The words with every optional `[…]` part left out."""
    kept, depth = [], 0
    for w in words:
        opens = w.startswith("[")
        depth += opens
        if depth == 0:
            kept.append(w)
        if w.endswith("]") and (opens or depth):
            depth -= 1
    return kept


def expand(command: str, *, optional: bool = True) -> list[list[str]]:
    """The argument lists a docs line stands for: `a|b` (sub)commands each, every
    optional `[…]` part given (or, with `optional=False`, none of them); the root's
    options, if any, first."""
    words = shlex.split(command)[1:]
    if not optional:
        words = _optional_parts(words)
    words = [w.removeprefix("[").removesuffix("]") for w in words]
    root, words = split_root(words)
    if not words:
        return [root]
    if words[0] in GROUPS:
        return [[*root, words[0], s, *words[2:]] for s in words[1].split("|")]
    return [[*root, c, *words[1:]] for c in words[0].split("|")]


def command_of(args: list[str]) -> list[str]:
    """The command's own words of an argument list (`["timers", "list", "--type", …]`)."""
    return split_root(args)[1]


def test_the_docs_show_commands_of_both_groups() -> None:
    shown = [command_of(a) for c in readme_commands() for a in expand(c)]
    groups = {a[0] for a in shown if a}
    assert {"jobs", "timers", "worker", "schemas", "rebuild"} <= groups
    subs = {(a[0], a[1]) for a in shown if a and a[0] in GROUPS}
    assert {("jobs", "list"), ("jobs", "enable"), ("timers", "list"), ("timers", "retry")} <= subs
    assert ["--version"] in [a for c in readme_commands() for a in expand(c)]


@pytest.mark.parametrize("command", readme_commands())
def test_every_readme_command_line_parses(command: str) -> None:
    root: Any = typer.main.get_command(cli)
    for args in [*expand(command), *expand(command, optional=False)]:
        options, args = split_root(args)
        if not args:
            continue  # `tickwheel --version`: run below
        root.make_context("tickwheel", [*options, *args])  # the root's options, validated
        depth = 2 if args[0] in GROUPS else 1
        found = root
        for name in args[:depth]:
            found = found.commands.get(name)
            assert found is not None, f"no command {args[:depth]}"
        # Parses and validates every option as the real command would; runs nothing.
        found.make_context(" ".join(args[:depth]), args[depth:])


# --- the commands that need no broker, run as written -------------------------------------


def _offline(args: list[str]) -> bool:
    own = command_of(args)
    return (
        not own
        or own[0] == "schemas"
        or own[:2] == ["rules", "next"]
        or (own[:2] == ["jobs", "list"] and "--state" not in own and "--bootstrap" not in own)
    )


OFFLINE = sorted(
    {
        shlex.join(a)  # quoted as written: a rule expression has spaces
        for c in readme_commands()
        for a in [*expand(c), *expand(c, optional=False)]
        if _offline(a)
    }
)


@pytest.fixture
def doc_services(tmp_path: Path) -> Iterator[None]:
    """Every page's service modules importable (`mymodule`, `myjobs`), as a reader who
    saved them beside where they run the command; the concepts page's win a clash."""
    where = tmp_path / "modules"
    where.mkdir()
    for page in sorted(DOCS, key=lambda p: p.name == "concepts.md"):
        for name, code in doc_modules(page).items():
            (where / f"{name}.py").write_text(code)
    sys.path.insert(0, str(where))
    before = set(sys.modules)
    try:
        yield
    finally:
        sys.path.remove(str(where))
        for name in set(sys.modules) - before:
            if str(where) in str(getattr(sys.modules[name], "__file__", "") or ""):
                del sys.modules[name]


def test_the_docs_show_commands_that_run_without_a_broker() -> None:
    assert "--version" in OFFLINE
    assert {"schemas --check", "schemas"} <= set(OFFLINE)
    assert any(c.startswith("jobs list --service myjobs:service") for c in OFFLINE)
    assert any(c.startswith("rules next 'cron:") for c in OFFLINE)
    assert any(c.startswith("rules next interval:") for c in OFFLINE)


@pytest.mark.parametrize("command", OFFLINE)
def test_the_docs_offline_commands_run_as_written(
    command: str, doc_services: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a directory like the repository's root (a copy of docs/schemas), so that
    `schemas --check` checks, and the writing ones write, there and not in the tree."""
    shutil.copytree(ROOT / "docs" / "schemas", tmp_path / "docs" / "schemas")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, shlex.split(command))
    assert result.exit_code == 0, result.output
    if command == "--version":
        assert result.stdout == version_line() + "\n"
    elif command.startswith("schemas") and "--check" not in command:
        written = [tmp_path / line for line in result.stdout.splitlines()]  # absolute stays
        assert written and all(p.is_file() and tmp_path in p.parents for p in written)
    elif command.startswith("jobs list"):
        assert "unpaid-report" in result.stdout


def test_schemas_writes_into_the_working_directory_when_it_has_no_docs_schemas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As docs/wire-format.md says: never into the installed package."""
    monkeypatch.chdir(tmp_path)
    written = CliRunner().invoke(cli, ["schemas"])
    assert written.exit_code == 0, written.output
    assert {Path(line).parent for line in written.stdout.splitlines()} == {tmp_path}
    checked = CliRunner().invoke(cli, ["schemas", "--check"])
    assert checked.exit_code == 0 and str(tmp_path) in checked.stdout


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
    (row,) = [
        line
        for text in TEXTS.values()
        for line in text.splitlines()
        if line.startswith(f"| `{field}` |")
    ]
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
    (text,) = [
        found
        for doc in TEXTS.values()
        for found in re.findall(r"TICKWHEEL_TIMER_OPTIONS='([^']*)'", doc)
    ]
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
            ["timers", "upcoming", "--type", "shop.order", "--limit", "5"],
            ["shop.order.timers"],
            "topic shop.order.timers does not exist at broker:9092",
        ),
        (
            ["dead-letters", "list", "--context", "shop"],
            ["shop.dead-letters"],
            "topic shop.dead-letters does not exist at broker:9092",
        ),
        (
            ["dead-letters", "show", "--context", "shop", "--offset", "0", "--json"],
            ["shop.dead-letters"],
            "topic shop.dead-letters does not exist at broker:9092",
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
            [*BACKFILL, "--dry-run"],
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


RO_BACKFILL = ["jobs", "backfill", "--service", f"{__name__}:RO_SERVICE", "--job", "nightly"]


def _read_only_commands(context: str) -> list[list[str]]:
    return [
        ["timers", "list", "--type", f"{context}.order"],
        ["timers", "list", "--type", f"{context}.order", "--status", "PARKED", "--json"],
        ["timers", "upcoming", "--type", f"{context}.order", "--owner", "o-42", "--json"],
        ["timers", "show", "--type", f"{context}.order", "--owner", "o-42"],
        ["timers", "show", "--type", f"{context}.order", "--owner", "o-42", "--key", "k"],
        ["timers", "ledger", "--context", context],
        ["dead-letters", "list", "--context", context, "--stage", "read"],
        ["dead-letters", "show", "--context", context, "--offset", "0"],
        ["jobs", "list", "--service", f"{__name__}:RO_SERVICE", "--state"],
        # A backfill's dry run plans what it would send: with the count it writes with,
        # which must be the log's (another is refused, as by the commands that write).
        [
            *RO_BACKFILL,
            "--context",
            context,
            "--from",
            "0",
            "--until",
            "86400000",
            "--dry-run",
            "--partitions",
            "3",
        ],
        ["rebuild", "--type", f"{context}.order", "--dry-run"],
    ]


def _topics(bootstrap: str) -> set[str]:
    """The broker's topics but its own: on a new cluster the broker creates its internal
    `__consumer_offsets` on the first look-up of any group (a dry run's)."""
    return {t for t in asyncio.run(topic_names(bootstrap)) if not t.startswith("__")}


@pytest.mark.kafka
@pytest.mark.kafka_next
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
    topics += [f"{context}.schedule.events", f"{context}.dead-letters"]
    asyncio.run(ensure_topics(kafka_bootstrap, [TopicSpec(t, 3, compacted=True) for t in topics]))
    before = _topics(kafka_bootstrap)
    for args in _read_only_commands(context):
        result = runner.invoke(cli, [*args, "--bootstrap", kafka_bootstrap], env=env)
        if args[:2] == ["dead-letters", "show"]:
            assert result.exit_code == 1, (args, result.output)
            assert "no dead letter at partition 0, offset 0" in result.stderr
        elif args[:2] == ["timers", "show"]:
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
    """The docs' read-only operator command lines, every optional part given (with the
    root's options a line gives)."""
    found = []
    for command in readme_commands():
        for args in expand(command):
            own = command_of(args)
            if (
                own[:2]
                in (
                    ["timers", "list"],
                    ["timers", "upcoming"],
                    ["timers", "show"],
                    ["timers", "ledger"],
                    ["dead-letters", "list"],
                    ["dead-letters", "show"],
                )
                or (own[:1] == ["rebuild"] and "--dry-run" in own)
                or (own[:2] == ["jobs", "list"] and "--state" in own)
                or (own[:2] == ["jobs", "backfill"] and "--dry-run" in own)
            ):
                found.append(args)
    return found


def test_the_docs_show_the_read_only_operator_commands() -> None:
    shown = {tuple(command_of(a)[:2]) for a in _readme_read_only()}
    assert {("timers", "list"), ("timers", "show"), ("timers", "ledger")} <= shown
    assert ("timers", "upcoming") in shown
    assert {("dead-letters", "list"), ("dead-letters", "show")} <= shown
    assert {("rebuild", "--type"), ("jobs", "list"), ("jobs", "backfill")} <= shown
    assert any(split_root(a)[0] for a in _readme_read_only()), "one with the root's options"


@pytest.mark.kafka
@pytest.mark.parametrize("args", _readme_read_only(), ids=" ".join)
def test_the_readmes_read_only_commands_run_as_written_and_create_nothing(
    kafka_bootstrap: str, args: list[str], doc_services: None
) -> None:
    """Run against the broker as written: they read what is there (the shop topics exist
    where the demo ran) or say what is not, and change no topic either way."""
    before = _topics(kafka_bootstrap)
    result = CliRunner().invoke(cli, [*args, "--bootstrap", kafka_bootstrap])
    assert "Traceback" not in result.output
    if result.exit_code != 0:
        assert result.exit_code == 1, result.output
        assert re.search(
            r"not exist at|has no timers? |running worker|no dead letter at", result.stderr
        ), result.output
    assert _topics(kafka_bootstrap) == before


# --- the docs' settings: `export` lines, the .env example, the settings table -------------


def _export_blocks() -> list[list[tuple[str, str]]]:
    """Per sh block of the docs, (variable, value) of its `export X=value` lines whose value
    is written out (not a command's output)."""
    found = []
    for text in TEXTS.values():
        for block in sh_blocks(text):
            exports = []
            for line in block.splitlines():
                if not line.startswith("export ") or "$(" in line:
                    continue
                words = shlex.split(line, comments=True)
                if "=" in words[1]:
                    name, value = words[1].split("=", 1)
                    exports.append((name, value))
            if exports:
                found.append(exports)
    return found


def _exports() -> list[tuple[str, str]]:
    return [pair for block in _export_blocks() for pair in block]


def test_the_docs_export_lines_are_settings_taken_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exports = _exports()
    assert ("TICKWHEEL_PARTITIONS", "4") in exports, "the note on ./scripts/run's count"
    monkeypatch.chdir(tmp_path)  # where a block's relative _FILE names its secret
    for block in _export_blocks():
        for name, value in block:
            assert name in VARIABLES.values() or (
                name.endswith("_FILE") and name.removesuffix("_FILE") in VARIABLES.values()
            ), f"export {name}: no setting"
            if name.endswith("_FILE"):
                Path(value).write_text("a secret\n")
        # A block's lines together (a SASL protocol needs its mechanism and credentials).
        Settings.from_env(dict(block))  # a ConfigError if a value is refused
    assert Settings.from_env({"TICKWHEEL_PARTITIONS": "4"}).partitions == 4


def test_scripts_run_uses_the_partition_count_the_docs_give_for_its_broker() -> None:
    run = (ROOT / "scripts" / "run").read_text()
    (count,) = re.findall(r"export TICKWHEEL_PARTITIONS=\$\{TICKWHEEL_PARTITIONS:-(\d+)\}", run)
    assert ("TICKWHEEL_PARTITIONS", count) in _exports()
    assert Settings().partitions == 12
    for name in ("getting-started.md", "operations.md", "configuration.md"):
        text = " ".join(TEXTS[ROOT / "docs" / name].split())
        assert f"TICKWHEEL_PARTITIONS={count}" in text, name
        assert "expected 12" in text or "default is 12" in text or "| 12 |" in text, name


def test_the_docs_dotenv_example_is_read_as_written(tmp_path: Path) -> None:
    blocks = [b for t in TEXTS.values() for b in re.findall(r"```dotenv\n(.*?)```", t, re.S)]
    (block,) = blocks
    dotenv = tmp_path / "tickwheel.env"
    dotenv.write_text(block)
    settings = Settings.from_env({ENV_FILE_VARIABLE: str(dotenv)})
    assert (settings.partitions, settings.group_id, settings.log_format) == (
        4,
        "shop-timers",
        "json",
    )
    # The environment wins over the file, as the docs say.
    over = Settings.from_env({ENV_FILE_VARIABLE: str(dotenv), "TICKWHEEL_PARTITIONS": "6"})
    assert over.partitions == 6


def _settings_table() -> dict[str, str]:
    """The variables of docs/configuration.md's settings table, with their rows."""
    text = TEXTS[ROOT / "docs" / "configuration.md"]
    section = text.split("\n## The settings\n", 1)[1].split("\n## ", 1)[0]
    return {
        m[1]: line for line in section.splitlines() if (m := re.match(r"\| `([A-Z_]+)` \|", line))
    }


def test_the_settings_table_names_every_setting_and_only_settings() -> None:
    table = _settings_table()
    known = {*VARIABLES.values(), ENV_FILE_VARIABLE}
    assert set(table) - known == set(), "documented, but no setting"
    assert known - set(table) == set(), "a setting the table does not name"
    assert not set(table) & TOOLING_VARIABLES


@pytest.mark.parametrize(
    ("variable", "default"),
    [
        ("KAFKA_BOOTSTRAP_SERVERS", "`127.0.0.1:9092`"),
        ("TICKWHEEL_PARTITIONS", "12"),
        ("TICKWHEEL_SESSION_TIMEOUT_MS", "10000"),
        ("TICKWHEEL_BUSY_BACKLOG", "50000"),
        ("TICKWHEEL_MAX_KEY_BYTES", "4096"),
        ("TICKWHEEL_MAX_RECORD_BYTES", "262144"),
        ("TICKWHEEL_MAX_STATE_BYTES", "4194304"),
        ("TICKWHEEL_COMMIT_INTERVAL_MS", "100"),
        ("TICKWHEEL_WEB_MAX_CONNECTIONS", "100"),
        ("TICKWHEEL_WEB_IDLE_TIMEOUT_MS", "75000"),
        ("TICKWHEEL_LOG_LEVEL", "`INFO`"),
        ("TICKWHEEL_LOG_FORMAT", "`text`"),
    ],
)
def test_the_settings_table_gives_the_defaults(variable: str, default: str) -> None:
    field = {v: k for k, v in VARIABLES.items()}[variable]
    value = getattr(Settings(), field)
    assert default.strip("`") == str(value), (variable, value)
    assert _settings_table()[variable].split(" | ")[1] == default


# --- the Kubernetes probes ------------------------------------------------------------------


def test_the_docs_probes_ask_the_edges_health_endpoints() -> None:
    text = TEXTS[ROOT / "docs" / "operations.md"]
    (block,) = re.findall(r"```yaml\n(.*?)```", text, flags=re.S)
    pod: dict[str, Any] = yaml.safe_load(block)
    env = {e["name"]: e["value"] for e in pod["env"]}
    settings = Settings.from_env(env)
    assert settings.web_host == "0.0.0.0" and settings.web_port > 0
    web = (ROOT / "app" / "ops" / "web.py").read_text()
    routes = set(re.findall(r'add_get\("(/[a-z]*)"', web))
    probes = {
        name: pod[name]["httpGet"] for name in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    for name, get in probes.items():
        assert get["port"] == settings.web_port, name
        assert get["path"] in routes, name
    assert probes["livenessProbe"]["path"] == "/livez", "a broker outage must restart nothing"
    assert probes["startupProbe"]["path"] == "/livez"
    assert probes["readinessProbe"]["path"] == "/readyz"
