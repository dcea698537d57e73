"""A broker as aiokafka 0.14's real fetcher (`Fetcher`, `SubscriptionState`) meets it, for
the tests of the node's readers over it (`GroupConsumer`, `PartitionReader`): one broker
leading every partition of topic `TOPIC`, answering each partition's fetches as its
`Part` says, one round of fetches at a time (`Broker.round`: no wait on a real clock), and
its end offsets as the request's isolation level sees them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.consumer import fetcher as aiokafka_fetcher
from aiokafka.consumer.fetcher import Fetcher
from aiokafka.consumer.subscription_state import SubscriptionState
from aiokafka.protocol.fetch import FetchResponse_v4
from aiokafka.protocol.offset import OffsetRequest, OffsetRequest_v2, OffsetResponse_v2
from kafka_batches import batch

from app.kafka.fetch_watch import FetchWatch

TOPIC = "t"
CORRUPT_MESSAGE = 2
"""The error code of a batch whose header is corrupt on the broker's disk: aiokafka 0.14
logs it ("Unexpected error while fetching data") and fetches again, never raising it."""


class Clock:
    """The test's clock, in seconds: the node's (monotonic) and, in ms, aiokafka's stamp of
    each fetch answered (`last_poll_timestamp`), so that two rounds never share one."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Part:
    """How the broker answers a partition's fetches: `error` (0: none), its high watermark
    and last stable offset, and whether a fetch below the last stable offset gets records
    from the fetched offset (`records`: `count` of them) or none."""

    error: int = 0
    high: int = 100
    lso: int = 100
    records: bool = False
    count: int = 1


class Broker:
    """The client aiokafka's fetcher sends its requests through (`Fetcher(client, ...)`)."""

    def __init__(self, parts: dict[int, Part]) -> None:
        self._loop = asyncio.get_running_loop()
        self._metadata_max_age_ms = 10_000
        self.cluster = SimpleNamespace(
            leader_for_partition=lambda tp: 0, broker_metadata=lambda node_id: object()
        )
        self.parts = parts
        self.ends_asked: list[int] = []  # the isolation level of each end offsets asked
        self._permits = asyncio.Semaphore(0)
        self._answered = asyncio.Event()

    async def round(self) -> None:
        """Lets one fetch request through, and waits until the fetcher has taken its
        answer in (it does so in the step that gets it)."""
        self._answered.clear()
        self._permits.release()
        await self._answered.wait()

    async def send(self, node_id: int, request: Any) -> Any:
        if request.API_KEY == OffsetRequest.API_KEY:
            asked = request.build(OffsetRequest_v2)
            self.ends_asked.append(asked.isolation_level)
            return OffsetResponse_v2(
                0,
                [
                    (topic, [(p, 0, -1, self._end(p, asked.isolation_level)) for p, _ in ps])
                    for topic, ps in asked.topics
                ],
            )
        await self._permits.acquire()
        answers = []
        for topic, partitions in request.topics:
            got: list[tuple[int, int, int, int, list[Any], bytes]] = []
            for p, offset, _ in partitions:
                part = self.parts[p]
                readable = part.records and not part.error and offset < part.lso
                data = batch(offset, part.count) if readable else b""
                got.append((p, part.error, part.high, part.lso, [], data))
            answers.append((topic, got))
        self._answered.set()
        return FetchResponse_v4(0, answers)

    def _end(self, p: int, isolation_level: int) -> int:
        return self.parts[p].lso if isolation_level else self.parts[p].high

    async def _maybe_wait_metadata(self) -> None:
        return None

    def add_topic(self, topic: str) -> None:
        return None

    def force_metadata_update(self) -> asyncio.Future[bool]:
        done = self._loop.create_future()
        done.set_result(True)
        return done


def over(
    consumer: Any, broker: Broker, positions: dict[int, int], *, prefetch_backoff: float = 0.1
) -> Fetcher:
    """Puts aiokafka's real fetcher over `broker` inside `consumer` (an `AIOKafkaConsumer`
    never started), its partitions of `TOPIC` assigned at `positions`. `prefetch_backoff`
    (real seconds): how long a partition's records waiting to be handed out hold back the
    fetches of its broker's other partitions (0: not at all, nothing waits on a real clock)."""
    subscription = SubscriptionState()
    subscription.assign_from_user([TopicPartition(TOPIC, p) for p in positions])
    for p, position in positions.items():
        subscription.subscription.assignment.state_value(TopicPartition(TOPIC, p)).seek(position)
    fetcher = Fetcher(
        broker,
        subscription,
        auto_offset_reset="none",
        isolation_level="read_committed",
        retry_backoff_ms=10,
        prefetch_backoff=prefetch_backoff,
    )
    consumer._fetcher, consumer._subscription = fetcher, subscription
    consumer._coordinator = SimpleNamespace(check_errors=lambda: None)
    consumer._closed = False
    return fetcher


async def close(consumer: Any) -> None:
    await consumer._fetcher.close()
    consumer._closed = True  # never started: nothing else to close


def stamped_by(monkeypatch: pytest.MonkeyPatch, clock: Clock) -> None:
    """aiokafka's fetcher stamps each answer by `clock` (it reads `time.time()`)."""
    monkeypatch.setattr(
        aiokafka_fetcher,
        "time",
        SimpleNamespace(time=clock, monotonic=aiokafka_fetcher.time.monotonic),
    )


class _NoPartitions:
    def assignment(self) -> set[TopicPartition]:
        return set()

    def paused(self) -> set[TopicPartition]:
        return set()

    def last_poll_timestamp(self, partition: TopicPartition) -> int | None:
        raise AssertionError("no partition is watched")

    async def position(self, partition: TopicPartition) -> int:
        raise AssertionError("no partition is watched")

    async def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        raise AssertionError("no partition is watched")


def unwatched() -> FetchWatch:
    """A watch that sees no partition: for a reader's poll over a fake consumer that tells
    nothing of its partitions' progress (`GroupConsumer.__new__`)."""
    return FetchWatch(_NoPartitions(), lambda tp: 0, lambda: 0.0)
