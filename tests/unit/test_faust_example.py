"""examples/faust_app.py's agents without a broker (docs/faust.md shows their code): a fired
command is answered COMMITTED only once the reminder it sends is on the broker, and a timer
command whose send fails is sent again rather than lost with the event faust acks."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import AsyncIterator
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import KafkaTimeoutError
from faust.types import Message

from app import AggregateRef, CommandEnvelope, ResultCode, decode
from app.protocol.wire import CommandResult

NOW_S = 1_800_000_000.0
Sent = list[tuple[str, bytes, bytes, int]]


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    fa = importlib.import_module("examples.faust_app")  # its faust app connects to nothing
    monkeypatch.setattr(fa.timers.topology, "_made", True)  # no broker: topics count as made
    return fa


def timer_sends(fa: ModuleType, monkeypatch: pytest.MonkeyPatch, failures: int = 0) -> Sent:
    """What the client sends (answers, timer commands); its first `failures` sends fail,
    as a broker that never took the record."""
    sent: Sent = []

    async def send(topic: str, key: bytes, value: bytes, partition: int) -> None:
        sent.append((topic, key, value, partition))
        if len(sent) <= failures:
            raise KafkaTimeoutError("batch expired")

    monkeypatch.setattr(fa.timers, "_send", send)
    return sent


class Reminders:
    """`reminders-sent` as the agent uses it: each send queued, its delivery a future that
    the broker settles later (`fails`: with an error)."""

    def __init__(self, fails: bool) -> None:
        self.fails = fails
        self.deliveries: list[asyncio.Future[None]] = []
        self.forced: list[bool] = []

    async def maybe_declare(self) -> None:
        pass

    async def send(self, *, key: str, value: Any, force: bool = False) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        delivery: asyncio.Future[None] = loop.create_future()
        if self.fails:
            loop.call_soon(delivery.set_exception, KafkaTimeoutError())
        else:
            loop.call_soon(delivery.set_result, None)
        self.deliveries.append(delivery)
        self.forced.append(force)
        return delivery


def fired(fa: ModuleType) -> CommandEnvelope:
    return CommandEnvelope(
        request_id="tid#0",
        type="reminders.Remind",
        aggregate=AggregateRef(context=fa.CONTEXT, aggregate=fa.TARGET, id="o-1"),
        body={"order_id": "o-1"},
        issued_at=1,
        not_before=1,
        reply_to=f"{fa.CONTEXT}.results",
        reply_partition=0,
    )


async def one(item: Any) -> AsyncIterator[Any]:
    yield item


@pytest.mark.parametrize("fails", [False, True])
async def test_a_fired_command_is_answered_once_its_reminder_is_on_the_broker(
    example: ModuleType, monkeypatch: pytest.MonkeyPatch, fails: bool
) -> None:
    """faust's send only queues: answered COMMITTED at once, a reminder the broker then
    failed was lost with the timer's slot settled. Answered ERROR, the worker sends it
    again with backoff."""
    reminders = Reminders(fails)
    monkeypatch.setattr(example, "reminders_sent", reminders)
    sent = timer_sends(example, monkeypatch)
    delivered: list[bool] = []
    send = example.timers._send

    async def answering(topic: str, key: bytes, value: bytes, partition: int) -> None:
        delivered.append(all(d.done() for d in reminders.deliveries))
        await send(topic, key, value, partition)

    monkeypatch.setattr(example.timers, "_send", answering)
    await example.on_fired.fun(one(fired(example)))
    ((topic, key, value, _),) = sent
    result = decode(CommandResult, value)
    assert (topic, key, delivered, reminders.forced) == (
        f"{example.CONTEXT}.results",
        b"tid#0",
        [True],
        [True],
    )
    if fails:
        assert result.code == ResultCode.ERROR
        assert result.message.startswith("reminder not sent: KafkaTimeoutError")
    else:
        assert result.code == ResultCode.COMMITTED


def order_event(fa: ModuleType, kind: str, timestamp: float = NOW_S) -> Any:
    """An order event read at `<context>.orders[3]@41`."""
    value = SimpleNamespace(order_id="o-1", kind=kind, remind_in_ms=60_000)
    topic = f"{fa.CONTEXT}.orders"
    message = Message(topic, 3, 41, timestamp, 0, None, b"o-1", b"{}", None)
    return SimpleNamespace(value=value, message=message)


def orders(fa: ModuleType, monkeypatch: pytest.MonkeyPatch, event: Any) -> Any:
    """A stream of `event`, processed as in an agent (the client derives request ids
    from it)."""
    monkeypatch.setattr("app.clients.faust_client.current_event", lambda: event)
    return SimpleNamespace(events=lambda: one(event))


@pytest.mark.parametrize(
    ("kind", "op"),
    [
        ("placed", "set"),
        ("paid", "cancel"),
        ("held", "pause"),
        ("released", "resume"),
        ("nudged", "trigger"),
    ],
)
async def test_a_timer_command_that_failed_is_sent_again_not_lost(
    example: ModuleType, monkeypatch: pytest.MonkeyPatch, kind: str, op: str
) -> None:
    """The agent raised, faust acked the event and restarted the agent: the command was
    never sent. Sent again with backoff, under the same request id (one that did arrive
    is a DUPLICATE), before the agent takes the next event."""
    monkeypatch.setattr(example, "RETRY_FIRST_S", 0.0, raising=False)
    sent = timer_sends(example, monkeypatch, failures=2)
    await example.on_order.fun(orders(example, monkeypatch, order_event(example, kind)))
    assert len(sent) == 3
    assert {(topic, key) for topic, key, _, _ in sent} == {
        (f"{example.CONTEXT}.{example.BOOK}.commands", b"o-1")
    }
    ids = {decode(CommandEnvelope, value).request_id for _, _, value, _ in sent}
    assert ids == {f"{example.CONTEXT}.orders[3]@41:{op}:reminder"}


async def test_a_timer_command_the_book_would_refuse_is_raised_and_not_sent_again(
    example: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ValueError is the command's own fault: nothing was sent, no retry would send it."""
    sent = timer_sends(example, monkeypatch)
    seconds = order_event(example, "placed", timestamp=100_000.0)  # `at` 10**8 ms: a 1973 date in s
    with pytest.raises(ValueError, match="seconds"):
        await example.on_order.fun(orders(example, monkeypatch, seconds))
    assert sent == []
