"""The node's plain producer after a partition had no leader past aiokafka's 40 s request
timeout: the expired batch was numbered but never sent, so the broker answers every later
batch of that partition OUT_OF_ORDER_SEQUENCE_NUMBER, which aiokafka neither retries nor
mends. Remote timers of aggregates on that partition were retried and parked until a
restart while the node said it was ready. A send failing so now raises, and the sends
after it go through a new producer (a new producer id, sequences from 0); the node's
watch of the producer (`failed`) follows the new one, and stopping the old one is no
failure of the node's."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.errors import (
    KafkaError,
    LeaderNotAvailableError,
    OutOfOrderSequenceNumber,
    RequestTimedOutError,
)

from app.errors import KafkaUnavailable
from app.kafka import producers
from app.kafka.producers import Producer


class _Client:
    """What `Producer` uses of aiokafka's producer: each send's future fails with `error`
    (None: lands at offset 7); its sender task runs until it is stopped."""

    def __init__(self, error: BaseException | None = None, stop_hangs: bool = False) -> None:
        self.error = error
        self.stop_hangs = stop_hangs
        self.sent = 0
        self.stopped = False
        self.closed: list[str] = []
        self.task: asyncio.Future[None] | None = None
        self._sender: Any = None
        self.client: Any = None

    async def start(self) -> None:
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


@pytest.mark.parametrize(
    "error",
    [LeaderNotAvailableError(), OutOfOrderSequenceNumber()],
    ids=["expired without a leader", "out of sequence"],
)
async def test_a_send_failing_with_its_sequence_broken_renews_the_producer(
    monkeypatch: pytest.MonkeyPatch, error: KafkaError
) -> None:
    broken, fresh = _Client(error), _Client()
    producer, _ = await producer_over(monkeypatch, broken, fresh)
    watch = asyncio.create_task(producer.failed())
    with pytest.raises(KafkaUnavailable, match="send failed"):
        await producer.send("t", b"k", b"v", 0)
    assert await producer.send("t", b"k", b"v", 0) == 7  # through the new one
    assert broken.sent == 1 and fresh.sent == 1
    await asyncio.sleep(0.05)
    assert broken.stopped and not watch.done(), "the old one's end is no failure"
    assert fresh.task is not None
    fresh.task.set_exception(KafkaError("Unexpected error during batch delivery"))
    with pytest.raises(KafkaUnavailable, match="sender stopped"):
        await asyncio.wait_for(watch, 2)
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
    fresh.error = RequestTimedOutError()  # retriable, no sequence broken: kept
    with pytest.raises(KafkaUnavailable):
        await producer.send("t", b"k", b"v", 0)
    assert left == [unused]
    await producer.stop()


async def test_a_retired_producer_that_does_not_stop_is_closed_past_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(producers, "STOP_WITHIN_S", 0.05)
    broken, fresh = _Client(LeaderNotAvailableError(), stop_hangs=True), _Client()
    producer, _ = await producer_over(monkeypatch, broken, fresh)
    with pytest.raises(KafkaUnavailable):
        await producer.send("t", b"k", b"v", 0)
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
