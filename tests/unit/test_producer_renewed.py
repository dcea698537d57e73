"""The node's plain producer after a partition had no leader past aiokafka's 40 s request
timeout: the expired batch was numbered but never sent, so the broker answers every later
batch of that partition OUT_OF_ORDER_SEQUENCE_NUMBER, which aiokafka neither retries nor
mends. Remote timers of aggregates on that partition were retried and parked until a
restart while the node said it was ready. A send failing so now raises, and the sends
after it go through a new producer (a new producer id, sequences from 0); the node's
watch of the producer (`failed`) follows the new one, and stopping the old one is no
failure of the node's. A batch the broker refused before it looked at the sequence (too
large for its topic, a record it finds invalid) breaks it the same way: another send of
that partition failed so before the producer was renewed; it is renewed at once now."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import (
    CorruptRecordException,
    InvalidTimestampError,
    KafkaError,
    LeaderNotAvailableError,
    MessageSizeTooLargeError,
    OutOfOrderSequenceNumber,
    RecordListTooLargeError,
    RequestTimedOutError,
    UnknownError,
    UnknownProducerId,
)
from aiokafka.producer.message_accumulator import MessageAccumulator
from fakes import wait_until

from app.errors import KafkaUnavailable
from app.kafka import producers
from app.kafka.producers import Producer


class _Client:
    """What `Producer` uses of aiokafka's producer: each send's future fails with `error`
    (None: lands at offset 7); its sender task runs until it is stopped."""

    def __init__(self, error: BaseException | None = None, stop_hangs: bool = False) -> None:
        self.error = error
        self.stop_hangs = stop_hangs
        self.start_hangs = False
        self.sent = 0
        self.stopped = False
        self.closed: list[str] = []
        self.task: asyncio.Future[None] | None = None
        self._sender: Any = None
        self.client: Any = None

    async def start(self) -> None:
        if self.start_hangs:
            await asyncio.Event().wait()
        self.task = asyncio.get_running_loop().create_future()
        client = self

        class Part:
            def __init__(self, name: str) -> None:
                self.name = name
                self.sender_task = client.task

            async def close(self) -> None:
                client.closed.append(self.name)
                if client.task is not None and not client.task.done():
                    client.task.cancel()

        self._sender, self.client = Part("sender"), Part("client")

    async def send(self, *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        self.sent += 1
        f: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        # Answered later, as the broker does: sends made together are all in flight.
        if self.error is not None:
            asyncio.get_running_loop().call_soon(f.set_exception, self.error)
        else:
            asyncio.get_running_loop().call_soon(f.set_result, type("Meta", (), {"offset": 7})())
        return f

    async def stop(self) -> None:
        if self.stop_hangs:
            await asyncio.Event().wait()
        self.stopped = True
        if self.task is not None and not self.task.done():
            self.task.cancel()


async def producer_over(
    monkeypatch: pytest.MonkeyPatch, *clients: _Client
) -> tuple[Producer, list[_Client]]:
    made = list(clients)
    producer = Producer("127.0.0.1:1")
    await producer._producer.stop()  # the real client, never started: closed, not leaked
    monkeypatch.setattr(producer, "_new_client", lambda: made.pop(0))
    producer._producer = producer._new_client()
    await producer.start()
    return producer, made


async def renewed(producer: Producer, fresh: _Client) -> None:
    """Waits for the renewal started in the background."""
    await wait_until(lambda: producer._producer is fresh, within=2)


@pytest.mark.parametrize(
    "error",
    [OutOfOrderSequenceNumber(), UnknownProducerId()],
    ids=["out of sequence", "unknown producer id"],
)
async def test_a_send_failing_with_its_sequence_broken_renews_the_producer(
    monkeypatch: pytest.MonkeyPatch, error: KafkaError
) -> None:
    broken, fresh = _Client(error), _Client()
    producer, _ = await producer_over(monkeypatch, broken, fresh)
    watch = asyncio.create_task(producer.failed())
    with pytest.raises(KafkaUnavailable, match="send failed"):
        await producer.send("t", b"k", b"v", 0)
    await renewed(producer, fresh)
    assert await producer.send("t", b"k", b"v", 0) == 7  # through the new one
    assert broken.sent == 1 and fresh.sent == 1
    await asyncio.sleep(0.05)
    assert broken.stopped and not watch.done(), "the old one's end is no failure"
    assert fresh.task is not None
    fresh.task.set_exception(KafkaError("Unexpected error during batch delivery"))
    with pytest.raises(KafkaUnavailable, match="sender stopped"):
        await asyncio.wait_for(watch, 2)
    await producer.stop()


@pytest.mark.parametrize(
    "error",
    [
        MessageSizeTooLargeError(),
        RecordListTooLargeError(),
        CorruptRecordException(),
        InvalidTimestampError(),
        UnknownError(),  # aiokafka's for INVALID_RECORD (a keyless record, compacted topic)
    ],
    ids=["too large", "list too large", "corrupt", "timestamp", "invalid record"],
)
async def test_a_batch_the_broker_refused_renews_the_producer_at_once(
    monkeypatch: pytest.MonkeyPatch, error: KafkaError
) -> None:
    refused, fresh = _Client(error), _Client()
    producer, _ = await producer_over(monkeypatch, refused, fresh)
    with pytest.raises(KafkaUnavailable, match="send failed"):
        await producer.send("t", b"k", b"v", 0)
    await renewed(producer, fresh)
    assert await producer.send("t", b"other", b"v", 0) == 7  # not out of sequence
    assert refused.sent == 1 and fresh.sent == 1
    await producer.stop()


async def test_a_record_too_large_for_the_client_itself_renews_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """aiokafka's own check (`max_request_size`) raises from `send`: nothing numbered."""

    class Refusing(_Client):
        async def send(self, *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
            raise MessageSizeTooLargeError("the message is larger than max_request_size")

    refusing, unused = Refusing(), _Client()
    producer, left = await producer_over(monkeypatch, refusing, unused)
    with pytest.raises(KafkaUnavailable, match="send failed"):
        await producer.send("t", b"k", b"v", 0)
    assert producer._renewal is None and left == [unused] and producer._producer is refusing
    await producer.stop()


async def test_sends_failing_together_renew_it_once_and_other_errors_never(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broken, fresh, unused = _Client(OutOfOrderSequenceNumber()), _Client(), _Client()
    producer, left = await producer_over(monkeypatch, broken, fresh, unused)
    sends = [producer.send("t", b"k", b"v", 0) for _ in range(3)]
    results = await asyncio.gather(*sends, return_exceptions=True)
    assert all(isinstance(r, KafkaUnavailable) for r in results)
    assert left == [unused], "one new producer for the three failed sends"
    await renewed(producer, fresh)
    # No sequence broken: a retriable error, or a batch expired with no leader (its
    # partition may still have none: a new producer would only strand the old one's).
    for error in (RequestTimedOutError(), LeaderNotAvailableError()):
        fresh.error = error
        with pytest.raises(KafkaUnavailable):
            await producer.send("t", b"k", b"v", 0)
        await asyncio.sleep(0.01)
        assert left == [unused] and producer._producer is fresh
    await producer.stop()


async def test_a_retired_producer_that_does_not_stop_is_closed_past_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(producers, "STOP_WITHIN_S", 0.05)
    broken, fresh = _Client(OutOfOrderSequenceNumber(), stop_hangs=True), _Client()
    producer, _ = await producer_over(monkeypatch, broken, fresh)
    with pytest.raises(KafkaUnavailable):
        await producer.send("t", b"k", b"v", 0)
    await renewed(producer, fresh)
    await asyncio.wait_for(producer.stop(), 2)  # waits for the retired one, bounded
    assert broken.closed == ["sender", "client"]


async def test_a_producer_whose_flush_never_ends_stops_within_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The node's stop waited on the producer's flush for as long as a partition had no
    leader (or too few in-sync replicas): the stores stayed open and the data directory
    locked until the orchestrator killed the worker."""
    monkeypatch.setattr(producers, "STOP_WITHIN_S", 0.05)
    stuck = _Client(stop_hangs=True)
    producer, _ = await producer_over(monkeypatch, stuck)
    await asyncio.wait_for(producer.stop(), 2)
    assert stuck.closed == ["sender", "client"]


async def test_what_a_producer_stopped_past_its_bound_holds_unsent_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """aiokafka's sender, closed, swallows its cancellation and fails nothing it holds:
    the sends queued for a partition with no leader waited for ever."""
    monkeypatch.setattr(producers, "STOP_WITHIN_S", 0.05)
    stuck = _Client(stop_hangs=True)
    producer, _ = await producer_over(monkeypatch, stuck)
    cluster = type("NoLeader", (), {"leader_for_partition": lambda self, tp: None})()
    accumulator = MessageAccumulator(cluster, 16_384, 0, 40)
    stuck._message_accumulator = accumulator  # type: ignore[attr-defined]
    queued = await accumulator.add_message(TopicPartition("t", 0), b"k", b"v", timeout=1)
    await asyncio.wait_for(producer.stop(), 2)
    with pytest.raises(KafkaError, match="closed unsent"):
        await asyncio.wait_for(queued, 1)


async def test_a_stop_while_a_new_producer_starts_stops_that_one_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broken, slow = _Client(OutOfOrderSequenceNumber()), _Client()
    slow.start_hangs = True
    producer, left = await producer_over(monkeypatch, broken, slow)
    with pytest.raises(KafkaUnavailable):
        await producer.send("t", b"k", b"v", 0)
    await wait_until(lambda: not left)  # the new one is being started
    await asyncio.wait_for(producer.stop(), 2)
    assert broken.stopped and slow.stopped and producer._renewal is None
