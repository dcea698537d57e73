"""`LogReader` over librdkafka (confluent-kafka, the `confluent` extra): a restore's read of
a changelog partition fetched and decoded by C, where aiokafka's reader costs ~4 µs of
Python a record (its fetch parsing and record objects).

Assign-only: the consumer joins no group and commits nothing (librdkafka wants a
`group.id` all the same; without `subscribe` it never joins it). Its blocking calls run
on the reader's own thread (`CallThread`), one at a time and in order, so the event loop
never waits on the broker, and the next batch is fetched there while the caller applies
the one it was given. A stop closes the consumer there too, after the call in flight; a
read calls it no more once the stop began (it ends unavailable).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import Future
from typing import Any, TypeVar, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from app.errors import KafkaUnavailable
from app.kafka.call_thread import CallThread
from app.kafka.connection import Connectable
from app.kafka.rdkafka_config import explain_code, rdkafka_options, refusal
from app.kafka.records import Record

__all__ = ["RdkafkaReader", "batch_end"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_WAIT = 0.02
"""What one `consume` waits for its batch to fill: it returns only when full or at this
wait, so the last, partial batch of a read costs this much (the end-of-partition event
does not end the wait)."""

_QUIET_CODES = frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN})
"""Errors librdkafka retries on its own (a broker's connection lost): a read waits for
them to heal until its timeout."""


def batch_end(offsets: list[int], eof: int | None, end: int) -> bool:
    """Whether a read to `end` (exclusive) is over after a batch of these record `offsets`
    and, if the batch held one, the end-of-partition event at `eof`: the last record is
    `end - 1` or beyond, or the consumer reached the partition's end at `end` or beyond
    (commit markers take the last offsets and are never returned)."""
    return (bool(offsets) and offsets[-1] >= end - 1) or (eof is not None and eof >= end)


class RdkafkaReader:
    """Reads partitions to their current end (committed records only), one at a time, on
    librdkafka: the same contract as `app.kafka.consumers.Reader`. Every failure ends in
    `KafkaUnavailable`: an error librdkafka reports for the partition (a topic deleted,
    access denied: raised from aiokafka's error for it, as `records.refused` knows the
    aiokafka reader's), or no progress for `timeout` seconds (the broker down)."""

    def __init__(
        self,
        bootstrap: Connectable,
        *,
        batch: int = 5_000,
        timeout: float = 30.0,
        group_id: str = "tickwheel-reader",
    ) -> None:
        self._batch = batch
        self._timeout = timeout
        self._config: dict[str, Any] = {
            **rdkafka_options(bootstrap),
            "group.id": group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            # A position the log no longer holds (truncated under the read) is an error
            # naming the partition, never a silent jump to its end past unread records.
            "auto.offset.reset": "error",
            "fetch.wait.max.ms": 20,
            "fetch.max.bytes": 32 * 1024 * 1024,
            "max.partition.fetch.bytes": 16 * 1024 * 1024,
            "receive.message.max.bytes": 33 * 1024 * 1024,
            # librdkafka stops fetching for `fetch.queue.backoff.ms` (1 s) once its queue
            # holds `queued.min.messages` (100,000): a restore drains it faster than that.
            "queued.min.messages": 1_000_000,
            "queued.max.messages.kbytes": 256 * 1024,
            "fetch.queue.backoff.ms": 10,
            "logger": logger,
        }
        self._thread = CallThread("tickwheel-reader")
        self._consumer: Consumer | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        if self._consumer is not None:
            return
        thread = self._thread
        made = thread.submit(Consumer, self._config)
        try:
            consumer = await self._wait(made)
        except BaseException:
            # Its thread would wait for calls for ever: ended (after closing the consumer
            # if it is made all the same), and a fresh one for the next start.
            made.add_done_callback(_close_made)
            self._thread.shutdown()
            self._thread = CallThread("tickwheel-reader")
            raise
        if thread.closed:  # stopped while it started: its consumer is nobody's
            made.add_done_callback(_close_made)
            raise KafkaUnavailable("reader stopped during its start")
        self._consumer = consumer

    async def stop(self) -> None:
        """Closes the consumer (never raises), on its thread after the call in flight; a
        read under way calls it no more (`_submit`). The thread ends after the close
        whether or not the stop waits for it: a stop cancelled (a caller's deadline,
        `app.ops.deadline.stop_by`) or given up at the reader's timeout leaves the close
        to end there, and no thread waiting for calls."""
        consumer, self._consumer = self._consumer, None
        closing = None if consumer is None else self._thread.submit(consumer.close)
        # Queued before any await: a cancel of the wait below would skip it, and the
        # thread would wait for calls for ever.
        self._thread.shutdown()
        if closing is not None:
            try:
                await self._wait(closing)
            except (KafkaUnavailable, KafkaException, RuntimeError) as exc:
                logger.info("reader: closing: %s", exc)

    async def __aenter__(self) -> RdkafkaReader:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        """(first offset still held, last stable offset) of the partition."""
        async with self._lock:
            return await self._offsets(topic, partition)

    async def read(
        self, topic: str, partition: int, start: int
    ) -> AsyncGenerator[list[Record], None]:
        """The partition's records from `start` to its end as it is now, in batches."""
        async with self._lock:
            begin, end = await self._offsets(topic, partition)
            position = max(start, begin)
            if position >= end:
                return
            consumer = self._started()
            tp = (topic, partition)
            where = [TopicPartition(topic, partition, position)]
            await self._wait(self._submit(consumer, consumer.assign, where))
            pending: Future[tuple[list[Record], bool]] | None = None
            try:
                pending = self._submit(consumer, self._next, consumer, tp, end)
                while pending is not None:
                    records, done = await self._wait(pending)
                    # The next batch is fetched while the caller applies this one.
                    pending = (
                        None if done else self._submit(consumer, self._next, consumer, tp, end)
                    )
                    if records:
                        yield records
            finally:
                if pending is not None:
                    pending.add_done_callback(_retrieve)
                # After the batch the thread may still fetch (its calls keep their order);
                # once stopped, the close unassigns it.
                if self._consumer is consumer:
                    self._thread.submit(consumer.unassign).add_done_callback(_retrieve)

    # On the reader's thread.

    def _next(self, consumer: Consumer, tp: tuple[str, int], end: int) -> tuple[list[Record], bool]:
        """The next batch of records before `end`, and whether the read is over; raises
        `KafkaUnavailable` for a partition's error, or after `timeout` without progress."""
        topic, partition = tp
        where = f"{topic}[{partition}]"
        deadline = time.monotonic() + self._timeout
        while True:
            got = consumer.consume(num_messages=self._batch, timeout=_WAIT)
            records: list[Record] = []
            offsets: list[int] = []
            eof: int | None = None
            for m in got:
                error = m.error()
                if error is None:
                    offset = cast(int, m.offset())  # a record's is never None
                    offsets.append(offset)
                    if offset < end:
                        records.append(_record(m, topic, partition, offset))
                elif error.code() == KafkaError._PARTITION_EOF:
                    eof = m.offset()
                elif error.code() in _QUIET_CODES or not (m.topic() or error.fatal()):
                    # retried by librdkafka, or not about the partition (the group it
                    # never joins): a broker down ends the read at its timeout
                    logger.info("reader: %s: %s", where, error.str())
                else:
                    said = explain_code(error.code(), error.str())
                    cause = refusal(error.code(), error.str())
                    raise KafkaUnavailable(f"cannot read {where}: {said}") from cause
            if got and (offsets or eof is not None):
                return records, batch_end(offsets, eof, end)
            if time.monotonic() >= deadline:  # no record, no end: the broker is gone
                raise KafkaUnavailable(f"cannot read {where}: no records in {self._timeout:g} s")

    def _watermarks(self, consumer: Consumer, topic: str, partition: int) -> tuple[int, int]:
        # With read_committed, librdkafka asks for the last stable offset as the high one.
        low, high = consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=self._timeout, cached=False
        )
        return int(low), int(high)

    # On the event loop.

    def _started(self) -> Consumer:
        if self._consumer is None:
            raise KafkaUnavailable("reader not started")
        return self._consumer

    def _submit(self, consumer: Consumer, call: Callable[..., T], *args: Any) -> Future[T]:
        """`call` on the thread, for a read on `consumer`: `KafkaUnavailable` once a stop
        began (its close is queued on the thread: nothing may follow it)."""
        if self._consumer is not consumer:
            raise KafkaUnavailable("reader stopped during the read")
        return self._thread.submit(call, *args)

    async def _offsets(self, topic: str, partition: int) -> tuple[int, int]:
        consumer = self._started()
        try:
            return await self._run(self._watermarks, consumer, topic, partition)
        except KafkaUnavailable as exc:
            raise KafkaUnavailable(f"offsets of {topic}[{partition}]: {exc}") from exc

    async def _run(self, call: Callable[..., T], *args: Any) -> T:
        return await self._wait(self._thread.submit(call, *args))

    async def _wait(self, future: Future[T]) -> T:
        """`future`'s result; librdkafka's error, or past the reader's timeout (and a
        margin: librdkafka's own calls end at it), `KafkaUnavailable`, the call going on
        on the thread."""
        done = asyncio.wrap_future(future)
        try:
            return await asyncio.wait_for(asyncio.shield(done), self._timeout + 5)
        except KafkaException as exc:
            error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if error is None:
                raise KafkaUnavailable(str(exc)) from exc
            cause = refusal(error.code(), error.str())
            if cause is None:
                cause = exc
            else:
                cause.__cause__ = exc
            raise KafkaUnavailable(explain_code(error.code(), error.str())) from cause
        except TimeoutError:
            done.add_done_callback(_retrieve)
            raise KafkaUnavailable(f"reader: no answer in {self._timeout + 5:g} s") from None
        except asyncio.CancelledError:
            done.add_done_callback(_retrieve)
            raise


def _record(m: Any, topic: str, partition: int, offset: int) -> Record:
    """The node's record of a message of the partition read (its topic and partition
    given: two calls into confluent-kafka fewer a record)."""
    try:
        headers = m.headers()
        return _new_record(Record, (
            topic, partition, offset, m.key(), m.value(), m.timestamp()[1],
            tuple(headers) if headers else (),
        ))  # fmt: skip
    except (SystemError, UnicodeError):
        # A header key that is not UTF-8: confluent-kafka's conversion of the headers fails
        # and leaves its error pending, raised by a later call (here), its list with an
        # item missing: none of it is used, the record is read without headers.
        pass
    return _new_record(Record, (
        topic, partition, offset, m.key(), m.value(), m.timestamp()[1],
        _unreadable_headers(topic, partition, offset),
    ))  # fmt: skip


def _unreadable_headers(topic: str, partition: int, offset: int) -> tuple[()]:
    logger.warning(
        "%s[%d]@%d: a header key is not UTF-8, which librdkafka's Python client cannot"
        " read: the record is read without its headers",
        topic,
        partition,
        offset,
    )
    return ()


_new_record = tuple.__new__
"""`Record`'s fields given in order, all seven: made without the named tuple's Python
`__new__` (~0.2 µs a record less, on a restore's path)."""


def _close_made(made: Future[Consumer]) -> None:
    """Closes a consumer made after its start gave up on it, on a thread of its own: this
    may run on the event loop (`made` done already), and a close blocks."""
    if not made.cancelled() and made.exception() is None:
        threading.Thread(target=_close, args=(made.result(),), daemon=True).start()


def _close(consumer: Consumer) -> None:
    try:
        consumer.close()
    except (KafkaException, RuntimeError) as exc:
        logger.info("reader: closing: %s", exc)


def _retrieve(done: Any) -> None:
    """Takes a finished call's outcome that nobody awaits (asyncio would log it)."""
    if not done.cancelled():
        done.exception()
