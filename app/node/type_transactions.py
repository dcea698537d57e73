"""One aggregate type's partition transactions (`PartitionTransaction`, each held by the
task running its partition): opened as a task takes its partition (fencing the previous
owner), and their producers stopped as the tasks close, a node's stop waiting for the
stops left to end on their own. A take attaches its transaction to its partition's handle
of the timer store, which hands it that partition's rows directly; this is the store's own
changelog sink, which finds a row's transaction by partition only for a partition no take
attached one to (a store written without a take, as in the seed's tests)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from app.errors import KafkaUnavailable
from app.kafka import TransactionalWriter, WriterFactory
from app.node.partition_transaction import PartitionTransaction
from tables import ChangelogRecord

__all__ = ["OPEN_DEADLINE_S", "STOP_DEADLINE_S", "NoProducerId", "TypeTransactions"]

logger = logging.getLogger(__name__)

OPEN_DEADLINE_S = 15.0
"""A partition's producer not started by then (no producer id: its transaction coordinator
busy or out of reach, which the client library retries without end or a word) is given
up (`NoProducerId`), so that the take fails and is tried again, the partition not ready
and /healthz saying why: never a partition left restoring, silently, for good."""


class NoProducerId(KafkaUnavailable):
    """A partition's producer was given no producer id within `OPEN_DEADLINE_S`: its
    transaction coordinator busy, out of reach, or holding the id back behind the abort
    markers of a previous owner's transaction that it cannot write (a cluster short of
    in-sync replicas). A state of the cluster's, which its take waits out
    (`partition_take.take_failure`)."""


STOP_DEADLINE_S = 5.0
"""How long a node's stop waits for the producer stops its closes left to end on their own
(past a close's deadline); one still stopping then is named in the log, not waited for."""


class TypeTransactions:
    """One aggregate type's open partition transactions, by partition, and the timer
    store's changelog sink: each row goes to its partition's transaction (a partition with
    none open is not owned: the write is refused).

    `writers` makes a partition's producer from its transactional id (`Clients.
    transactional_writer`).
    """

    def __init__(
        self,
        writers: WriterFactory,
        topic: str,
        group_id: str,
        *,
        on_commit: Callable[[float], None] | None = None,
    ) -> None:
        self._writers = writers
        self.topic = topic
        self.group_id = group_id
        # Told each successful commit's duration in seconds (the commit-time histogram).
        self._on_commit = on_commit
        self._open: dict[int, PartitionTransaction] = {}
        # The producers being stopped (an abandoned partition's), until they are.
        self._stopping: dict[int, asyncio.Task[None]] = {}
        # Every producer stop still running, a partition's earlier ones included (a stop
        # left past its close's deadline, the partition taken and let go again since).
        self._unstopped: dict[asyncio.Task[None], int] = {}
        self.open_deadline_s = OPEN_DEADLINE_S
        self.stop_deadline_s = STOP_DEADLINE_S

    async def open(self, partition: int) -> PartitionTransaction:
        """Starts the partition's producer, fencing its previous owner's: its transaction;
        `KafkaUnavailable` when it has not started within `open_deadline_s`."""
        transactional_id = f"{self.group_id}.{self.topic}.{partition}"
        producer = self._writers(transactional_id)
        try:
            async with asyncio.timeout(self.open_deadline_s):
                await producer.start()
        except BaseException as exc:
            # Stopped in a task of its own: librdkafka's stop waits behind the start it cut
            # short (its producer's calls run one at a time), up to that call's own timeout,
            # and a revoke cancelling the take must not wait that long. A timeout or an
            # error waits for it within the deadline; the node's stop waits for the rest.
            stopping = self._stop_in_background(partition, producer, None)
            if not isinstance(exc, asyncio.CancelledError):
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.open_deadline_s):
                        await asyncio.shield(stopping)
            if isinstance(exc, TimeoutError):
                raise NoProducerId(
                    f"{transactional_id}: its producer did not start within "
                    f"{self.open_deadline_s:g} s (no producer id from the transaction "
                    "coordinator)"
                ) from exc
            raise
        txn = PartitionTransaction(producer, self.topic, partition, self.group_id, self._on_commit)
        self._open[partition] = txn
        return txn

    def of(self, partition: int) -> PartitionTransaction:
        """The partition's open transaction; `KafkaUnavailable` when it is not owned here."""
        txn = self._open.get(partition)
        if txn is None:
            raise KafkaUnavailable(f"{self.topic}[{partition}] is not owned by this node")
        return txn

    def get(self, partition: int) -> PartitionTransaction | None:
        """The partition's open transaction (None: not owned here)."""
        return self._open.get(partition)

    async def abandon(
        self,
        partition: int,
        *,
        within: float | None = None,
        after: asyncio.Task[bool] | None = None,
    ) -> None:
        """Abandons the partition's transaction (`PartitionTransaction.abandon`: what is
        buffered is thrown away) and stops its producer once `after` (its commit cancelled,
        aborting) has ended. The stop runs in a task of its own, waited for up to `within`
        seconds (None: until it ends): a close's deadline, or a cancelled caller, never
        cuts it in half (an aiokafka producer half stopped leaks its connections and its
        sender); a second abandon of the partition waits for the same stop."""
        txn = self._open.pop(partition, None)
        stopping = self._stopping.get(partition)
        if txn is not None:
            stopping = self._stop_in_background(partition, txn.abandon(), after)
        if stopping is None:
            return
        try:
            async with asyncio.timeout(within):
                await asyncio.shield(stopping)
        except TimeoutError:
            logger.warning(
                "%s[%d]: producer not stopped within %g s: left to stop on its own",
                self.topic,
                partition,
                within,
            )

    async def stopped(self) -> None:
        """Waits (the node stopping) up to `stop_deadline_s` for the producer stops that
        closes left to end on their own: never cut half way by the event loop's end while
        they can still end; one that does not by then is named in the log."""
        stopping = dict(self._unstopped)
        if not stopping:
            return
        await asyncio.wait([*stopping], timeout=self.stop_deadline_s)
        for task, partition in sorted(stopping.items(), key=lambda item: item[1]):
            if not task.done():
                logger.warning(
                    "%s[%d]: producer still stopping when the node stops, after %g s",
                    self.topic,
                    partition,
                    self.stop_deadline_s,
                )

    def _stop_in_background(
        self, partition: int, producer: TransactionalWriter, after: asyncio.Task[bool] | None
    ) -> asyncio.Task[None]:
        stopping = asyncio.create_task(
            self._stop(partition, producer, after), name=f"stop {self.topic}[{partition}]"
        )
        self._stopping[partition] = stopping
        self._unstopped[stopping] = partition
        return stopping

    async def _stop(
        self, partition: int, producer: TransactionalWriter, after: asyncio.Task[bool] | None
    ) -> None:
        try:
            if after is not None:
                await asyncio.wait([after])  # its abort, bounded (`TransactionalProducer`)
            await producer.stop()
        except Exception:
            logger.exception("%s[%d]: stopping the producer failed", self.topic, partition)
        finally:
            current = asyncio.current_task()
            if current is not None:
                self._unstopped.pop(current, None)
            if self._stopping.get(partition) is current:
                del self._stopping[partition]

    async def __call__(self, records: list[ChangelogRecord]) -> None:
        """The store's own changelog sink (a partition whose take attached its transaction
        to its handle is not routed here): each row buffered in its partition's transaction; a
        row of a partition with none open here is refused (`KafkaUnavailable`: the store's
        write fails, as for any partition this node does not own)."""
        for r in records:
            self.of(r.partition).add(r.key, r.value, r.before)

    def owns(self, partition: int) -> bool:
        return partition in self._open

    def pending(self) -> list[int]:
        """The partitions with rows or staged work waiting to be committed."""
        return [p for p, txn in self._open.items() if txn.waits()]
