"""Every `tickwheel` command, run with hostile option values (empty, blank, control
characters, NUL, lone surrogates, very long text, numbers out of any range, NaN, odd
instants, durations, cron expressions, zones, JSON that is not JSON or nested deep): it
exits 0, 1 or 2, never with a traceback nor the catch-all's `unexpected …` (a bug's), and
an exit code 2 or 1 says `error: …` (2 on one line, whatever the value holds), of at most
1,000 characters and never repeating a long value whole; a cluster's records are all
still there after it.

The commands are read from the command tree itself: one added later is run too. No
broker: one test points the commands at an address that refuses at once (127.0.0.1:1),
the other gives the commands that take them the in-memory log's clients, so that they get
as far as sending; `worker` runs with its node replaced by nothing."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner, Result

import app.cli.dead_letters
import app.cli.job_actions
import app.cli.timer_changes
import app.cli.timers
import app.cli.worker
from app.cli import cli
from app.jobs import SCHEDULE
from app.kafka import TopicSpec
from app.kafka.memory import MemoryLog
from app.node import node_topics
from app.node.settings import Settings
from app.protocol.topics import AggregateTopics
from app.service import Service

PARTITIONS = 12


def _leaves(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    if hasattr(command, "commands"):
        for name, sub in sorted(command.commands.items()):
            yield from _leaves(sub, (*path, name))
    else:
        yield path, command


COMMANDS = dict(_leaves(typer.main.get_command(cli)))
SENDING = {p: c for p, c in COMMANDS.items() if p[0] in ("timers", "jobs", "dead-letters")}
"""The commands whose clients the tests can swap for the in-memory log's."""

NUMBERS = [
    *("-1", "0", "-0", "1.5", "1e3", "1e309", "nan", "NaN", "inf", "-inf", "+5", " 5 "),
    *("0x10", "5_000", "٣", "\uff11", "9" * 400, "-" + "9" * 30, "9223372036854775808"),
]
INSTANTS = [
    *("2024-02-30T00:00:00Z", "2024-03-31T02:30:00+01:00", "1970-01-01", "2024-01-01T00:00:00"),
    *("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59.999-14:00", "10000-01-01T00:00:00Z"),
    *("-62135596800001", "253402300800000", "P1D", "1d", "1h30m", "0ms", "99999999999999999999ms"),
]
RULES = [
    *("cron:", "cron:* * * * *", "cron:61 * * * *", "cron:* * * * * * *", "cron:0 0 30 2 *"),
    *("cron:*/0 * * * *", "cron:@reboot", "cron:0 0 29 2 5#5", "interval:0", "interval:1ms@-1"),
    *("interval:9999999999999999999d", "interval:1s@9999-12-31T23:59:59Z", "once:", "once:-1"),
    *("once:9999-12-31T23:59:59.999Z", "once:10000-01-01T00:00:00Z", "once:1e20"),
    '{"kind":"cron","expr":"* * * * *","zone":"Mars/Olympus"}',
    '{"kind":"interval","every":1e300}',
    '{"kind":"interval","every":1,"start":9223372036854775807}',
    '{"kind":"once","at":-9e18}',
    '{"every": 0}',
    '{"every": 60000, "colour": "red"}',
]
ZONES = ["UTC", "Europe/Berlin", "../../etc/passwd", "/etc/localtime", "UTC\x00", "Etc/GMT+99"]
JSON = [
    "{",
    "}",
    "[]",
    "{}",
    "null",
    '"x"',
    "[" * 5000 + "]" * 5000,
    '{"a":' * 3000 + "1" + "}" * 3000,
]
NAMES = [
    *("a.b", "a.b.c", ".", "a.", ".b", "shop.order", "shop.schedule", "a/b", "a" * 250 + ".b"),
    *("127.0.0.1:99999999", "[::1]:1", "http://x:1", ",", "a:1,,b:2", ":1", "DEBUG", "json"),
    *("/", "/dev/null", "/dev/zero", "/nonexistent/dir", "./x\x00"),
]
SERVICES = ["app.demo:service", "app.demo:nope", "os:path", "builtins:print", "no_such_module_x"]
SERVICES += ["..x:y", ":service", "app.demo", ""]
"""Module names alone: an option's random text could name a module whose import does
something (`antigravity` opens a browser)."""
TEXT = [
    *("", " ", "\t", "\n", "\r\n", "\x00", "a\x00b", "\x1b[2J", "\x7f", "\u200b", "\ufeff"),
    *("x" * 100_000, "é" * 5_000, "-", "--", "--help", "true"),
]
NOT_UTF8 = ["\udcff", "a\udcffb", "x\udc80", '{"a": "\udcff"}', "cron:\udcff"]
"""A command line's bytes that are not UTF-8, as Python holds them (lone surrogates)."""
KINDS = (TEXT, NOT_UTF8, NUMBERS, INSTANTS, RULES, ZONES, JSON, NAMES)
HOSTILE = st.one_of(
    *(st.sampled_from(kind) for kind in KINDS),
    st.text(st.characters(exclude_categories=()), max_size=20),  # surrogates too
)
"""Each kind of value as likely as the others, whatever their numbers."""

GOOD = {
    "--type": "shop.order",
    "--owner": "o-1",
    "--key": "k",
    "--target-type": "shop.order",
    "--target-id": "t-1",
    "--command": "Remind",
    "--context": "shop",
    "--service": "app.demo:service",
    "--job": "unpaid-report",
    "--from": "2020-01-01T00:00:00Z",
    "--until": "2020-01-02T00:00:00Z",
    "--offset": "0",
    "EXPR": "cron:* * * * *",
}
"""A value each required option takes, when it is not the one made hostile."""


def _good(path: tuple[str, ...], name: str) -> str:
    if name == "--rule":
        return '{"every": 60000}' if path[0] == "jobs" else "cron:* * * * *"
    return GOOD[name]


def command_line(draw: Callable[[st.SearchStrategy[Any]], Any], path: tuple[str, ...]) -> list[str]:
    """The command `path` with one or two of its options hostile (now and then one of
    `tickwheel`'s own too), the others left out or good (a hostile value is then the one
    the command refuses, if any), its flags given or not."""
    params = COMMANDS[path].params
    valued = [p for p in params if not getattr(p, "is_flag", False)]
    hostile = draw(st.sets(st.sampled_from(valued), min_size=1, max_size=2)) if valued else ()
    args = list(path)
    if draw(st.integers(0, 7)) == 0:  # `tickwheel`'s own options, before the command
        args = [draw(st.sampled_from(["--log-level", "--log-format"])), draw(HOSTILE), *args]
    for param in params:
        name = param.opts[0] if param.param_type_name == "option" else param.metavar
        if getattr(param, "is_flag", False):
            if draw(st.booleans()):
                args.append(name)
            continue
        if param in hostile:
            value = draw(st.sampled_from(SERVICES) if name == "--service" else HOSTILE)
        elif param.required:
            value = _good(path, name)
        else:
            continue
        if param.param_type_name == "argument":
            args += ["--", value] if value.startswith("-") else [value]
        else:
            args += [draw(st.sampled_from(param.opts)), value]
    return args


LONGEST_ERROR = 1_000
"""An error line's most characters (`app.cli.text.LONGEST_ERROR`)."""


def _check(args: list[str], result: Result) -> None:
    shown = [a if len(a) < 80 else f"{a[:40]}…({len(a)})" for a in args]
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"{shown}: raised {result.exception!r}") from result.exception
    assert result.exit_code in (0, 1, 2), (shown, result.output)
    assert "Traceback" not in result.output, (shown, result.output)
    assert "error: unexpected " not in result.stderr, (shown, result.stderr)
    if result.exit_code == 0:
        return
    errors = [line for line in result.stderr.split("\n") if line.startswith("error: ")]
    assert errors, (shown, result.stderr)
    for line in errors:
        # A long value repeated cut, its start and length: never the whole of it.
        assert len(line) <= LONGEST_ERROR, (shown, line[:300])
        whole = [a for a in args if len(a) > 100 and (a in line or repr(a)[1:-1] in line)]
        assert not whole, (shown, line[:300])
    if result.exit_code == 2:
        assert result.stderr.startswith("error: ") and result.stdout == "", (shown, result.output)
        # One line, whatever the value: a newline or a separator in it is escaped.
        assert len(result.stderr.splitlines()) == 1, (shown, result.stderr)


@pytest.fixture
def no_node(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`worker` ends once its settings and service are loaded; files land in `tmp_path`."""

    async def run_worker(settings: Settings, service: Service) -> None:
        pass

    monkeypatch.setattr(app.cli.worker, "_run_worker", run_worker)
    monkeypatch.chdir(tmp_path)
    for name in [n for n in os.environ if n.startswith(("TICKWHEEL_", "KAFKA_"))]:
        monkeypatch.delenv(name)


EXAMPLES = settings(
    max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
"""Per command: some 100 runs in all, each command as many."""


@pytest.mark.usefixtures("no_node")
@pytest.mark.parametrize("path", sorted(COMMANDS), ids=" ".join)
@EXAMPLES
@given(data=st.data())
def test_every_command_takes_hostile_values_with_a_clear_error(
    path: tuple[str, ...], data: st.DataObject
) -> None:
    args = command_line(data.draw, path)
    result = CliRunner().invoke(cli, args, env={"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"})
    _check(args, result)


KEPT = ("shop.order.events", 0, b"o-1", b"{}")
"""A record a cluster holds before a command runs: there after it."""


def _memory_cluster(monkeypatch: pytest.MonkeyPatch) -> MemoryLog:
    """The in-memory log as every sending command's clients, its topics made as a worker
    of the demo service would, one record on one."""
    types = [AggregateTopics("shop", t) for t in ("order", "report", SCHEDULE)]
    log = MemoryLog(node_topics(types, PARTITIONS))
    for module in (app.cli.timers, app.cli.timer_changes, app.cli.dead_letters):
        monkeypatch.setattr(module, "clients_for", lambda settings: log)

    async def ensure_topics(where: object, specs: list[TopicSpec], replication: object) -> None:
        log.ensure_topics(specs)

    async def require_topic(where: object, topic: str, why: str) -> int:
        return log.partitions(topic)

    jobs = app.cli.job_actions
    monkeypatch.setattr(jobs, "ensure_topics", ensure_topics)
    monkeypatch.setattr(jobs, "require_topic", require_topic)
    monkeypatch.setattr(jobs, "Reader", lambda where: log.reader())
    monkeypatch.setattr(jobs, "Producer", lambda where: log.publisher())
    asyncio.run(log.publisher().send_many([KEPT]))
    return log


@pytest.mark.usefixtures("no_node")
@pytest.mark.parametrize("path", sorted(SENDING), ids=" ".join)
@EXAMPLES
@given(data=st.data())
def test_commands_that_send_take_hostile_values_with_a_clear_error(
    path: tuple[str, ...], data: st.DataObject
) -> None:
    args = command_line(data.draw, path)
    with pytest.MonkeyPatch.context() as mp:
        log = _memory_cluster(mp)
        if any(p.opts[0] == "--wait" for p in COMMANDS[path].params):
            args = [*args, "--wait", "0"]  # the last one given counts: no answer waited for
        _check(args, CliRunner().invoke(cli, args))
        topic, partition, key, value = KEPT
        assert [(r.key, r.value) for r in log.records(topic, partition)][:1] == [(key, value)]
