"""`tickwheel timers show` on a changelog in a memory log (the CLI's clients): which records
are an owner's, deleted rows, the owner's partition, and the errors for what is not there."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import orjson
import pytest
from fakes import stored_timer
from typer.testing import CliRunner

import app.cli.timers
from app.cli import cli
from app.kafka import Record, TopicSpec
from app.kafka.memory import MemoryLog
from tables import AggregateRef, CommandSpec, Timer, TimerStatus
from tables.keys import encode_timer, row_key
from tables.ledger import LedgerEntry
from tables.partitioner import partition_of

PARTITIONS = 4
OWNER = AggregateRef(context="shop", aggregate="order", id="o-42")
NEIGHBOUR = AggregateRef(context="shop", aggregate="order", id="o-42", tenant="t2")
TOPIC = "shop.order.timers"
EVENTS = "shop.order.events"
P = partition_of(OWNER.id, PARTITIONS)


def timer(owner: AggregateRef, key: str, status: TimerStatus, due: int) -> Timer:
    return stored_timer(owner, key, status, due, P, id=f"{key}-{due}")


def record(offset: int, key: bytes | None, value: bytes | None) -> Record:
    return Record(TOPIC, P, offset, key, value, 1_700_000_000_000 + offset)


REMIND = row_key(OWNER, "remind")
LOG = [
    record(0, REMIND, encode_timer(timer(OWNER, "remind", TimerStatus.PENDING, 1_000))),
    record(
        1,
        row_key(NEIGHBOUR, "remind"),
        encode_timer(timer(NEIGHBOUR, "remind", TimerStatus.PENDING, 5)),
    ),
    record(2, REMIND, encode_timer(timer(OWNER, "remind", TimerStatus.FIRED, 1_000))),
    record(
        3, row_key(OWNER, "later"), encode_timer(timer(OWNER, "later", TimerStatus.PENDING, 9_000))
    ),
    record(4, REMIND + b"x", b"{}"),  # not a row key of this owner's: another writer's bytes
    record(5, None, b"{}"),
    record(6, row_key(OWNER, "later"), None),  # deleted
    record(7, REMIND, b"not json"),  # unreadable: skipped (and logged)
]


def cluster(
    monkeypatch: pytest.MonkeyPatch, records: list[Record], topics: tuple[str, ...]
) -> MemoryLog:
    """The CLI's clients: a memory log of `topics` holding `records` (their timestamps
    counting up from the first's, one per record)."""
    ticks = itertools.count(1_700_000_000_000)
    log = MemoryLog([TopicSpec(t, PARTITIONS) for t in topics], now=lambda: next(ticks))
    written = [(r.topic, r.partition, r.key, r.value) for r in records]
    assert asyncio.run(log.publisher().send_many(written)) == [r.offset for r in records]
    monkeypatch.setattr(app.cli.timers, "clients_for", lambda settings: log)
    return log


DECOY = Record(TOPIC, (P + 1) % PARTITIONS, 0, REMIND, LOG[0].value, 0)
"""One of the owner's rows in another partition than its own: never read."""


@pytest.fixture
def changelog(monkeypatch: pytest.MonkeyPatch) -> MemoryLog:
    """The topics exist with `LOG` in the owner's partition (at `LOG`'s offsets)."""
    return cluster(monkeypatch, [*LOG, DECOY], (EVENTS, TOPIC))


def run(*args: str) -> Any:
    return CliRunner().invoke(
        cli, ["timers", "show", "--type", "shop.order", "--bootstrap", "b:9092", *args]
    )


def test_json_lists_each_version_of_the_owners_timers_in_log_order(
    changelog: MemoryLog,
) -> None:
    result = run("--owner", "o-42", "--json")
    assert result.exit_code == 0, result.output
    versions = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert [(v["key"], v["offset"]) for v in versions] == [
        ("remind", 0),
        ("remind", 2),
        ("later", 3),
        ("later", 6),
    ]
    assert versions[1]["row"]["status"] == "FIRED" and versions[3]["row"] is None
    assert {v["partition"] for v in versions} == {P}  # only the owner's partition is read
    assert versions[0]["timestamp"] == 1_700_000_000_000


def test_text_shows_each_timer_now_then_its_versions(changelog: MemoryLog) -> None:
    result = run("--owner", "o-42")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"{OWNER}: 2 timer(s) in {TOPIC}[{P}]")
    assert lines[1].startswith("remind: FIRED\tslot 0\tdue 1970-01-01T00:00:01.000+00:00")
    assert lines[2].startswith("  @0\t2023-11-14T22:13:20.000+00:00\tPENDING\tslot 0")
    assert lines[3].startswith("  @2\t") and "\tFIRED\t" in lines[3]
    assert lines[4:] == [
        "later: deleted",
        lines[5],
        "  @6\t2023-11-14T22:13:20.006+00:00\tdeleted",
    ]
    assert lines[5].startswith("  @3\t") and "\tPENDING\t" in lines[5]


def test_a_key_narrows_it_to_one_timer(changelog: MemoryLog) -> None:
    result = run("--owner", "o-42", "--key", "later", "--json")
    assert result.exit_code == 0, result.output
    assert [orjson.loads(line)["offset"] for line in result.stdout.splitlines()] == [3, 6]


def test_the_tenant_is_part_of_the_owner(changelog: MemoryLog) -> None:
    result = run("--owner", "o-42", "--tenant", "t2", "--json")
    assert result.exit_code == 0, result.output
    assert [orjson.loads(line)["offset"] for line in result.stdout.splitlines()] == [1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--owner", "o-7"], f"shop.order/(0)/o-7 has no timers in {TOPIC}["),
        (
            ["--owner", "o-42", "--key", "nope"],
            f"{OWNER} has no timer 'nope' in {TOPIC}[{P}] (its timers: later, remind)",
        ),
    ],
)
def test_what_is_not_there_is_a_clear_error(
    changelog: MemoryLog, args: list[str], message: str
) -> None:
    result = run(*args)
    assert result.exit_code == 1, result.output
    assert f"error: {message}" in result.stderr and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--owner", ""], "bad owner: id: String should have at least 1 character"),
        (["--owner", "o", "--tenant", "t" * 201], "bad owner: tenant: String should have at most"),
    ],
)
def test_an_owner_no_aggregate_can_have_is_a_bad_option(
    changelog: MemoryLog, args: list[str], message: str
) -> None:
    # Exit code 2, as `timers retry --target-id ''` and `timers cancel --owner ''` (was 1).
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: {message}") and len(result.stderr.splitlines()) == 1


def test_a_type_without_a_changelog_says_which_topic_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = cluster(monkeypatch, [], (EVENTS,))
    result = run("--owner", "o-42")
    assert result.exit_code == 1
    where = log.admin().where()
    assert f"error: topic shop.order.timers does not exist at {where}" in result.stderr
    assert "nothing was created" in result.stderr
    assert log.topic_names() == {EVENTS}


def test_a_malformed_type_is_refused() -> None:
    result = CliRunner().invoke(cli, ["timers", "show", "--type", "shop", "--owner", "o"])
    assert result.exit_code == 2 and "must be '<context>.<aggregate>'" in result.stderr


def test_a_paused_timer_shows_its_status(monkeypatch: pytest.MonkeyPatch) -> None:
    paused = timer(OWNER, "remind", TimerStatus.PAUSED, 1_000)
    cluster(monkeypatch, [record(0, REMIND, encode_timer(paused))], (EVENTS, TOPIC))
    result = run("--owner", "o-42")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[1].startswith("remind: PAUSED\tslot 0\t")
    assert "\tPAUSED\t" in lines[2]


FORGER = AggregateRef(
    context="shop", aggregate="order", tenant="t\x1b]0;owned\x07", id="o\r\nerror: forged\x1b[2J"
)
"""An owner whose stored strings (a record of another writer, or kept from before new
input was checked) hold control characters: a carriage return and newline that forge a
line, escape sequences that clear the screen or retitle the terminal."""


@pytest.mark.parametrize(
    "args",
    [["show", "--owner", FORGER.id, "--tenant", FORGER.tenant], ["list"], ["upcoming"]],
    ids=lambda args: args[0],
)
def test_text_escapes_the_control_characters_a_stored_timer_holds(
    monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    # They reached the terminal as they were (the JSON output escapes them). A row a
    # restore takes (in its owner's partition): the readers show no other.
    at = partition_of(FORGER.id, PARTITIONS)
    row = stored_timer(FORGER, "k\x1b[A\x85\u2028", TimerStatus.PENDING, 1_000, at, id="t\x00")
    row = row.model_copy(update={"command": CommandSpec(type="Remind\x9b2J\t\x07")})
    forged = Record(TOPIC, at, 0, row_key(FORGER, row.key), encode_timer(row), 0)
    cluster(monkeypatch, [forged], (EVENTS, TOPIC))
    result = CliRunner().invoke(
        cli, ["timers", *args, "--type", "shop.order", "--bootstrap", "b:9092"]
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.split("\n")
    assert lines.pop() == "" and len(lines) == (3 if args[0] == "show" else 1), lines
    control = [c for c in result.stdout if c not in "\t\n" and not c.isprintable()]
    assert control == [] and result.stdout.splitlines() == lines, lines
    shown = {
        "o\\x0d\\x0aerror: forged\\x1b[2J",
        "t\\x1b]0;owned\\x07",
        "k\\x1b[A\\x85\\u2028",
        "Remind\\x9b2J\\x09\\x07",
    }
    assert all(any(s in line for line in lines) for s in shown), lines


def test_the_ledger_in_text_escapes_the_control_characters_an_entry_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entry = LedgerEntry(
        subscription="s\x1b[2J",
        target=FORGER,
        timers=("t\n1#0",),
        error_code="E\x07",
        error_text="refused\x9b\u2028",
    )

    async def read_ledger(clients: object, context: str) -> list[LedgerEntry]:
        return [entry]

    monkeypatch.setattr(app.cli.timers, "read_ledger", read_ledger)
    monkeypatch.setattr(app.cli.timers, "checked", lambda kafka, work: work)
    result = CliRunner().invoke(cli, ["timers", "ledger", "--context", "shop"])
    assert result.exit_code == 0, result.output
    (line,) = result.stdout.splitlines()
    assert [c for c in line if c != "\t" and not c.isprintable()] == [], line
    assert line.startswith("s\\x1b[2J\tshop.order/t\\x1b]0;owned\\x07/o\\x0d\\x0aerror: forged")
    assert line.endswith('1 timer(s): t\\x0a1#0\terror E\\x07 "refused\\x9b\\u2028"'), line
