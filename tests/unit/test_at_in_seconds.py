"""A once rule's `at` given in epoch seconds where milliseconds are meant (1733400000: a
timer in January 1970, which fires at once) is refused at each client edge, naming the
unit: `tickwheel timers set` exits 2, `PUT /timers/...` is a 400 naming `rule.once.at`, the
faust client raises `ValueError`; nothing is sent. The node reads the log as before: a
book still takes such a set from another writer (the wire format is fixed)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import faust
import pytest
from fakes import T0, FakeClock, WebNode, web_node
from pydantic import BaseModel
from typer.testing import CliRunner

import app.cli.timer_changes
from app.cli import cli
from app.clients.book_commands import seconds_reason
from app.clients.faust_client import TickwheelTimers
from app.clients.timer_book import SET_TIMER, timer_book
from app.model.aggregate import AggregateType, Command, Decision
from app.model.decide import decide
from app.protocol.topics import AggregateTopics
from app.protocol.wire import CommandEnvelope, ResultCode
from app.service import Service
from tables import AggregateRef, CommandSpec, IntervalRule, OnceRule

P = 2
BOOK = AggregateTopics("shop", "reminders")
SECONDS = 1_733_400_000  # 2024-12-05T12:00:00Z in seconds; in ms, 1970-01-21
SAID = f"at is in epoch milliseconds; {SECONDS} looks like seconds"


class Nothing(BaseModel):
    pass


order = AggregateType("shop", "order", Nothing)


@order.command("RemindToPay")
def _ping(state: Nothing, cmd: Command, d: Decision) -> None:
    d.emit("Pinged", {})


SERVICE = Service(aggregates=(timer_book("shop", "reminders"), order))


@pytest.mark.parametrize(
    ("at", "refused"),
    [
        (SECONDS, True),
        (10**8, True),  # as seconds 1973-03-03: plainly seconds
        (10**11 - 1, True),  # as ms 1973-03-03T09:46:39.999Z, the last refused
        (10**11, False),  # 1973-03-03T09:46:40Z in ms
        (T0, False),
        (SECONDS * 1000, False),
        # No date either way (as seconds before 1973 too): an "at once" of a test, a
        # script's 0; not taken for seconds.
        (0, False),
        (10**8 - 1, False),
    ],
)
def test_only_an_at_that_reads_as_seconds_is_refused(at: int, refused: bool) -> None:
    why = seconds_reason(OnceRule(at=at))
    assert (why is not None) == refused, why
    if why is not None:
        assert why.startswith(f"at is in epoch milliseconds; {at} looks like seconds"), why
    # A recurring rule's start or until in seconds fires nothing at once (a start only
    # shifts its slots; an until long past leaves no slot, which the book refuses).
    assert seconds_reason(IntervalRule(start=SECONDS, every=60_000)) is None


# --- tickwheel timers set ------------------------------------------------------------------


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[CommandEnvelope]:
    got: list[CommandEnvelope] = []

    async def send(kafka: Any, cmd: CommandEnvelope, wait_s: float) -> None:
        got.append(cmd)

    monkeypatch.setattr(app.cli.timer_changes, "send_change", send)
    return got


SET = [
    *("timers", "set", "--type", "shop.reminders", "--owner", "o-1", "--key", "k"),
    *("--target-type", "shop.order", "--command", "RemindToPay"),
]


@pytest.mark.parametrize(
    "rule",
    [f"once:{SECONDS}", f'{{"kind": "once", "at": {SECONDS}}}'],
    ids=["shorthand", "json"],
)
def test_timers_set_refuses_an_at_in_seconds_and_exits_2(
    sent: list[CommandEnvelope], rule: str
) -> None:
    result = CliRunner().invoke(cli, [*SET, "--rule", rule])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: rule.once.at: {SAID}"), line
    assert "2024-12-05T12:00:00" in line and f"{SECONDS}000" in line, line
    assert sent == [] and result.stdout == ""


def test_timers_set_takes_an_at_in_milliseconds(sent: list[CommandEnvelope]) -> None:
    result = CliRunner().invoke(cli, [*SET, "--rule", f"once:{SECONDS}000", "--wait", "0"])
    assert result.exit_code == 1, result.output  # sent; no answer (the fake gives none)
    (cmd,) = sent
    assert cmd.body["rule"]["at"] == SECONDS * 1000


# --- PUT /timers/{type}/{owner}/{key} ------------------------------------------------------


@pytest.fixture
async def edge(tmp_path: Path) -> AsyncIterator[WebNode]:
    async with web_node(SERVICE, tmp_path, FakeClock(T0), WebNode, partitions=P) as e:
        yield e


async def test_a_put_with_an_at_in_seconds_is_a_400_naming_it(edge: WebNode) -> None:
    body = {
        "rule": {"kind": "once", "at": SECONDS},
        "target": {"type": "shop.order", "id": "p-1"},
        "command": {"type": "RemindToPay", "body": {}},
    }
    status, answer = await edge.call("PUT", "/timers/shop.reminders/o-1/k", body)
    assert status == 400, answer
    assert answer["field"] == "rule.once.at" and answer["error"].startswith(SAID), answer
    assert set(answer) == {"error", "field", "request_id"} and answer["request_id"] is None
    assert all(edge.log.records(BOOK.commands, p) == [] for p in range(P))
    status, answer = await edge.call(
        "PUT", "/timers/shop.reminders/o-1/k", {**body, "rule": {"kind": "once", "at": T0}}
    )
    assert (status, answer["code"]) == (200, "COMMITTED"), answer


# --- the faust client ----------------------------------------------------------------------


async def test_the_faust_client_raises_for_an_at_in_seconds_and_sends_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    faust_app = faust.App("unit-at-in-seconds", broker="kafka://broker.invalid:9092")
    timers = TickwheelTimers(
        faust_app, context="shop", book="reminders", target="order", partitions=P
    )
    sends: list[Any] = []

    async def send(*args: Any) -> None:
        sends.append(args)

    monkeypatch.setattr(timers, "_send_to_book", send)
    with pytest.raises(ValueError, match=SAID):
        await timers.schedule(
            "o-1", "k", OnceRule(at=SECONDS), CommandSpec(type="RemindToPay"), request_id="r"
        )
    assert sends == []
    await timers.schedule(
        "o-1", "k", OnceRule(at=SECONDS * 1000), CommandSpec(type="RemindToPay"), request_id="r"
    )
    assert len(sends) == 1


# --- the node ------------------------------------------------------------------------------


def test_the_book_still_takes_such_a_set_from_the_log() -> None:
    """What the node accepts is the wire's: another writer's set with a small `at` is
    decided as before (it fires at once)."""
    book = timer_book("shop", "reminders")
    owner = AggregateRef(context="shop", aggregate="reminders", id="o-1")
    target = {"context": "shop", "aggregate": "order", "tenant": "(0)", "id": "o-1"}
    cmd = CommandEnvelope(
        request_id="r",
        type=SET_TIMER,
        aggregate=owner,
        body={
            "key": "k",
            "rule": {"kind": "once", "at": SECONDS},
            "target": target,
            "command": {"type": "RemindToPay", "body": {}},
        },
        issued_at=T0,
    )
    decided = decide(book, None, cmd, now=T0, seen=False)
    assert decided.code is ResultCode.COMMITTED, decided.message
    assert [e.type for e in decided.events] == ["wow.ScheduleSet"]
