"""The transactional producer of each partition over aiokafka: its changelog rows, events
and consumed offsets in one transaction, a failed send aborting it (`_guard_commit`), any
failure breaking it for good. Its batch and request sizes, and the plain producer, are in
`producers`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.producer.transaction_manager import TransactionResult

from app.errors import Fenced, KafkaUnavailable
from app.kafka.connection import Connectable, client_options
from app.kafka.producers import (
    TRANSACTION_BATCH_BYTES,
    TRANSACTION_REQUEST_BYTES,
    headers_list,
    left_behind,
    retrieve,
    stop_within,
)
from app.kafka.records import (
    TRANSACTION_TIMEOUT_MS,
    OutRecord,
    TxnWork,
    explain,
    fenced_by,
    principal_of,
    refused,
    start_client,
)

__all__ = ["TransactionalProducer"]

logger = logging.getLogger(__name__)


class TransactionalProducer:
    """A producer whose records and consumer offsets commit together, or not at all.

    One per owned partition (transactional id `<group>.<ctx>.<agg>.timers.<partition>`):
    starting it fences a previous owner's producer, so a zombie can never commit beside
    the new owner. Any failure breaks it for good (`broken`): every later call raises at
    once, so a caller can never go on with a producer in an unknown state; it is closed
    and the partition taken afresh.
    """

    def __init__(
        self,
        bootstrap: Connectable,
        transactional_id: str,
        *,
        max_batch_bytes: int = TRANSACTION_BATCH_BYTES,
        topics: Iterable[str] = (),
    ) -> None:
        self.transactional_id = transactional_id
        self._topics = tuple(topics)  # written for sure: their metadata fetched at start
        self._producer = AIOKafkaProducer(
            **client_options(bootstrap),
            transactional_id=transactional_id,
            enable_idempotence=True,
            acks="all",
            linger_ms=1,
            transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
            # A dead letter holds a whole record of the topics its context serves, and its
            # topic takes up to 4 MiB (`app.protocol.dead_letters`).
            max_request_size=TRANSACTION_REQUEST_BYTES,
            # Under the topics' limits (`transaction_batch_bytes`).
            max_batch_size=max_batch_bytes,
            # A commit's retries (CONCURRENT_TRANSACTIONS just after the previous commit,
            # NOT_ENOUGH_REPLICAS) wait this long: 100 ms by default, the tail of a commit.
            retry_backoff_ms=10,
        )
        self._lock = asyncio.Lock()
        self._open = False
        self.broken: KafkaUnavailable | None = None
        # The topics its client's metadata follows (`_track`).
        self._tracked: set[str] = set()
        # The open transaction's sends, and the first of them that failed (`_end`).
        self._sent: list[asyncio.Future[Any]] = []
        self._unsent: BaseException | None = None
        # What the open transaction did, for a refusal's message (`_refused`).
        self._principal = principal_of(bootstrap)
        self._work = TxnWork(self.transactional_id)
        self._guard_commit()

    async def start(self) -> None:
        """Starts it; the `topics` it was made with have their metadata fetched now (one
        request), not at its first transaction (`warm`)."""
        await start_client(
            self._producer, self.transactional_id, lambda e: self._refused(e) or explain(e)
        )
        await self.warm(self._topics)

    async def warm(self, topics: Iterable[str]) -> None:
        """Makes its client follow the metadata of `topics` and fetches what it lacks of
        them, in one request, so that a transaction writing them waits for none (a node's
        first fire writes the events and commands topics its producer never wrote)."""
        try:
            await self._track(topics)
        except KafkaError as exc:
            raise KafkaUnavailable(f"{self.transactional_id}: no metadata: {explain(exc)}") from exc

    async def stop(self) -> None:
        """Closes the client within `producers.STOP_WITHIN_S`; never raises (a broken
        producer may fail to say goodbye). Unbounded, an aborted transaction's stop waits
        for its batches, which an idempotent producer retries without end (a partition
        short of in-sync replicas): its sender and connections were left running."""
        await stop_within(self._producer, self.transactional_id)

    async def commit(
        self,
        records: Sequence[OutRecord],
        offsets: dict[tuple[str, int], int],
        group_id: str,
    ) -> list[int]:
        """Sends `records` and commits `offsets` for `group_id` in one transaction.

        Returns the records' offsets. `Fenced` when a newer owner took over; any other
        failure aborts the transaction and raises `KafkaUnavailable`.
        """
        async with self._lock:
            placed = await self._append(records)
            await self._commit(offsets, group_id)
        try:
            return [(await batch).offset + delta for batch, delta in placed]
        except KafkaError as exc:  # committed, so acknowledged: this would be a client bug
            raise KafkaUnavailable(f"{self.transactional_id}: no offsets: {explain(exc)}") from exc

    async def flush(
        self, offsets: dict[tuple[str, int], int] | None = None, group_id: str = ""
    ) -> bool:
        """Commits the open transaction (with `offsets`, if any); whether there was one."""
        async with self._lock:
            if not self._open and not offsets:
                return False
            await self._commit(offsets or {}, group_id)
            return True

    @property
    def pending(self) -> bool:
        """Whether records wait in an open transaction."""
        return self._open

    async def _append(self, records: Sequence[OutRecord]) -> list[tuple[asyncio.Future[Any], int]]:
        """Appends `records` to the transaction, each partition's in their order and in as
        few batches as fit: one future a batch, where aiokafka's `send` costs a coroutine,
        a metadata check and a future a record. A topic with a record left to the key's
        partition (a command to another aggregate) goes record by record, in order, as
        aiokafka's partitioner places it. Each record's batch and its offset in it."""
        self._check()
        p = self._producer
        try:
            topics = {r[0] for r in records}
            self._work.wrote(topics)
            await self._track(topics)
            await self._begin()
            keyed = {r[0] for r in records if r[1] is None}
            placed: dict[int, tuple[asyncio.Future[Any], int]] = {}
            by_partition: dict[tuple[str, int], list[int]] = {}
            for i, r in enumerate(records):
                if r[0] in keyed:
                    placed[i] = (await p.send(r[0], r[3], r[2], r[1], headers=headers_list(r)), 0)
                    placed[i][0].add_done_callback(retrieve)
                    self._sent.append(placed[i][0])
                elif r[1] is not None:
                    by_partition.setdefault((r[0], r[1]), []).append(i)
            for (topic, partition), indexes in by_partition.items():
                batch, members = p.create_batch(), list[tuple[int, int]]()
                for i in indexes:
                    r = records[i]
                    meta = batch.append(
                        timestamp=None, key=r[2], value=r[3], headers=headers_list(r)
                    )
                    if meta is None:  # full: sent, and the record opens the next batch
                        await self._send_batch(batch, topic, partition, members, placed)
                        batch, members = p.create_batch(), []
                        meta = batch.append(
                            timestamp=None, key=r[2], value=r[3], headers=headers_list(r)
                        )
                    members.append((i, meta.offset))
                await self._send_batch(batch, topic, partition, members, placed)
            return [placed[i] for i in range(len(records))]
        except BaseException as exc:
            await self._raise_failed(exc)
            raise

    async def _send_batch(
        self,
        batch: Any,
        topic: str,
        partition: int,
        members: list[tuple[int, int]],
        placed: dict[int, tuple[asyncio.Future[Any], int]],
    ) -> None:
        sent = await self._producer.send_batch(batch, topic, partition=partition)
        # A failed batch fails the commit too (`_end`), which is where it is reported.
        sent.add_done_callback(retrieve)
        self._sent.append(sent)
        for i, delta in members:
            placed[i] = (sent, delta)

    async def _track(self, topics: Iterable[str]) -> None:
        """Makes its client follow each of `topics` before a record goes to it, and waits
        for the metadata of those it lacks, all in one request. aiokafka's client asks
        only for the topics it follows and forgets every other: one it knew from its
        bootstrap but never followed would vanish at the next refresh (a topic new to it
        in the same transaction), and a batch queued to it would wait its 40 s and fail
        without a leader."""
        new = {t for t in topics if t not in self._tracked}
        if not new:
            return
        client = self._producer.client
        for topic in new:  # all followed before the refresh they start is sent
            client.add_topic(topic)
        self._tracked |= new
        for topic in new:
            await self._producer.partitions_for(topic)  # at once when it is known

    async def _begin(self) -> None:
        """Opens a transaction if none is. aiokafka's `begin_transaction` waits for the
        producer id in a task of its own, a turn of the loop even when the id is there
        (at every transaction, and a turn of a busy node's loop is long): with the id,
        the transaction manager's own begin is all it does."""
        if self._open:
            return
        txn = self._producer._txn_manager
        if txn is not None and txn.has_pid():
            txn.begin_transaction()
        else:
            await self._producer.begin_transaction()
        self._open = True
        self._sent, self._unsent = [], None

    def _guard_commit(self) -> None:
        """aiokafka's sender ends a transaction by waiting for its batches, failed or not,
        then committing it: a batch the broker refused (a record over the topic's limit)
        or one that expired would be left out of a committed transaction, beside the
        offsets of the input it came from. Guarded, a commit with a failed send aborts
        instead (`_unsent`: `_commit` then raises), and so does one whose caller gave up
        before its batches were in (`broken`). The sender's method of this producer's
        own is replaced: its request, retries and answers are aiokafka's."""
        sender = self._producer._sender
        end = sender._do_txn_commit

        async def commit_or_abort(result: TransactionResult) -> Any:
            if result == TransactionResult.COMMIT:
                await sender._message_accumulator.flush_for_commit()
                if waiting := [f for f in self._sent if not f.done()]:
                    await asyncio.wait(waiting)  # shields of the flushed batches: a turn
                # A batch whose future was cancelled was never acknowledged: as failed.
                failed = (_unacknowledged(f) for f in self._sent)
                self._unsent = next((e for e in failed if e is not None), None)
                # Broken meanwhile (its caller cancelled, its abort refused mid-commit):
                # the caller was told it failed, so nothing of it may commit.
                if self._unsent is not None or self.broken is not None:
                    result = TransactionResult.ABORT
            return await end(result)

        sender._do_txn_commit = commit_or_abort

    async def _commit(self, offsets: dict[tuple[str, int], int], group_id: str) -> None:
        self._check()
        p = self._producer
        try:
            await self._begin()
            if offsets:
                self._work.committing(group_id, offsets.keys())
                await p.send_offsets_to_transaction(
                    {TopicPartition(t, part): o for (t, part), o in offsets.items()}, group_id
                )
                self._work.offsets_sent()
            await p.commit_transaction()
            self._open = False
            self._work.ended()
            if self._unsent is not None:  # aborted (`_guard_commit`): nothing of it counts
                raise self._unsent
        except BaseException as exc:
            await self._raise_failed(exc)
            raise

    def _check(self) -> None:
        if self.broken is not None:
            raise self.broken

    async def _raise_failed(self, exc: BaseException) -> None:
        """Raises what to raise for `exc` (`_fail`), caused by it; returns when that is
        `exc` itself (a cancellation): the caller raises it as it came. Raised "from"
        itself, it would be its own cause, and every walk down the causes would spin."""
        error = await self._fail(exc)
        if error is not exc:
            raise error from exc

    async def _fail(self, exc: BaseException) -> BaseException:
        """Breaks the producer: what to raise for `exc`.

        Whatever went wrong (fenced, a fatal client state, an aiokafka assertion, a
        cancellation half-way through a commit), the transaction's fate is unknown here:
        the broker aborts it (a newer owner's start, or the transaction timeout).
        """
        # A fence seen by aiokafka's sender may reach the caller as another error (the
        # next step's IllegalOperation, an invalid state transition) while the fence
        # itself waits, never retrieved, in the transaction's end waiter.
        behind = left_behind(self._producer)
        fenced = fenced_by(exc) or fenced_by(behind)
        if behind is not None and exc.__cause__ is None and refused(behind) and not refused(exc):
            # A refusal (an ACL taken away) seen by the sender, hidden the same way: what
            # broke the transaction is told, and the node knows no retry passes it.
            exc.__cause__ = behind
        if fenced:
            error: KafkaUnavailable = Fenced(f"{self.transactional_id} was fenced by a newer owner")
        else:
            said = self._refused(exc) or _with_causes(exc)
            error = KafkaUnavailable(f"{self.transactional_id}: transaction failed: {said}")
        self.broken = error
        if self._open and not fenced:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await self._producer.abort_transaction()
        self._open = False
        if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
            return exc
        return error

    def _refused(self, exc: BaseException) -> str | None:
        """An ACL refusal down `exc`'s causes, naming what of the transaction it refused
        and the ACL to add (`records.refused_work`); None for any other failure."""
        return self._work.refusal(exc, self._principal, explain)


def _with_causes(exc: BaseException) -> str:
    """`exc` in a user's terms, with what it came from (aiokafka's sender wraps it)."""
    said, cause = explain(exc), exc.__cause__
    if cause is not None and cause is not exc:
        said += f", from {explain(cause)}"
    return said


def _unacknowledged(future: asyncio.Future[Any]) -> BaseException | None:
    """Why a send of the transaction was not acknowledged (it is done), or None."""
    if future.cancelled():
        return KafkaUnavailable("a send of the transaction was cancelled before its answer")
    return future.exception()
