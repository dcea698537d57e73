"""The faust client's durability without a broker: the replication of the topics it makes,
request ids that cannot be derived, sends that fail inside an agent or while dead-lettering
(docs/faust.md)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import faust
import pytest
from aiokafka.errors import KafkaTimeoutError
from faust.types import Message
from faust.types.tuples import _PendingMessage_to_Message

from app.clients.book_commands import scoped_request_id
from app.clients.faust_client import NODE_REPLICATION, TickwheelTimers, request_id_for
from app.kafka.admin import replication_for
from app.kafka.records import Replication
from app.node.settings import Settings
from app.protocol.wire import ResultCode
from tables import AggregateRef, CommandSpec, OnceRule
from tables.partitioner import partition_of

P = 6
NOW = 1_700_000_000_000
CTX = "rem"
Sent = list[tuple[str, int, bytes, bool]]


class FakeChannel:
    """A faust topic as the client uses one: records each send (with its `force`), and
    answers with a future that `failure` fails (a broker that never took the record)."""

    def __init__(self, name: str, sent: Sent, failure: Exception | None) -> None:
        self.name, self.sent, self.failure = name, sent, failure

    async def send(
        self, *, key: bytes, value: bytes, partition: int, force: bool = False, **_: Any
    ) -> asyncio.Future[None]:
        self.sent.append((self.name, partition, key, force))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.failure is None:
            done.set_result(None)
        else:
            done.set_exception(self.failure)
        return done


@pytest.fixture
def app() -> faust.App:
    return faust.App("unit-faust-durability", broker="kafka://broker.invalid:9092")


@pytest.fixture
def timers(app: faust.App) -> TickwheelTimers:
    t = TickwheelTimers(
        app, context=CTX, book="order-timers", target="order", partitions=P, now=lambda: NOW
    )
    t.topology._made = True  # no broker: the topics count as made
    return t


def channels(app: faust.App, monkeypatch: pytest.MonkeyPatch, failure: Exception | None) -> Sent:
    sent: Sent = []
    monkeypatch.setattr(app, "topic", lambda name, **_: FakeChannel(name, sent, failure))
    return sent


def in_agent(monkeypatch: pytest.MonkeyPatch, message: Message) -> None:
    """As if an agent were processing the event of `message`."""
    event = type("Event", (), {"message": message})()
    monkeypatch.setattr("app.clients.faust_client.current_event", lambda: event)


def read(topic: str | None, partition: int, offset: int, value: bytes = b"{}") -> Message:
    return Message(topic, partition, offset, NOW / 1000, 0, None, b"o-1", value, None)  # type: ignore[arg-type]


def remind(t: TickwheelTimers, **kwargs: Any) -> Any:
    spec = CommandSpec(type="reminders.Remind")
    return t.schedule("o-1", "reminder", OnceRule(at=NOW + 1000), spec, **kwargs)


# --- 1. the topics it makes are as durable as the workers' ----------------------------------


async def test_the_topics_are_made_with_the_workers_default_replication(
    app: faust.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The app may start before the workers: the book's topics it makes then are theirs,
    so as replicated as a worker makes them (on fewer brokers, capped as theirs are)."""
    asked: list[Replication | None] = []

    async def ensure_topics(bootstrap: str, specs: Any, replication: Any = None) -> None:
        asked.append(replication)

    monkeypatch.setattr("app.kafka.clients.ensure_topics", ensure_topics)
    fields = Settings.model_fields
    workers = Replication(
        fields["replication_factor"].default, fields["min_insync_replicas"].default
    )
    assert NODE_REPLICATION == workers == Replication(3, 2)
    args: dict[str, Any] = {"context": CTX, "book": "order-timers", "target": "order"}
    await TickwheelTimers(app, partitions=P, **args).topology.ensure()
    one = Replication(1, 1)  # a single broker's, as tests may ask
    await TickwheelTimers(app, partitions=P, replication=one, **args).topology.ensure()
    assert asked == [workers, one]
    # The single broker of the integration tests takes the default as a worker's would.
    assert replication_for(NODE_REPLICATION, 1) == one


# --- 2. no request id from an event that was read from no topic ------------------------------


def channel_message(app: faust.App) -> Message:
    """A message as faust makes one for a value sent to an `app.channel()`."""
    pending = app.channel().as_future_message(key=b"o-1", value=b"v").message
    return _PendingMessage_to_Message(pending)


async def test_an_app_channels_event_gives_no_request_id(app: faust.App) -> None:
    m = channel_message(app)
    assert m.topic is None and m.offset == -1  # faust types it str all the same
    for message in (m, read("rem.orders", 0, -1), read("", 0, 3)):
        with pytest.raises(ValueError, match=r"read from no topic .* pass request_id="):
            request_id_for("set", "reminder", message)
    assert request_id_for("set", "reminder", read("rem.orders", 0, 0)) == (
        "rem.orders[0]@0:set:reminder"
    )


async def test_in_a_channels_agent_a_command_needs_its_request_id(
    app: faust.App, timers: TickwheelTimers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Derived, every event's id would be the same: a key's second schedule or cancel
    within the de-duplication window answered DUPLICATE, and dropped."""
    sent = channels(app, monkeypatch, None)
    in_agent(monkeypatch, channel_message(app))
    with pytest.raises(ValueError, match="pass request_id="):
        await remind(timers)
    with pytest.raises(ValueError, match="pass request_id="):
        await timers.cancel("o-1", "reminder")
    assert sent == []
    given = await remind(timers, request_id="order-7:remind")
    assert given.request_id == scoped_request_id("set", "reminder", "order-7:remind")
    assert len(sent) == 1


# --- 3. a send that fails inside an agent raises there ---------------------------------------


async def test_a_failed_send_in_an_agent_raises_there(
    app: faust.App, timers: TickwheelTimers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not left to faust, which commits the event's offset without waiting for (or
    raising) the agent's sends: the schedule would be lost with no word."""
    sent = channels(app, monkeypatch, KafkaTimeoutError("no broker took it"))
    in_agent(monkeypatch, read("rem.orders", 2, 41))
    with pytest.raises(KafkaTimeoutError, match="no broker took it"):
        await remind(timers)
    with pytest.raises(KafkaTimeoutError):
        await timers.cancel("o-1", "reminder")
    fired = timers.commands_of.key_command("trigger", "o-1", "r", "t1").model_copy(
        update={
            "aggregate": AggregateRef(context=CTX, aggregate="order", id="o-1"),
            "reply_to": f"{CTX}.results",
        }
    )
    with pytest.raises(KafkaTimeoutError):
        await timers.answer(fired, ResultCode.COMMITTED)
    book = partition_of("o-1", P)
    # Each forced: not attached to the event (with stream_publish_on_commit), whose
    # commit would wait for the very send awaited here.
    assert [(t, p, f) for t, p, _, f in sent] == [
        (f"{CTX}.order-timers.commands", book, True),
        (f"{CTX}.order-timers.commands", book, True),
        (f"{CTX}.results", partition_of("t1", P), True),
    ]


# --- 4. a dead letter that cannot be sent is logged, where the record is --------------------


async def test_a_failed_dead_letter_is_logged_with_the_records_place(
    app: faust.App,
    timers: TickwheelTimers,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """faust acks the record before it hands it over: raising would not keep it but would
    stop faust's fetcher. The error log says where to read it again."""
    sent = channels(app, monkeypatch, KafkaTimeoutError("letters down"))
    topic, p = f"{CTX}.order.commands", partition_of("o-1", P)
    with caplog.at_level(logging.ERROR, logger="app.clients.faust_client"):
        await timers.commands.decode(read(topic, p, 4, b"{not json"))
    assert [(t, f) for t, _, _, f in sent] == [(f"{CTX}.dead-letters", True)]
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert f"could not dead-letter {topic}[{p}]@4" in record.getMessage()
    assert "not a valid CommandEnvelope" in record.getMessage()
    assert record.exc_info is not None and isinstance(record.exc_info[1], KafkaTimeoutError)
