"""A timer's command body nested 63 or 64 levels deep passes the command's own bound (64)
but not the `wow.SetTimer` record that carries it two levels down its body (which nests at
most 64): `PUT /timers/...` answered a plain-text 500, `tickwheel timers set` printed an
unexpected `ValidationError`, the faust client raised a pydantic error naming a path two
levels deeper than the body. Each refuses it now as a bad request, with one bound said for
every depth past it (`MAX_COMMAND_BODY_DEPTH`), and sends nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import faust
import orjson
import pytest
from fakes import T0, FakeClock, WebNode, web_node
from pydantic import BaseModel, ValidationError
from typer.testing import CliRunner

import app.cli.timer_changes
from app.cli import cli
from app.clients.book_commands import MAX_COMMAND_BODY_DEPTH, command_body_reason
from app.clients.faust_client import TickwheelTimers
from app.clients.timer_book import SET_TIMER, timer_book
from app.model.aggregate import AggregateType, Command, Decision
from app.protocol.topics import AggregateTopics
from app.protocol.wire import CommandEnvelope
from app.service import Service
from tables import AggregateRef, CommandSpec, OnceRule

P = 2
BOOK = AggregateTopics("shop", "reminders")
SAID = f"nested more than {MAX_COMMAND_BODY_DEPTH} levels deep"
AT = T0 + 60_000


def nested(levels: int) -> dict[str, Any]:
    """An object `levels` deep (`{}` is one)."""
    body: dict[str, Any] = {}
    for _ in range(levels - 1):
        body = {"a": body}
    return body


class Nothing(BaseModel):
    pass


order = AggregateType("shop", "order", Nothing)


@order.command("RemindToPay")
def _ping(state: Nothing, cmd: Command, d: Decision) -> None:
    d.emit("Pinged", {})


SERVICE = Service(aggregates=(timer_book("shop", "reminders"), order))

TOO_DEEP = [MAX_COMMAND_BODY_DEPTH + 1, MAX_COMMAND_BODY_DEPTH + 2, MAX_COMMAND_BODY_DEPTH + 8]
"""63 and 64 (the command's own bound took them), and 70 (past it too: the same said)."""


def test_the_bound_is_the_set_timer_records() -> None:
    """What `command_body_reason` passes is what a `wow.SetTimer` record carries."""
    assert MAX_COMMAND_BODY_DEPTH == 62

    def record(levels: int) -> CommandEnvelope:
        command = {"type": "RemindToPay", "body": nested(levels)}
        return CommandEnvelope(
            request_id="r",
            type=SET_TIMER,
            aggregate=AggregateRef(context="shop", aggregate="reminders", id="o-1"),
            body={"key": "k", "rule": {"kind": "once", "at": AT}, "command": command},
            issued_at=T0,
        )

    assert command_body_reason(nested(MAX_COMMAND_BODY_DEPTH)) is None
    record(MAX_COMMAND_BODY_DEPTH)
    assert command_body_reason([nested(MAX_COMMAND_BODY_DEPTH)]) is not None
    for levels in TOO_DEEP:
        assert (command_body_reason(nested(levels)) or "").startswith(SAID)
        with pytest.raises(ValidationError, match="nested more than 64 deep"):
            record(levels)


# --- PUT /timers/{type}/{owner}/{key} ------------------------------------------------------


@pytest.fixture
async def edge(tmp_path: Path) -> AsyncIterator[WebNode]:
    async with web_node(SERVICE, tmp_path, FakeClock(T0), WebNode, partitions=P) as e:
        yield e


def put(levels: int) -> dict[str, Any]:
    return {
        "rule": {"kind": "once", "at": AT},
        "target": {"type": "shop.order"},
        "command": {"type": "RemindToPay", "body": nested(levels)},
    }


async def test_a_put_of_a_command_body_nested_too_deep_is_a_400_naming_it(
    edge: WebNode,
) -> None:
    for levels in TOO_DEEP:
        status, answer = await edge.call(
            "PUT", f"/timers/shop.reminders/o-1/k{levels}", put(levels)
        )
        assert status == 400, (levels, answer)
        assert answer["field"] == "command.body", answer
        assert answer["error"].startswith(SAID), answer
    assert all(edge.log.records(BOOK.commands, p) == [] for p in range(P))
    path = "/timers/shop.reminders/o-1/k"
    status, answer = await edge.call("PUT", path, put(MAX_COMMAND_BODY_DEPTH))
    assert (status, answer["code"]) == (200, "COMMITTED"), answer


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
    *("--target-type", "shop.order", "--command", "RemindToPay", "--rule", f"once:{AT}"),
]


@pytest.mark.parametrize("levels", TOO_DEEP)
def test_timers_set_refuses_a_body_nested_too_deep_and_exits_2(
    sent: list[CommandEnvelope], levels: int
) -> None:
    result = CliRunner().invoke(cli, [*SET, "--body", orjson.dumps(nested(levels)).decode()])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: --body: {SAID}"), line
    assert sent == [] and result.stdout == ""


def test_timers_set_takes_a_body_as_deep_as_a_set_carries(sent: list[CommandEnvelope]) -> None:
    deepest = orjson.dumps(nested(MAX_COMMAND_BODY_DEPTH)).decode()
    result = CliRunner().invoke(cli, [*SET, "--body", deepest, "--wait", "0"])
    assert result.exit_code == 1, result.output  # sent; no answer (the fake gives none)
    (cmd,) = sent
    assert cmd.body["command"]["body"] == nested(MAX_COMMAND_BODY_DEPTH)


# --- the faust client ----------------------------------------------------------------------


async def test_the_faust_client_raises_for_a_body_nested_too_deep_and_sends_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    faust_app = faust.App("unit-set-body-depth", broker="kafka://broker.invalid:9092")
    timers = TickwheelTimers(
        faust_app, context="shop", book="reminders", target="order", partitions=P
    )
    sends: list[Any] = []

    async def send(*args: Any) -> None:
        sends.append(args)

    monkeypatch.setattr(timers, "_send_to_book", send)
    for levels in TOO_DEEP[:2]:  # (the command takes them; 70 it refuses itself)
        command = CommandSpec(type="RemindToPay", body=nested(levels))
        with pytest.raises(ValueError, match=f"^command.body: {SAID}"):
            await timers.schedule("o-1", "k", OnceRule(at=AT), command, request_id="r")
    assert sends == []
    command = CommandSpec(type="RemindToPay", body=nested(MAX_COMMAND_BODY_DEPTH))
    await timers.schedule("o-1", "k", OnceRule(at=AT), command, request_id="r")
    assert len(sends) == 1
