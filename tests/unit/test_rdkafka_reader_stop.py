"""librdkafka's reader's own lifecycle, on a fake consumer in place of confluent-kafka's:
a stop during a read closes the consumer only after the read's call in flight and the read
calls it no more (it ends unavailable); a read left early holds the reader (its lock, its
assignment) until it is closed; a failed start leaves no thread behind; a refusal
(an ACL missing, a login refused) ends a read as the aiokafka reader's does: a
`KafkaUnavailable` that `records.refused` knows, so that no retry is tried."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, ClassVar

import pytest
from confluent_kafka import KafkaError, KafkaException

from app.errors import KafkaUnavailable
from app.kafka import rdkafka_reader
from app.kafka.rdkafka_reader import RdkafkaReader
from app.kafka.records import refused


class _Message:
    def __init__(self, offset: int, error: KafkaError | None = None) -> None:
        self._offset, self._error = offset, error

    def error(self) -> KafkaError | None:
        return self._error

    def offset(self) -> int:
        return self._offset

    def topic(self) -> str:
        return "t"

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"v"

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_000)

    def headers(self) -> None:
        return None


class _Consumer:
    """confluent-kafka's Consumer over a partition of 10 records, its batches handed out in
    turn; a batch of None waits for `gate` (a fetch in flight). Every call is recorded, and
    any after `close` raises, as confluent-kafka's does."""

    made: ClassVar[list[_Consumer]] = []
    batches: ClassVar[list[list[_Message] | None]] = []
    fault: ClassVar[KafkaException | None] = None
    gate = threading.Event()  # a fetch in flight ends
    closing = threading.Event()  # a close ends

    def __init__(self, config: dict[str, Any]) -> None:
        if _Consumer.fault is not None:
            raise _Consumer.fault
        self.calls: list[str] = []
        self.fetching = threading.Event()
        _Consumer.made.append(self)

    def _call(self, name: str) -> None:
        closed = "close" in self.calls
        self.calls.append(name)
        if closed:
            raise RuntimeError(f"{name}: Consumer closed")

    def get_watermark_offsets(self, tp: Any, timeout: float, cached: bool) -> tuple[int, int]:
        self._call("watermarks")
        return 0, 10

    def assign(self, tps: Any) -> None:
        self._call("assign")

    def unassign(self) -> None:
        self._call("unassign")

    def consume(self, num_messages: int, timeout: float) -> list[_Message]:
        self._call("consume")
        batch = _Consumer.batches.pop(0) if _Consumer.batches else []
        if batch is None:
            self.fetching.set()
            _Consumer.gate.wait(10)
            return _Consumer.batches.pop(0) or []
        return batch

    def close(self) -> None:
        self._call("close")
        _Consumer.closing.wait(10)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> type[_Consumer]:
    monkeypatch.setattr(rdkafka_reader, "Consumer", _Consumer)
    _Consumer.made, _Consumer.batches, _Consumer.fault = [], [], None
    _Consumer.gate, _Consumer.closing = threading.Event(), threading.Event()
    _Consumer.closing.set()
    return _Consumer


async def test_a_stop_during_a_read_closes_the_consumer_after_the_reads_call_and_ends_it(
    fake: type[_Consumer],
) -> None:
    reader = RdkafkaReader("127.0.0.1:1", timeout=5.0)
    await reader.start()
    # The first batch; the next one in flight while the caller holds it; then one more.
    fake.batches = [[_Message(o) for o in range(3)], None, [_Message(3)], [_Message(4)]]
    read = reader.read("t", 0, 0)
    assert [r.offset for r in await anext(read)] == [0, 1, 2]
    consumer = fake.made[0]
    await asyncio.to_thread(consumer.fetching.wait, 10)
    fake.closing.clear()
    stopping = asyncio.create_task(reader.stop())
    await asyncio.sleep(0)  # the close is asked for while the fetch is in flight
    fake.gate.set()  # the fetch ends; the close goes on meanwhile
    try:
        with pytest.raises(KafkaUnavailable, match="stopped"):
            # What was fetched before the stop may still be handed out; then it ends.
            for _ in range(3):
                await anext(read)
                fake.closing.set()
    finally:
        fake.closing.set()
    await stopping
    assert consumer.calls[-1] == "close", consumer.calls  # nothing called after it
    assert consumer.calls.count("consume") == 2


async def test_a_stop_after_a_read_was_left_closes_the_consumer_once(
    fake: type[_Consumer],
) -> None:
    reader = RdkafkaReader("127.0.0.1:1", timeout=5.0)
    await reader.start()
    fake.batches = [[_Message(o) for o in range(3)], [_Message(o) for o in range(3, 10)]]
    read = reader.read("t", 0, 0)
    assert [r.offset for r in await anext(read)] == [0, 1, 2]
    await read.aclose()  # left after its first batch: the next was fetched meanwhile
    await reader.stop()
    await reader.stop()
    calls = fake.made[0].calls
    assert calls[-2:] == ["unassign", "close"], calls


async def test_a_read_left_and_not_closed_holds_the_reader_and_its_assignment(
    fake: type[_Consumer],
) -> None:
    reader = RdkafkaReader("127.0.0.1:1", timeout=5.0)
    await reader.start()
    fake.batches = [[_Message(o) for o in range(3)], [_Message(o) for o in range(3, 10)]]
    # Held by a name, as a frame kept in a traceback holds it.
    read = reader.read("t", 0, 0)
    async for _ in read:
        break
    asking = asyncio.create_task(reader.offsets("t", 0))
    for _ in range(10):
        await asyncio.sleep(0)
    consumer = fake.made[0]
    assert not asking.done(), "the read left early let its reader go"
    assert "unassign" not in consumer.calls  # still assigned to the read's partition
    await read.aclose()
    assert await asking == (0, 10)
    assert consumer.calls[-2:] == ["unassign", "watermarks"], consumer.calls
    await reader.stop()


async def test_a_start_that_fails_leaves_no_thread_and_may_be_tried_again(
    fake: type[_Consumer],
) -> None:
    reader = RdkafkaReader("127.0.0.1:1", timeout=5.0)
    before = set(threading.enumerate())
    fake.fault = KafkaException(KafkaError(KafkaError._INVALID_ARG, "bad config"))
    with pytest.raises(KafkaUnavailable, match="bad config"):
        await reader.start()
    started = [t for t in threading.enumerate() if t not in before]
    assert [t.name for t in started] in ([], ["tickwheel-reader"])
    for t in started:
        await asyncio.to_thread(t.join, 10)
        assert not t.is_alive(), "the failed start's thread is left waiting for calls"
    fake.fault = None
    await reader.start()  # the cause fixed: it starts
    assert await reader.offsets("t", 0) == (0, 10)
    await reader.stop()


async def test_a_stop_during_a_start_closes_the_consumer_the_start_makes(
    fake: type[_Consumer], monkeypatch: pytest.MonkeyPatch
) -> None:
    making, made, closed = threading.Event(), threading.Event(), threading.Event()

    class Slow(_Consumer):
        def __init__(self, config: dict[str, Any]) -> None:
            making.set()
            made.wait(10)
            super().__init__(config)

        def close(self) -> None:
            super().close()
            closed.set()

    monkeypatch.setattr(rdkafka_reader, "Consumer", Slow)
    reader = RdkafkaReader("127.0.0.1:1", timeout=5.0)
    starting = asyncio.create_task(reader.start())
    await asyncio.to_thread(making.wait, 10)
    await reader.stop()  # nothing to close yet
    made.set()
    with pytest.raises(KafkaUnavailable, match="stopped during its start"):
        await starting
    assert await asyncio.to_thread(closed.wait, 10), "the consumer made is left open"
    assert fake.made[0].calls == ["close"]


@pytest.mark.parametrize(
    "code",
    [29, 30, 31, 58, KafkaError._AUTHENTICATION],
    ids=["topic", "group", "cluster", "sasl", "authentication"],
)
async def test_a_refusal_ends_a_read_as_a_refusal_as_the_aiokafka_reader_says_it(
    fake: type[_Consumer], code: int
) -> None:
    reader = RdkafkaReader("127.0.0.1:1", timeout=5.0)
    error = KafkaError(code, "Broker: refused")
    fake.batches = [[_Message(0, error)]]
    with pytest.raises(KafkaUnavailable) as during_read:
        reader._next(_Consumer({}), ("t", 0), 5)  # type: ignore[arg-type]
    assert refused(during_read.value)
    assert "not authorized on" in str(during_read.value) or "authentication failed" in str(
        during_read.value
    )

    def denied(*args: Any, **kwargs: Any) -> Any:
        raise KafkaException(error)

    await reader.start()
    fake.made[-1].get_watermark_offsets = denied  # type: ignore[method-assign]
    with pytest.raises(KafkaUnavailable) as asking:
        await reader.offsets("t", 0)
    assert refused(asking.value)
    await reader.stop()


async def test_an_error_that_is_no_refusal_is_none_as_before(fake: type[_Consumer]) -> None:
    reader = RdkafkaReader("127.0.0.1:1", timeout=5.0)
    fake.batches = [[_Message(0, KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, "gone"))]]
    with pytest.raises(KafkaUnavailable, match="gone") as during_read:
        reader._next(_Consumer({}), ("t", 0), 5)  # type: ignore[arg-type]
    assert not refused(during_read.value)
