"""Consumers: whole-partition readers (restores, operators' reads, tails), and the making
of a node's `Record` from what aiokafka fetched (the group consumer's too:
`group_consumer`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Iterable
from contextlib import aclosing
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import (
    KafkaError,
)

from app.errors import KafkaUnavailable
from app.kafka import lenient_headers
from app.kafka.connection import Connectable, client_options
from app.kafka.records import Record, explain, start_client

logger = logging.getLogger(__name__)

# A header key that is not UTF-8 stops no consumer (see the module).
lenient_headers.install()


class Reader:
    """Reads partitions to their current end (committed records only), one at a time.

    Long-lived, so that restoring a partition costs no consumer start-up; the short fetch
    wait keeps the last, empty fetch of each read from idling.
    """

    def __init__(
        self, bootstrap: Connectable, *, batch: int = 5_000, timeout: float = 40.0
    ) -> None:
        """`timeout`: how long a request may go unanswered (a missing topic's metadata is
        waited for that long) before the read or the offsets fail."""
        self._batch = batch
        self._timeout = timeout
        self._consumer = AIOKafkaConsumer(
            **client_options(bootstrap),
            group_id=None,
            # A position the log no longer holds (truncated under the read) fails the
            # read, never jumps to the end past records not read.
            auto_offset_reset="none",
            request_timeout_ms=int(timeout * 1000),
            enable_auto_commit=False,
            isolation_level="read_committed",
            max_poll_records=batch,
            fetch_max_wait_ms=20,
            fetch_max_bytes=32 * 1024 * 1024,
            max_partition_fetch_bytes=16 * 1024 * 1024,
            # Its fetches hand out the node's `Record`s themselves (see the function).
            key_deserializer=lenient_headers.node_records,
        )
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        await start_client(self._consumer, "reader")

    async def stop(self) -> None:
        # Also when never started: aiokafka warns of a client that was made and not closed.
        await self._consumer.stop()

    async def __aenter__(self) -> Reader:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        """(first offset still held, last stable offset) of the partition."""
        tp = TopicPartition(topic, partition)
        async with self._lock:
            try:
                begin = (await self._consumer.beginning_offsets([tp]))[tp]
                end = (await self._consumer.end_offsets([tp]))[tp]
            except KafkaError as exc:
                raise KafkaUnavailable(f"offsets of {topic}[{partition}]: {explain(exc)}") from exc
        return int(begin), int(end)

    async def read(
        self, topic: str, partition: int, start: int
    ) -> AsyncGenerator[list[Record], None]:
        """The partition's records from `start` to its end as it is now, in batches."""
        tp = TopicPartition(topic, partition)
        async with self._lock:
            c = self._consumer
            try:
                c.assign([tp])
                end = (await c.end_offsets([tp]))[tp]
                begin = (await c.beginning_offsets([tp]))[tp]
                position = max(start, begin)
                if position >= end:
                    return
                c.seek(tp, position)
                # aiokafka retries a lost broker for ever: no progress this long fails it.
                deadline = time.monotonic() + self._timeout
                while position < end:
                    # Short: what is left may be a transaction marker, which no fetch returns.
                    got = await c.getmany(tp, timeout_ms=100, max_records=self._batch)
                    msgs = got.get(tp, [])
                    if msgs:
                        # `Record`s already (`node_records`).
                        yield msgs if msgs[-1].offset < end else [m for m in msgs if m.offset < end]
                    # Transaction markers take offsets too: trust the consumer's position.
                    moved, position = position, await c.position(tp)
                    if msgs or position != moved:
                        deadline = time.monotonic() + self._timeout
                    elif time.monotonic() >= deadline:
                        raise KafkaUnavailable(
                            f"cannot read {topic}[{partition}]: no progress in {self._timeout:g} s"
                        )
            except KafkaError as exc:
                raise KafkaUnavailable(f"cannot read {topic}[{partition}]: {explain(exc)}") from exc


async def read_to_end(
    bootstrap: Connectable, topic: str, partition: int, start: int, *, batch: int = 5_000
) -> AsyncGenerator[list[Record], None]:
    """Reads one partition from `start` to its end as it is now (a one-off `Reader`)."""
    async with (
        Reader(bootstrap, batch=batch) as reader,
        aclosing(reader.read(topic, partition, start)) as batches,
    ):
        async for records in batches:
            yield records


async def read_partitions(
    bootstrap: Connectable, topic: str, partitions: Iterable[int]
) -> AsyncGenerator[list[Record], None]:
    """Reads each of `partitions` from its start to its end as it is now, one after another."""
    async with Reader(bootstrap) as reader:
        for p in partitions:
            async with aclosing(reader.read(topic, p, 0)) as batches:
                async for records in batches:
                    yield records


async def tail(
    bootstrap: Connectable, topic: str, partitions: Iterable[int]
) -> AsyncGenerator[Record, None]:
    """The records written to `partitions` of `topic` from now on, until cancelled."""
    consumer = AIOKafkaConsumer(
        **client_options(bootstrap),
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="latest",
    )
    tps = [TopicPartition(topic, p) for p in partitions]
    try:
        await consumer.start()
        consumer.assign(tps)
        await consumer.seek_to_end(*tps)
        while True:
            got = await consumer.getmany(timeout_ms=500)
            for ms in got.values():
                for m in ms:
                    yield as_record(m)
    finally:
        await consumer.stop()


def as_record(m: Any) -> Record:
    # All seven fields in order, without the named tuple's Python `__new__` (~0.2 µs a
    # record less: every record a node reads is made here).
    return _new_record(
        Record,
        (m.topic, m.partition, m.offset, m.key, m.value, m.timestamp, tuple(m.headers or ())),
    )


_new_record = tuple.__new__


def fetching(consumer: AIOKafkaConsumer) -> None:
    """Raises if aiokafka's fetcher task ended (a bug of its own: its errors are logged and
    it goes on otherwise): `getmany` would then return nothing, for good, quietly."""
    task = getattr(getattr(consumer, "_fetcher", None), "error_future", None)
    if isinstance(task, asyncio.Future) and task.done():
        why = "cancelled" if task.cancelled() else repr(task.exception())
        raise RuntimeError(f"aiokafka's fetcher stopped ({why}): nothing would be read again")
