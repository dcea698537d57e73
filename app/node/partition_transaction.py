"""A partition's one Kafka transaction: transactional, fenced per partition.

Each owned partition p of a type commits everything through one transactional producer
(transactional id `<group>.<type>.timers.<p>`): timer rows, the command path's events and
results, and every consumer offset of p. Starting it fences p's previous owner: a node
that lost p but has not noticed yet (a zombie) can write, but never commit, so no reader
and no compaction ever sees its writes. A store write is applied locally at once and its
row buffered; the rows go out in p's next transaction (a command batch, a log batch's
offsets, or every `commit_interval` for the runner's writes). A local copy that may
hold writes that were never committed (the node stopped uncleanly, or a commit failed)
is thrown away and restored from the changelog (`app.timers.restore`; which copies are
clean: `app.node.local_state.CleanMarks`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from app.errors import KafkaUnavailable
from app.kafka import OutRecord, TransactionalWriter, WriterFactory
from tables import ChangelogRecord

__all__ = ["PartitionTransaction", "Transaction"]

logger = logging.getLogger(__name__)

OPEN_DEADLINE_S = 15.0
"""A partition's producer not started by then (no producer id: its transaction coordinator
busy or out of reach, which the client library retries without end or a word) is given
up, so that the take fails and is tried again, and the node stops loudly if it never
can be: never a partition left restoring, silently, for good."""


STOP_DEADLINE_S = 5.0
"""How long a node's stop waits for the producer stops its closes left to end on their own
(past a close's deadline); one still stopping then is named in the log, not waited for."""


class PartitionTransaction:
    """Per owned partition of one aggregate type, the one transaction everything commits in.

    The store's changelog sink buffers each timer row here (no Kafka call while the store
    holds its lock); `commit` sends the buffered rows with the caller's records (the
    command path's events, results and commands) and consumer offsets (commands, the
    log's subscription, timer ops) through the partition's transactional producer, in one
    transaction. Callers serialise a partition's commits (the node's partition lock), so
    rows buffered before a commit are in it or in an earlier one.

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
        self._producers: dict[int, TransactionalWriter] = {}
        self._buffer: dict[int, list[OutRecord]] = {}
        self._staged: dict[int, _Staged] = {}
        # The producers being stopped (an abandoned partition's), until they are.
        self._stopping: dict[int, asyncio.Task[None]] = {}
        self.open_deadline_s = OPEN_DEADLINE_S
        self.stop_deadline_s = STOP_DEADLINE_S

    async def open(self, partition: int) -> None:
        """Starts the partition's producer, fencing its previous owner's; `KafkaUnavailable`
        when it has not started within `open_deadline_s`."""
        transactional_id = f"{self.group_id}.{self.topic}.{partition}"
        producer = self._writers(transactional_id)
        try:
            async with asyncio.timeout(self.open_deadline_s):
                await producer.start()
        except BaseException as exc:
            await producer.stop()
            if isinstance(exc, TimeoutError):
                raise KafkaUnavailable(
                    f"{transactional_id}: its producer did not start within "
                    f"{self.open_deadline_s:g} s (no producer id from the transaction "
                    "coordinator)"
                ) from exc
            raise
        self._producers[partition] = producer
        self._buffer[partition] = []
        self._staged[partition] = _Staged()

    async def abandon(
        self,
        partition: int,
        *,
        within: float | None = None,
        after: asyncio.Task[bool] | None = None,
    ) -> None:
        """Stops the producer without committing: what is buffered is thrown away, and the
        producer stopped once `after` (its commit cancelled, aborting) has ended. The stop
        runs in a task of its own, waited for up to `within` seconds (None: until it ends):
        a close's deadline, or a cancelled caller, never cuts it in half (an aiokafka
        producer half stopped leaks its connections and its sender); a second abandon of
        the partition waits for the same stop."""
        self._buffer.pop(partition, None)
        self._staged.pop(partition, None)
        producer = self._producers.pop(partition, None)
        stopping = self._stopping.get(partition)
        if producer is not None:
            stopping = asyncio.create_task(
                self._stop(partition, producer, after), name=f"stop {self.topic}[{partition}]"
            )
            self._stopping[partition] = stopping
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
        stopping = dict(self._stopping)
        if not stopping:
            return
        await asyncio.wait([*stopping.values()], timeout=self.stop_deadline_s)
        for partition, task in sorted(stopping.items()):
            if not task.done():
                logger.warning(
                    "%s[%d]: producer still stopping when the node stops, after %g s",
                    self.topic,
                    partition,
                    self.stop_deadline_s,
                )

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
            if self._stopping.get(partition) is asyncio.current_task():
                del self._stopping[partition]

    def waiting(self, partition: int) -> int:
        """How many records wait for the partition's next transaction."""
        staged = self._staged.get(partition)
        rows = self._buffer.get(partition, [])
        return len(rows) + (len(staged.records) if staged is not None else 0)

    def discard(self, partition: int) -> None:
        """Throws away what waits for the partition's next transaction, its producer kept:
        a cycle cut short left half of its work there (the partition is let go uncleanly
        next, its local copy restored from the changelog)."""
        if partition in self._producers:
            self._buffer[partition] = []
            self._staged[partition] = _Staged()

    def owns(self, partition: int) -> bool:
        return partition in self._producers

    def broken(self, partition: int) -> KafkaUnavailable | None:
        """The failure that broke the partition's producer, if one did."""
        producer = self._producers.get(partition)
        return None if producer is None else producer.broken

    async def __call__(self, records: list[ChangelogRecord]) -> None:
        for r in records:
            rows = self._buffer.get(r.partition)
            if rows is None:
                raise KafkaUnavailable(f"{self.topic}[{r.partition}] is not owned by this node")
            rows.append((self.topic, r.partition, r.key, r.value))

    def stage(
        self,
        partition: int,
        records: Sequence[OutRecord],
        offsets: dict[tuple[str, int], int],
        committed: Callable[[list[int]], None] | None = None,
    ) -> None:
        """Adds a cycle's records and consumer offsets to the partition's next transaction;
        `committed` is told the records' offsets once it committed."""
        staged = self._staged.get(partition)
        if staged is None:
            raise KafkaUnavailable(f"{self.topic}[{partition}] is not owned by this node")
        start = len(staged.records)
        staged.records += records
        staged.offsets.update(offsets)
        if committed is not None:
            staged.after.append((start, len(staged.records), committed))

    async def commit(
        self,
        partition: int,
        offsets: dict[tuple[str, int], int] | None = None,
        records: Sequence[OutRecord] = (),
    ) -> list[int]:
        """Commits the buffered rows, what was staged, `records` and `offsets` in one
        transaction; the offsets `records` were written at. Nothing to commit: no
        transaction."""
        if records or offsets:
            self.stage(partition, records, offsets or {})
        taken = self.take(partition)
        if taken is None:
            return []
        written = await taken.send()
        return written[len(written) - len(records) :] if records else []

    def take(self, partition: int) -> Transaction | None:
        """Takes everything that waits for the partition's next transaction (None: there is
        nothing); `send` commits it. Taken transactions commit in the order they were
        taken, through the partition's producer."""
        producer = self._producers.get(partition)
        if producer is None:
            raise KafkaUnavailable(f"{self.topic}[{partition}] is not owned by this node")
        rows = self._buffer[partition]
        staged = self._staged[partition]
        if not rows and not staged.records and not staged.offsets:
            return None
        self._buffer[partition] = []
        self._staged[partition] = _Staged()
        return Transaction(producer, self.group_id, rows, staged, self._on_commit)

    def pending(self) -> list[int]:
        """The partitions with rows or staged work waiting to be committed."""
        return [p for p in self._buffer if self.waits(p)]

    def waits(self, partition: int) -> bool:
        """Whether rows or staged work wait for the partition's next commit."""
        return bool(self._buffer.get(partition)) or self.staged(partition)

    def staged(self, partition: int) -> bool:
        """Whether a cycle's work waits for the partition's next commit."""
        staged = self._staged.get(partition)
        return staged is not None and bool(staged.records or staged.offsets)


class Transaction:
    """One partition's taken work: its rows and staged cycles, committed by `send`."""

    def __init__(
        self,
        producer: TransactionalWriter,
        group_id: str,
        rows: list[OutRecord],
        staged: _Staged,
        on_commit: Callable[[float], None] | None = None,
    ) -> None:
        self._producer = producer
        self._group_id = group_id
        self._rows = rows
        self._staged = staged
        self._on_commit = on_commit

    async def send(self) -> list[int]:
        """Commits; tells each staged cycle its records' offsets; all the offsets."""
        rows, staged = self._rows, self._staged
        began = time.perf_counter()
        written = await self._producer.commit(
            [*rows, *staged.records], staged.offsets, self._group_id
        )
        if self._on_commit is not None:
            self._on_commit(time.perf_counter() - began)
        base = len(rows)
        for start, end, committed in staged.after:
            committed(written[base + start : base + end])
        return written


@dataclass
class _Staged:
    """A partition's decided work that its next transaction commits."""

    records: list[OutRecord] = field(default_factory=list)
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    after: list[tuple[int, int, Callable[[list[int]], None]]] = field(default_factory=list)
