"""A timer's command larger than the node reads (`TICKWHEEL_MAX_RECORD_BYTES`, its id past
`TICKWHEEL_MAX_KEY_BYTES`) is refused where it is built, naming its size and the limit: the
node would dead-letter it unread with no answer, so the CLI would wait in vain, the web
edge answer 504 for ever and a faust app's command be lost. One just within is sent."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import faust
import orjson
import pytest
from fakes import T0, FakeClock, WebNode, web_node
from pydantic import BaseModel
from typer.testing import CliRunner

import app.cli.timer_changes
from app.cli import cli
from app.clients.book_commands import BookCommands
from app.clients.faust_client import TickwheelTimers
from app.clients.timer_book import timer_book
from app.kafka.connection import Connectable
from app.model.aggregate import AggregateType, Command, Decision
from app.ops.timer_api import BadRequest, TimerPut, owner_ref, set_command
from app.protocol.limits import DEFAULT_MAX_RECORD_BYTES, InputLimits
from app.protocol.topics import AggregateTopics
from app.protocol.wire import CommandEnvelope, CommandResult, ResultCode, encode
from app.service import Service
from tables import CommandSpec, OnceRule

P = 2
BOOK = AggregateTopics("shop", "reminders")
LATER = T0 + 86_400_000
UNBOUNDED = InputLimits(max_key_bytes=1 << 30, max_record_bytes=1 << 30)


class Pings(BaseModel):
    n: int = 0


order = AggregateType("shop", "order", Pings)


@order.command("RemindToPay")
def _ping(state: Pings, cmd: Command, d: Decision) -> None:
    d.emit("Pinged", {"n": state.n + 1})


def padded(n: int) -> dict[str, Any]:
    """A command body of which `n` characters are padding (one byte each, encoded)."""
    return {"pad": "x" * n}


def pad_for(size: int, base: int) -> int:
    """The padding that makes a record of `base` bytes with none `size` bytes long."""
    assert base < size
    return size - base


# --- the web edge ---------------------------------------------------------------------------


@pytest.fixture
async def edge(tmp_path: Path) -> AsyncIterator[WebNode]:
    service = Service(aggregates=(timer_book("shop", "reminders"), order))
    async with web_node(service, tmp_path, FakeClock(T0), WebNode, partitions=P) as e:
        yield e


def put_body(n: int, request_id: str) -> dict[str, Any]:
    return {
        "rule": {"kind": "once", "at": LATER},
        "target": {"type": "shop.order", "id": "p-1"},
        "command": {"type": "RemindToPay", "body": padded(n)},
        "request_id": request_id,
    }


def set_size(body: dict[str, Any]) -> int:
    """The bytes of the record the web edge sends for `body` (its issued_at as many digits
    as the edge's clock's)."""
    put = TimerPut.model_validate(body)
    owner = owner_ref("shop.reminders", "o-1", "(0)")
    now = time.time_ns() // 1_000_000
    cmd = set_command(timer_book("shop", "reminders"), owner, "k", put, now, limits=UNBOUNDED)
    return len(encode(cmd))


async def test_a_put_over_the_nodes_record_size_is_a_400_naming_the_command(
    edge: WebNode,
) -> None:
    limit = edge.node.settings.max_record_bytes
    n = pad_for(limit + 1, set_size(put_body(0, "r-1")))
    status, answer = await edge.call("PUT", "/timers/shop.reminders/o-1/k", put_body(n, "r-1"))
    assert (status, answer["field"]) == (400, "command"), answer
    assert (
        f"record of {limit + 1} bytes exceeds {limit} (TICKWHEEL_MAX_RECORD_BYTES)"
        in (answer["error"])
    )
    assert all(edge.log.records(BOOK.commands, p) == [] for p in range(P))
    # One byte less: the node reads it and answers.
    status, answer = await edge.call("PUT", "/timers/shop.reminders/o-1/k", put_body(n - 1, "r-2"))
    assert status == 200 and answer["code"] == "COMMITTED", answer
    (sent,) = [r.value for p in range(P) for r in edge.log.records(BOOK.commands, p)]
    assert sent is not None and len(sent) == limit


def test_an_owner_id_past_the_key_bound_is_refused_naming_the_owner() -> None:
    put = TimerPut.model_validate(put_body(0, "r"))
    owner = owner_ref("shop.reminders", "o" * 17, "(0)")
    with pytest.raises(BadRequest, match="key of 17 bytes exceeds 16") as info:
        set_command(
            timer_book("shop", "reminders"), owner, "k", put, T0, limits=InputLimits(16, 4096)
        )
    assert info.value.field == "owner"


# --- the command line -----------------------------------------------------------------------


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[CommandEnvelope]:
    """What `tickwheel timers set` sends, each answered COMMITTED."""
    got: list[CommandEnvelope] = []

    async def send(kafka: Connectable, cmd: CommandEnvelope, wait_s: float) -> CommandResult:
        got.append(cmd)
        return CommandResult(
            request_id=cmd.request_id,
            code=ResultCode.COMMITTED,
            aggregate=cmd.aggregate,
            version=1,
            decided_at=T0,
        )

    monkeypatch.setattr(app.cli.timer_changes, "send_change", send)
    return got


def cli_set(n: int) -> list[str]:
    return [
        "timers",
        "set",
        "--type",
        "shop.reminders",
        "--owner",
        "o-1",
        "--key",
        "k",
        "--target-type",
        "shop.order",
        "--command",
        "RemindToPay",
        "--rule",
        f"once:{LATER}",
        "--request-id",
        "r-1",
        "--body",
        orjson.dumps(padded(n)).decode(),
    ]


@pytest.mark.parametrize("limit", [DEFAULT_MAX_RECORD_BYTES, 4096])
def test_a_set_over_the_settings_record_size_exits_2_and_sends_nothing(
    sent: list[CommandEnvelope], monkeypatch: pytest.MonkeyPatch, limit: int
) -> None:
    # The limit the node reads with: the same settings (environment) as the node's.
    monkeypatch.setenv("TICKWHEEL_MAX_RECORD_BYTES", str(limit))
    ok = CliRunner().invoke(cli, cli_set(0))
    assert ok.exit_code == 0, ok.output
    n = pad_for(limit + 1, len(encode(sent.pop())))
    over = CliRunner().invoke(cli, cli_set(n))
    assert over.exit_code == 2, over.output
    assert over.stderr == (
        f"error: command: the wow.SetTimer's record of {limit + 1} bytes exceeds {limit} "
        "(TICKWHEEL_MAX_RECORD_BYTES): the node would drop it unread, unanswered\n"
    )
    assert sent == []
    under = CliRunner().invoke(cli, cli_set(n - 1))
    assert under.exit_code == 0, under.output
    (cmd,) = sent
    assert len(encode(cmd)) == limit


# --- the faust client -----------------------------------------------------------------------


class FakeChannel:
    """A faust topic as the client sends to one: records what is sent; acked at once."""

    def __init__(self, sent: list[bytes]) -> None:
        self.sent = sent

    async def send(self, *, key: bytes, value: bytes, **kw: Any) -> asyncio.Future[None]:
        self.sent.append(value)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


@pytest.fixture
def faust_sent(monkeypatch: pytest.MonkeyPatch) -> tuple[TickwheelTimers, list[bytes]]:
    """A faust app's timers (no broker: nothing connects until started) and what it sent."""
    fapp = faust.App("unit-command-size", broker="kafka://broker.invalid:9092")
    values: list[bytes] = []
    monkeypatch.setattr(fapp, "topic", lambda name, **kw: FakeChannel(values))
    t = TickwheelTimers(fapp, context="shop", book="reminders", target="order", partitions=P)

    async def ensure() -> None:  # the topics are the broker's business
        return None

    monkeypatch.setattr(t.topology, "ensure", ensure)
    return t, values


async def test_a_faust_schedule_over_the_record_size_is_a_value_error_and_sends_nothing(
    faust_sent: tuple[TickwheelTimers, list[bytes]],
) -> None:
    timers, values = faust_sent
    limit = DEFAULT_MAX_RECORD_BYTES

    def spec(n: int) -> CommandSpec:
        return CommandSpec(type="RemindToPay", body=padded(n))

    base = timers.set_command("o-1", "k", OnceRule(at=LATER), spec(0), request_id="r")
    n = pad_for(limit + 1, len(encode(base)))
    with pytest.raises(ValueError, match=rf"record of {limit + 1} bytes exceeds {limit} \("):
        await timers.schedule("o-1", "k", OnceRule(at=LATER), spec(n), request_id="r")
    assert values == []
    await timers.schedule("o-1", "k", OnceRule(at=LATER), spec(n - 1), request_id="r")
    assert [len(v) for v in values] == [limit]


def test_book_commands_take_the_nodes_limits() -> None:
    clock = iter(range(T0, T0 + 10))
    commands = BookCommands(
        timer_book("shop", "reminders"),
        AggregateTopics("shop", "order"),
        lambda: next(clock),
        InputLimits(max_key_bytes=16, max_record_bytes=2048),
    )
    with pytest.raises(ValueError, match="key of 17 bytes exceeds 16"):
        commands.cancel_command("o" * 17, "k", "r")
    with pytest.raises(ValueError, match="exceeds 2048 \\(TICKWHEEL_MAX_RECORD_BYTES\\)"):
        commands.set_command(
            "o-1", "k", OnceRule(at=LATER), CommandSpec(type="R", body=padded(2048)), "r"
        )
    commands.set_command("o-1", "k", OnceRule(at=LATER), CommandSpec(type="R", body=padded(1)), "r")


def test_a_faust_app_takes_the_workers_raised_record_size() -> None:
    """Workers with TICKWHEEL_MAX_RECORD_BYTES raised read larger commands: the app given
    the same refuses none of them."""
    fapp = faust.App("unit-command-size-raised", broker="kafka://broker.invalid:9092")
    kw: dict[str, Any] = {"context": "shop", "book": "reminders", "target": "order"}
    raised = TickwheelTimers(fapp, **kw, partitions=P, max_record_bytes=512 * 1024)
    spec = CommandSpec(type="RemindToPay", body=padded(DEFAULT_MAX_RECORD_BYTES))
    raised.set_command("o-1", "k", OnceRule(at=LATER), spec, request_id="r")
    default = TickwheelTimers(fapp, **kw, partitions=P)
    with pytest.raises(ValueError, match="TICKWHEEL_MAX_RECORD_BYTES"):
        default.set_command("o-1", "k", OnceRule(at=LATER), spec, request_id="r")
