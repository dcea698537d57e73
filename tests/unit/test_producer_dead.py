"""The node's one plain producer (remote timer sends, the ledgers' writes, the status) dead
for good, as aiokafka leaves it once its sender task ends (`Sender._fail_all`: every later
send raises the sender's error; a cancellation swallowed inside: every later send waits
for ever): a send raises at once, saying so (`producers.sending`, as `consumers.fetching`
for the fetcher), and the node, which watches it (`PublisherClient.failed`), stops loudly,
naming it; not remote timers failing round after round, their parks refused by the same
producer, while the node said it was ready."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import KafkaError
from fakes import RunningNode, wait_until
from test_results_reader_failing import COUNTER, PARTITIONS, SERVICE

from app.errors import KafkaUnavailable, NodeFailed
from app.kafka.memory import MemoryLog
from app.kafka.memory_clients import MemoryPublisher
from app.kafka.producers import Producer
from app.protocol.wire import CommandEnvelope, encode
from app.timers.runner import TimerOptions
from app.timers.runner.options import RetryPolicy
from tables import AggregateRef
from tables.partitioner import partition_of


async def test_a_dead_plain_producer_stops_the_node_naming_it(tmp_path: Path) -> None:
    log = MemoryLog()
    options = TimerOptions(
        send_timeout=300,
        claim_timeout=1_000,
        retry=RetryPolicy(initial_backoff_ms=100, max_backoff_ms=100, max_attempts=2),
    )
    node = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS, timers=options).start()
    publisher = node.node.producer
    assert isinstance(publisher, MemoryPublisher)
    try:
        await wait_until(node.runs)
        owner = "o1"
        cmd = CommandEnvelope(
            request_id=uuid.uuid4().hex,
            type="Schedule",
            aggregate=AggregateRef(context="mem", aggregate="counter", id=owner),
            body={"at": int(time.time() * 1000) + 300},
            issued_at=int(time.time() * 1000),
        )
        p = partition_of(owner, PARTITIONS)
        await log.publisher().send(COUNTER.commands, owner.encode(), encode(cmd), p)
        publisher.die(KafkaUnavailable("send failed: KafkaError: Unexpected error in sender"))
        assert node.task is not None
        with pytest.raises(NodeFailed, match=r"the producer failed: .*Unexpected error in sender"):
            await asyncio.wait_for(node.task, 5)
        h = node.node.health()
        assert h["ready"] is False and "Unexpected error in sender" in h["failed"], h
    finally:
        with contextlib.suppress(NodeFailed):
            await node.stop()


class _Client:
    """What `Producer` uses of aiokafka's producer once its sender task is `task`: a send
    raises the sender's error (its batches failed by `_fail_all`), or waits for ever."""

    def __init__(self, task: asyncio.Future[None], error: BaseException | None) -> None:
        self._sender = SimpleNamespace(sender_task=task)
        self.error = error
        self.sent = 0

    async def send(self, *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        self.sent += 1
        if self.error is not None:
            raise self.error
        await asyncio.Event().wait()
        raise AssertionError("never")

    async def stop(self) -> None: ...


async def _producer(task: asyncio.Future[None], error: BaseException | None) -> Producer:
    producer = Producer("127.0.0.1:1")
    await producer._producer.stop()  # the real client, never started: closed, not leaked
    producer._producer = _Client(task, error)
    return producer


async def _ends(cancelled: bool) -> asyncio.Task[None]:
    async def sender() -> None:
        if cancelled:
            raise asyncio.CancelledError  # swallowed inside aiokafka: the task ends cancelled
        raise KafkaError("Unexpected error during batch delivery")

    task = asyncio.create_task(sender())
    await asyncio.gather(task, return_exceptions=True)
    return task


@pytest.mark.parametrize("cancelled", [False, True], ids=["failed", "cancelled"])
async def test_a_send_through_a_dead_sender_raises_at_once(cancelled: bool) -> None:
    task = await _ends(cancelled)
    error = None if cancelled else KafkaError("Unexpected error during batch delivery")
    producer = await _producer(task, error)
    said = "cancelled" if cancelled else "Unexpected error during batch delivery"
    with pytest.raises(KafkaUnavailable, match=f"aiokafka's sender stopped .*{said}"):
        await asyncio.wait_for(producer.send("t", b"k", b"v"), 2)
    assert producer._producer.sent == 0
    with pytest.raises(KafkaUnavailable, match=f"aiokafka's sender stopped .*{said}"):
        await asyncio.wait_for(producer.failed(), 2)
    await producer.stop()


async def test_failed_waits_while_the_sender_runs_and_raises_once_it_ends() -> None:
    ended = asyncio.Event()

    async def sender() -> None:
        await ended.wait()
        raise KafkaError("Unexpected error during batch delivery")

    task = asyncio.create_task(sender())
    producer = await _producer(task, None)
    watch = asyncio.create_task(producer.failed())
    await asyncio.sleep(0.05)
    assert not watch.done()
    ended.set()
    with pytest.raises(KafkaUnavailable, match=r"sender stopped .*Unexpected error"):
        await asyncio.wait_for(watch, 2)
    await producer.stop()


async def test_an_unstarted_producer_has_no_sender_to_watch() -> None:
    producer = Producer("127.0.0.1:1")
    await producer._producer.stop()
    producer._producer = SimpleNamespace(stop=producer._producer.stop)
    with pytest.raises(KafkaUnavailable, match="not started"):
        await producer.failed()
