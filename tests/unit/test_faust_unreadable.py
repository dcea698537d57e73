"""The faust client's command topic without a broker: a record that is not a command is
dead-lettered and, where its reply address still reads, answered ERROR as a node answers
one (app.commands.intake), so the timer that sent it fails at once instead of waiting out
its send_timeout and parking as TIMEOUT (docs/faust.md)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import faust
import orjson
import pytest
from aiokafka.errors import KafkaTimeoutError
from fakes import order_type
from faust.types import Message

from app.clients.faust_client import TickwheelTimers
from app.commands.processor import CommandProcessor
from app.kafka import OutRecord, Record
from app.protocol.dead_letters import DeadLetter, Stage
from app.protocol.wire import IN_PROCESS_HEADERS, CommandEnvelope, ResultCode, encode
from tables import AggregateRef
from tables.aggregate_store import MemoryAggregateStore
from tables.partitioner import partition_of

P = 4
NOW = 1_800_000_000_000
ORDER = AggregateRef(context="shop", aggregate="order", id="o-1")
HOME = partition_of(ORDER.id, P)  # where the order's records belong
TOPIC = "shop.order.commands"
Sent = list[tuple[str, int | None, bytes | None, bytes | None, list[tuple[str, bytes]]]]


class FakeChannel:
    """A faust topic as the command topic uses one: records each send (with its headers);
    a topic named in `failing` fails it, as a broker that never took the record."""

    def __init__(self, name: str, sent: Sent, failing: set[str]) -> None:
        self.name, self.sent, self.failing = name, sent, failing

    async def send(
        self,
        *,
        key: bytes | None,
        value: bytes | None,
        partition: int | None,
        headers: list[tuple[str, bytes]] | None = None,
        force: bool = False,
    ) -> asyncio.Future[None]:
        assert force, "never attached to the event being read"
        self.sent.append((self.name, partition, key, value, list(headers or ())))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.name in self.failing:
            done.set_exception(KafkaTimeoutError(f"{self.name} down"))
        else:
            done.set_result(None)
        return done


@pytest.fixture
def app() -> faust.App:
    return faust.App("unit-faust-unreadable", broker="kafka://broker.invalid:9092")


@pytest.fixture
def failing() -> set[str]:
    return set()


@pytest.fixture
def sent(app: faust.App, monkeypatch: pytest.MonkeyPatch, failing: set[str]) -> Sent:
    records: Sent = []
    monkeypatch.setattr(app, "topic", lambda name, **_: FakeChannel(name, records, failing))
    return records


@pytest.fixture
def timers(app: faust.App) -> TickwheelTimers:
    return TickwheelTimers(
        app, context="shop", book="order-timers", target="order", partitions=P, now=lambda: NOW
    )


def value(**fields: Any) -> dict[str, Any]:
    """A command of the order, answered on partition 2 of its context's results topic
    unless `fields` say otherwise (None: the field left out)."""
    cmd = CommandEnvelope(
        request_id="t-1#0",
        type="shop.Remind",
        aggregate=ORDER,
        not_before=NOW,
        issued_at=NOW,
        reply_to="shop.results",
        reply_partition=2,
    )
    data: dict[str, Any] = orjson.loads(encode(cmd)) | fields
    return {k: v for k, v in data.items() if v is not None}


def huge(data: dict[str, Any]) -> bytes:
    """`data` with a body holding an integer past 64 bits: not a command anyone reads."""
    return orjson.dumps(data | {"body": {"n": 0}}).replace(b'"n":0', b'"n":18446744073709551621')


def record(data: bytes, key: bytes = b"o-1", partition: int = HOME, **kw: Any) -> Record:
    return Record(TOPIC, partition, 7, key, data, NOW, kw.get("headers", ()))


def message_of(r: Record) -> Message:
    headers = list(r.headers)
    return Message(r.topic, r.partition, r.offset, NOW / 1000, 0, headers, r.key, r.value, None)  # type: ignore[arg-type]


async def node_result(r: Record) -> list[tuple[str, int | None, bytes | None, bytes | None]]:
    """The result records a node's processor of the same type writes for `r`."""
    written: list[OutRecord] = []

    async def commit(records: Any, offsets: Any) -> list[int]:
        written.extend(records)
        return list(range(len(records)))

    processor = CommandProcessor(
        order_type(),
        r.partition,
        partitions=P,
        states=MemoryAggregateStore(),
        commit=commit,
        now=lambda: NOW,
    )
    await processor.handle([r])
    return [o[:4] for o in written if o[0] == "shop.results"]


UNREADABLE = [
    pytest.param(record(huge(value())), id="a body past 64 bits"),
    pytest.param(record(huge(value(reply_to="shop.order.events"))), id="reply_to elsewhere"),
    pytest.param(record(huge(value(reply_partition=4))), id="a reply partition not there"),
    pytest.param(record(huge(value(reply_partition=None))), id="no reply partition"),
    pytest.param(record(orjson.dumps(value(not_before="soon"))), id="a field of the wrong type"),
    pytest.param(record(orjson.dumps(value(type=7))), id="a command type not a string"),
    pytest.param(record(encode(CommandEnvelope(**value())), key=b"o-2"), id="keyed otherwise"),
    pytest.param(
        record(encode(CommandEnvelope(**value())), partition=(HOME + 1) % P), id="misrouted"
    ),
    pytest.param(
        record(
            orjson.dumps(value(aggregate={"context": "shop", "aggregate": "other", "id": "o-1"}))
        ),
        id="another type's command",
    ),
]


@pytest.mark.parametrize("bad", UNREADABLE)
async def test_an_unreadable_command_is_dead_lettered_and_answered_as_a_node_answers(
    timers: TickwheelTimers, sent: Sent, bad: Record
) -> None:
    """Only dead-lettered, its sender (a timer) waited out its timeout at each attempt and
    parked as TIMEOUT. Answered ERROR with why, on the record a node of the same type
    writes for it (its topic, partition, key and bytes), and never handed to the agent."""
    await timers.commands.decode(message_of(bad))
    assert [s[0] for s in sent] == ["shop.dead-letters", "shop.results"]
    (_, _, key, letter_value, headers), answer = sent
    letter = DeadLetter.read(key, letter_value, headers)
    assert (letter.topic, letter.partition, letter.offset, letter.context.stage) == (
        TOPIC,
        bad.partition,
        7,
        Stage.READ,
    )
    answered = orjson.loads(answer[3] or b"")
    assert (answered["code"], answered["request_id"]) == (ResultCode.ERROR.value, "t-1#0")
    assert answered["aggregate"]["id"] == "o-1" and answered["message"] in letter.error
    assert answer[:4] == tuple((await node_result(bad))[0]), "the node's own answer"


async def test_a_reply_address_elsewhere_is_answered_on_the_contexts_own_results_topic(
    timers: TickwheelTimers, sent: Sent
) -> None:
    """As a command that reads: never written where another writer asks."""
    for elsewhere in ({"reply_to": "payments.events"}, {"reply_partition": 4095}):
        sent.clear()
        await timers.commands.decode(message_of(record(huge(value(**elsewhere)))))
        (_, (topic, partition, key, _, _)) = sent
        assert (topic, partition, key) == ("shop.results", partition_of("t-1#0", P), b"t-1#0")


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (record(b'{"request_id": "t-1#0", "aggregate"'), "not JSON"),
        (record(b"\xff\xfe"), "not UTF-8"),
        (record(huge(value(request_id=None))), "no request id"),
        (record(huge(value(request_id="x" * 301))), "a request id too long"),
        (record(huge(value(aggregate=ORDER.model_dump() | {"shard": 1}))), "an odd aggregate"),
        (record(huge(value(reply_partition="2"))), "a reply partition not a number"),
        (record(orjson.dumps(value(body={"pad": "x" * 300_000}))), "over the record bound"),
        (
            record(huge(value(in_process=True)), headers=IN_PROCESS_HEADERS),
            "a node's own record of an in-process command",
        ),
        (record(huge(value(reply_to=None, reply_partition=None))), "no reply_to: unanswered"),
    ],
)
async def test_one_without_a_reply_address_that_reads_is_only_dead_lettered(
    timers: TickwheelTimers, sent: Sent, bad: Record, why: str
) -> None:
    await timers.commands.decode(message_of(bad))
    assert [s[0] for s in sent] == ["shop.dead-letters"], why


async def test_a_tombstone_is_only_dead_lettered(timers: TickwheelTimers, sent: Sent) -> None:
    m = Message(TOPIC, HOME, 7, NOW / 1000, 0, None, b"o-1", None, None)
    await timers.commands.decode(m)
    assert [s[0] for s in sent] == ["shop.dead-letters"]


async def test_the_limits_are_the_workers_given_to_the_client(app: faust.App, sent: Sent) -> None:
    """`max_record_bytes`: a record over it is one the workers never parse."""
    names: dict[str, Any] = {"context": "shop", "book": "order-timers", "target": "order"}
    small = TickwheelTimers(app, partitions=P, max_record_bytes=1_000, **names)
    bad = record(huge(value(type="shop." + "R" * 1_000)))
    await small.commands.decode(message_of(bad))
    assert [s[0] for s in sent] == ["shop.dead-letters"]


async def test_a_command_within_the_workers_larger_bound_reaches_the_agent(
    app: faust.App, sent: Sent
) -> None:
    """Workers with `TICKWHEEL_MAX_RECORD_BYTES` of 1 MiB fire a 400 kB command (their own
    intake reads it): the client given their bound reads it as they do, not by the default
    256 KiB, which dead-lettered it and answered ERROR."""
    names: dict[str, Any] = {"context": "shop", "book": "order-timers", "target": "order"}
    large = TickwheelTimers(app, partitions=P, max_record_bytes=1_048_576, **names)
    cmd = CommandEnvelope(**value(body={"pad": "x" * 400_000}))
    event = await large.commands.decode(message_of(record(encode(cmd))))
    assert (event.key, event.value, sent) == ("o-1", cmd, [])
    small = TickwheelTimers(app, partitions=P, max_record_bytes=1_000, **names)
    await small.commands.decode(message_of(record(encode(CommandEnvelope(**value())), b"o-1")))
    assert sent == [], "a command within the bound reads"
    await small.commands.decode(message_of(record(encode(cmd))))
    assert [s[0] for s in sent] == ["shop.dead-letters"], "over it: never parsed, unanswered"


async def test_a_failed_send_is_logged_and_the_other_still_sent(
    timers: TickwheelTimers,
    sent: Sent,
    failing: set[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """faust acks the record before it hands it over: raising would stop its fetcher."""
    for down in ("shop.dead-letters", "shop.results"):
        failing.clear()
        failing.add(down)
        sent.clear()
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="app.clients.faust_client"):
            await timers.commands.decode(message_of(record(huge(value()))))
        assert [s[0] for s in sent] == ["shop.dead-letters", "shop.results"]
        (logged,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        what = "dead-letter" if down == "shop.dead-letters" else "answer"
        assert logged.startswith(f"could not {what} {TOPIC}[{HOME}]@7 (")
        assert logged.endswith(f"to {down}: the record is skipped, read it again from there")


async def test_the_agents_clone_of_the_topic_answers_too(
    timers: TickwheelTimers, sent: Sent
) -> None:
    """faust iterates a clone of the topic: what the answer needs travels with it."""
    clone = timers.commands.clone(is_iterator=False)
    assert type(clone) is type(timers.commands)
    await clone.decode(message_of(record(huge(value()))))
    assert [s[0] for s in sent] == ["shop.dead-letters", "shop.results"]
