"""The plain producer (commands, results, ledger records); the batch and request sizes of
each partition's transactional producer (`transactional_producer`, and librdkafka's
`rdkafka_writer`); and what both aiokafka producers do with the futures and exceptions
aiokafka leaves them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    CorruptRecordException,
    InvalidTimestampError,
    KafkaConnectionError,
    KafkaError,
    MessageSizeTooLargeError,
    OutOfOrderSequenceNumber,
    RecordListTooLargeError,
    UnknownError,
    UnknownProducerId,
)

from app.errors import KafkaUnavailable
from app.kafka.connection import Connectable, client_options
from app.kafka.records import OutRecord, explain, headers_of, start_client

logger = logging.getLogger(__name__)

TRANSACTION_REQUEST_BYTES = 4 * 1024 * 1024 + 64 * 1024
"""The largest record a partition's transaction sends: a dead letter of a 4 MiB topic."""

TRANSACTION_BATCH_BYTES = 512 * 1024
"""A transaction's records per partition and produce request: under a topic's default
1 MiB message limit, and far above aiokafka's 16 KiB, with which a send waits for its
partition's last batch to go (one produce request in flight per broker): a commit of
1,000 records took ~30 round trips, each behind the event loop's other work."""

BATCH_HEADER_MARGIN = 1024
"""Kept below a topic's `max.message.bytes` by a partition's batches: aiokafka counts a
v2 batch's 61-byte header in its size; the rest is slack."""


def transaction_batch_bytes(max_message_bytes: Iterable[int]) -> int:
    """The batch size of a transactional producer writing topics with these
    `max.message.bytes`: under the smallest by the margin, never above 512 KiB, at least 1
    (one record a batch). aiokafka never splits a batch, and the broker's
    MESSAGE_SIZE_TOO_LARGE is not retried: a batch above a topic's limit would fail every
    commit of its partition, for good (a single larger record is sent alone all the
    same, and only it fails)."""
    smallest = min(max_message_bytes, default=TRANSACTION_BATCH_BYTES + BATCH_HEADER_MARGIN)
    return max(1, min(TRANSACTION_BATCH_BYTES, smallest - BATCH_HEADER_MARGIN))


RENEWED_ON = (OutOfOrderSequenceNumber, UnknownProducerId)
"""A send failing so says the idempotent producer's sequence of its partition is broken:
aiokafka numbers a batch as it takes it, and a batch that expired with no leader (after
its 40 s request timeout: a partition whose replicas are all down a while) is failed
numbered but never sent. The broker then answers every later batch of that partition
OUT_OF_ORDER_SEQUENCE_NUMBER, which aiokafka neither retries nor mends (the Java client
does, KIP-360): nothing would reach that partition again while the producer lives."""

REFUSED_ON = (
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    CorruptRecordException,
    InvalidTimestampError,
    UnknownError,
)
"""A send failing so, in the broker's answer, breaks its partition's sequence: the broker
refuses such a batch before it looks at the producer's sequence (`UnifiedLog.append`: its
size and CRC, then `LogValidator`'s record checks, then the producer state), so it keeps
the last sequence it appended, while aiokafka numbered the batch as it took it and does
not take the number back on a failure it does not retry (the Java client does). The next
batch of that partition, another send's, would be answered OUT_OF_ORDER_SEQUENCE_NUMBER;
so the producer is renewed at once. `UnknownError`: aiokafka's for INVALID_RECORD (87: a
record without a key on a compacted topic, …), which it does not know. The same errors
raised by `send` itself (aiokafka's own size check) numbered nothing: no renewal."""

RENEW_WITHIN_S = 30.0
"""How long a new producer may take to start (its producer id asked) before it is given
up on; the next send failing so tries again."""

STOP_WITHIN_S = 5.0
"""How long a producer may take to stop (its flush waits on a partition with no leader, or
short of in-sync replicas, for as long as the cluster stays so); then what it holds
unsent fails, and its sender and connections are closed."""


class Producer:
    """An idempotent producer (acks=all); `send_many` returns once the broker has all.

    aiokafka's sender task sends what `send` queues: once it ended (`Sender._fail_all`: an
    unexpected error, which every later send raises; or a cancellation swallowed inside,
    and every later send waits for ever) nothing is sent again. `send_many` then raises at
    once (`sending`), and `failed` ends, for its owner to stop (the node does). A send
    that fails with its partition's sequence broken (`RENEWED_ON`), or refused by the
    broker in a way that breaks it (`REFUSED_ON`), raises, and a new producer (a new
    producer id, every sequence from 0) is started in the background, for the sends after
    it."""

    def __init__(self, bootstrap: Connectable, *, linger_ms: int = 2) -> None:
        self._options = {
            **client_options(bootstrap),
            "enable_idempotence": True,
            "acks": "all",
            "linger_ms": linger_ms,
            "max_request_size": 1_048_576,
        }
        self._producer: Any = self._new_client()
        self._renewal: asyncio.Task[None] | None = None
        self._retired: set[asyncio.Task[None]] = set()
        self._stopped = False

    def _new_client(self) -> Any:
        return AIOKafkaProducer(**self._options)

    async def start(self) -> None:
        await start_client(self._producer, "producer")

    async def stop(self) -> None:
        """Stops within `STOP_WITHIN_S`, and the producers given up on with it (a renewal
        under way is cut short)."""
        self._stopped = True
        if (renewal := self._renewal) is not None:
            renewal.cancel()
            await asyncio.gather(renewal, return_exceptions=True)
        try:
            await stop_within(self._producer)
        finally:
            await asyncio.gather(*self._retired, return_exceptions=True)

    async def failed(self) -> None:
        """`PublisherClient.failed`: raises once aiokafka's sender task ended (the one of
        the producer in use: one given up on ends as it is stopped)."""
        while True:
            producer = self._producer
            task = getattr(getattr(producer, "_sender", None), "sender_task", None)
            if not isinstance(task, asyncio.Future):
                raise KafkaUnavailable("the producer is not started: it sends nothing")
            await asyncio.wait([task])
            if producer is self._producer:
                sending(producer)
                return

    async def send_many(self, records: Sequence[OutRecord]) -> list[int]:
        """Sends (topic, partition, key, value) records; their offsets once acknowledged."""
        producer = self._producer
        sending(producer)
        answered = False  # whether a failure is the broker's answer, not `send`'s own
        try:
            futures = [
                await producer.send(
                    r[0], value=r[3], key=r[2], partition=r[1], headers=headers_list(r)
                )
                for r in records
            ]
            answered = True
            for f in futures:
                # The first failure is raised; the others are retrieved, not left to the
                # event loop to log at collection.
                f.add_done_callback(retrieve)
            return [(await f).offset for f in futures]
        except KafkaError as exc:
            if isinstance(exc, RENEWED_ON) or (answered and isinstance(exc, REFUSED_ON)):
                self._renew(producer, exc)
            raise KafkaUnavailable(f"send failed: {explain(exc)}") from exc

    async def send(
        self, topic: str, key: bytes | None, value: bytes | None, partition: int | None = None
    ) -> int:
        return (await self.send_many([(topic, partition, key, value)]))[0]

    def _renew(self, broken: Any, exc: KafkaError) -> None:
        """Starts replacing `broken` in the background, once however many sends failed on
        it: the caller is told its failure at once, not after a new producer's start."""
        if broken is not self._producer or self._stopped or self._renewal is not None:
            return
        logger.warning("a new producer replaces one whose send failed: %s", explain(exc))
        self._renewal = asyncio.create_task(self._renewed(broken), name="renewing the producer")

    async def _renewed(self, broken: Any) -> None:
        fresh = self._new_client()
        try:
            async with asyncio.timeout(RENEW_WITHIN_S):
                await start_client(fresh, "producer")
        except BaseException as exc:
            await stop_within(fresh)
            if not isinstance(exc, asyncio.CancelledError):
                logger.warning("the new producer did not start (tried again later): %s", exc)
            return
        finally:
            self._renewal = None
        if self._stopped:  # stopped while it started (`stop` waited for this)
            await stop_within(fresh)
            return
        self._producer = fresh
        stopping = asyncio.create_task(stop_within(broken), name="stopping a retired producer")
        self._retired.add(stopping)
        stopping.add_done_callback(self._retired.discard)


async def stop_within(producer: Any, what: str = "a producer") -> None:
    """Stops `producer` (`what` it is, for the log) within `STOP_WITHIN_S`; past it, or
    when its stop fails, the records it holds unsent fail (each send's caller is told) and
    its sender and connections are closed, within the same bound again."""
    try:
        async with asyncio.timeout(STOP_WITHIN_S):
            await producer.stop()
    except Exception as exc:  # a timeout, or the client's own
        logger.warning(
            "%s did not stop within %g s, or failed to: %s", what, STOP_WITHIN_S, explain(exc)
        )
        accumulator = getattr(producer, "_message_accumulator", None)
        if accumulator is not None:
            with contextlib.suppress(Exception):
                accumulator.fail_all(KafkaConnectionError("the producer was closed unsent"))
        with contextlib.suppress(Exception):
            async with asyncio.timeout(STOP_WITHIN_S):
                for part in (getattr(producer, "_sender", None), getattr(producer, "client", None)):
                    if part is not None:
                        await part.close()
    left_behind(producer)


def sending(producer: Any) -> None:
    """Raises `KafkaUnavailable` if aiokafka's sender task ended (as `consumers.fetching`
    for the fetcher): a send would then raise the sender's error or wait for ever."""
    task = getattr(getattr(producer, "_sender", None), "sender_task", None)
    if isinstance(task, asyncio.Future) and task.done():
        exc = None if task.cancelled() else task.exception()
        why = "cancelled" if task.cancelled() else "returned" if exc is None else repr(exc)
        raise KafkaUnavailable(f"aiokafka's sender stopped ({why}): nothing would be sent again")


def left_behind(producer: Any) -> BaseException | None:
    """Retrieves the exceptions aiokafka leaves set and unawaited when its sender dies (a
    fence, a fatal error), which the event loop would log, at collection, as never
    retrieved: the transaction's end waiter (awaited only by a commit or an abort that
    never comes) and the failed batches' drain waiters (awaited only by a send waiting
    for room). The transaction's end waiter's exception, if it failed."""
    txn = getattr(producer, "_txn_manager", None)
    waiter = getattr(txn, "_transaction_waiter", None)
    cause = _exception(waiter) if isinstance(waiter, asyncio.Future) else None
    accumulator = getattr(producer, "_message_accumulator", None)
    queues = getattr(accumulator, "_batches", {})
    batches = [*(b for q in queues.values() for b in q)]
    batches += getattr(accumulator, "_pending_batches", ())
    for batch in batches:
        drain = getattr(batch, "_drain_waiter", None)
        if isinstance(drain, asyncio.Future):
            _exception(drain)
    return cause


def _exception(future: asyncio.Future[Any]) -> BaseException | None:
    """The future's exception, retrieved (None while not done, or cancelled)."""
    if not future.done() or future.cancelled():
        return None
    return future.exception()


def retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def headers_list(record: OutRecord) -> list[tuple[str, bytes | None]]:
    return list(headers) if (headers := headers_of(record)) else []
