"""A partition's one Kafka transaction of one type: transactional, fenced per partition.

Each owned partition p of a type commits everything through one transactional producer
(transactional id `<group>.<type>.timers.<p>`): timer rows, the command path's events and
results, and every consumer offset of p. Starting it fences p's previous owner: a node
that lost p but has not noticed yet (a zombie) can write, but never commit, so no reader
and no compaction ever sees its writes. A store write is applied locally at once and its
row buffered; the rows go out in p's next transaction (a command batch, a log batch's
offsets, or every `commit_interval` for the runner's writes). A local copy that may
hold writes that were never committed (the node stopped uncleanly, the store failed) is
thrown away and restored from the changelog (`app.timers.restore`; which copies are
clean: `app.node.local_state.CleanMarks`); after a failed commit with the store sound,
the writes not landed are rolled back instead (`PartitionHandle.roll_back`, at the
partition's close). A clean copy is read on from the last timer row its commits landed
(told the store as each commit lands: `PartitionHandle.applied_through`).

`PartitionTransaction` is one partition's, held by the task that runs the partition from
its take to its close; `app.node.type_transactions.TypeTransactions` opens them and stops
their producers, and the take attaches each to its partition's handle of the timer store,
which hands it the partition's timer rows (`app.node.partition_open`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from prometheus_client import Counter

from app.errors import KafkaUnavailable
from app.kafka import OutRecord, TransactionalWriter
from tables.exceptions import StoreClosed
from tables.timer import Timer

__all__ = ["ChangelogBehind", "Counts", "PartitionTransaction", "Transaction"]

logger = logging.getLogger(__name__)


class ChangelogBehind(Exception):
    """A commit's timer rows landed at or before an offset the partition's copy had
    applied already: its changelog was deleted and made again (or cut by an unclean leader
    election) under the node, and holds none of the rows written before. The commit fails
    its partition (its `rows_landed` raises it, never swallowed)."""


class PartitionTransaction:
    """One owned partition's transaction of one aggregate type, everything of it commits in.

    The type's store changelog sink buffers each timer row of the partition here (`add`,
    no Kafka call while the store holds its lock); `commit` sends the buffered rows with
    the caller's records (the command path's events, results and commands) and consumer
    offsets (commands, the log's subscription, timer ops) through the partition's
    transactional producer, in one transaction. Callers serialise the partition's commits
    (its task's lock), so rows buffered before a commit are in it or in an earlier one.

    Open from its producer's start (`TypeTransactions.open`) until it is abandoned
    (`TypeTransactions.abandon`, the task's close): from then on it takes nothing.
    """

    def __init__(
        self,
        producer: TransactionalWriter,
        topic: str,
        partition: int,
        group_id: str,
        on_commit: Callable[[float], None] | None = None,
    ) -> None:
        self.producer = producer
        self.topic = topic
        self.partition = partition
        self.group_id = group_id
        # Told each successful commit's duration in seconds (the commit-time histogram).
        self._on_commit = on_commit
        self._rows: list[OutRecord] = []
        self._staged = _Staged()
        # Abandoned (its producer stopped or stopping): it takes and commits nothing more.
        self.abandoned = False
        # Told the offset of the last timer row of each commit that landed (the store
        # handle's `applied_through`): a copy closed clean is read on from there.
        self.rows_landed: Callable[[int], Awaitable[None]] | None = None
        # Per buffered row, its key and the row it replaced (None: none); and what it
        # took, of which those not landed are rolled back by a failed close (`unlanded`).
        self._befores: list[tuple[bytes, Timer | None]] = []
        self._taken: list[Transaction] = []
        # Rows thrown away uncommitted (`discard`): their local writes cannot be told
        # apart any more, so the copy is restored whole, never rolled back. So is one
        # whose take staged the letters and tombstones of rows its restore passed over
        # (`letters_staged`): its offset is past them, a roll back would lose them.
        self.discarded = False
        self.letters_staged = False
        # The highest consumer offset of each topic-partition staged in it (a transaction
        # of it commits it, or did): no offset passed over below it is committed after it.
        self.carried: dict[tuple[str, int], int] = {}

    def __repr__(self) -> str:
        state = "abandoned" if self.abandoned else "open"
        return f"PartitionTransaction({self.topic}[{self.partition}], {state})"

    def _not_owned(self) -> KafkaUnavailable:
        return KafkaUnavailable(f"{self.topic}[{self.partition}] is not owned by this node")

    def abandon(self) -> TransactionalWriter:
        """Ends it (its caller stops the producer, returned): what is buffered is thrown
        away (the rows it replaced kept for `unlanded`), and nothing is taken any more."""
        self.abandoned = True
        self._rows = []
        self._staged = _Staged()
        return self.producer

    @property
    def broken(self) -> KafkaUnavailable | None:
        """The failure that broke its producer, if one did."""
        return self.producer.broken

    def add(self, key: bytes, value: bytes | None, before: Timer | None = None) -> None:
        """Buffers a timer row of the partition for its next transaction, with the row it
        replaced in the store (None: none)."""
        if self.abandoned:
            raise self._not_owned()
        self._rows.append((self.topic, self.partition, key, value))
        self._befores.append((key, before))

    def waiting(self) -> int:
        """How many records wait for its next transaction."""
        return len(self._rows) + len(self._staged.records)

    def discard(self) -> None:
        """Throws away what waits for its next transaction, its producer kept: a cycle cut
        short left half of its work there (the partition is let go uncleanly next, its
        local copy restored from the changelog)."""
        self.discarded = self.discarded or bool(self._rows)
        self._rows = []
        self._befores = []
        self._staged = _Staged()

    def stage(
        self,
        records: Sequence[OutRecord],
        offsets: dict[tuple[str, int], int],
        committed: Callable[[list[int]], None] | None = None,
        counts: Counts | None = None,
    ) -> None:
        """Adds a cycle's records and consumer offsets to its next transaction;
        `committed` is told the records' offsets once it committed, and `counts` are
        counted then (never, if it fails: the work is decided, and counted, again)."""
        if self.abandoned:
            raise self._not_owned()
        staged = self._staged
        start = len(staged.records)
        staged.records += records
        staged.offsets.update(offsets)
        for key, offset in offsets.items():
            self.carried[key] = max(offset, self.carried.get(key, offset))
        if committed is not None:
            staged.after.append((start, len(staged.records), committed))
        if counts is not None:
            staged.counts.merge(counts)

    def count(self, counter: Counter, n: float = 1) -> None:
        """Counts `n` on `counter` when its next transaction commits (see `stage`)."""
        if self.abandoned:
            raise self._not_owned()
        self._staged.counts.add(counter, n)

    async def commit(
        self,
        offsets: dict[tuple[str, int], int] | None = None,
        records: Sequence[OutRecord] = (),
    ) -> list[int]:
        """Commits the buffered rows, what was staged, `records` and `offsets` in one
        transaction; the offsets `records` were written at. Nothing to commit: no
        transaction."""
        if records or offsets:
            self.stage(records, offsets or {})
        taken = self.take()
        if taken is None:
            return []
        written = await taken.send()
        return written[len(written) - len(records) :] if records else []

    def take(self) -> Transaction | None:
        """Takes everything that waits for its next transaction (None: there is nothing);
        `send` commits it. Taken transactions commit in the order they were taken, through
        its producer."""
        if self.abandoned:
            raise self._not_owned()
        rows, staged = self._rows, self._staged
        if not rows and not staged.records and not staged.offsets:
            return None
        befores, self._befores = self._befores, []
        self._rows = []
        self._staged = _Staged()
        landed = self.rows_landed if rows else None
        taken = Transaction(
            self.producer, self.group_id, rows, staged, self._on_commit, landed, befores=befores
        )
        self._taken = [t for t in self._taken if not t.landed]
        self._taken.append(taken)
        return taken

    def unlanded_topics(self) -> set[str]:
        """The topics written by its commits that did not land (a refused one's)."""
        return {topic for taken in self._taken if not taken.landed for topic in taken.topics()}

    def unlanded(self) -> dict[bytes, Timer | None]:
        """Per row key written and not landed (taken by a commit that did not land, or
        still buffered), the row it held before the first such write (None: none): what
        the landed commits left there, which a failed close rolls the store back to."""
        out: dict[bytes, Timer | None] = {}
        for taken in self._taken:
            if not taken.landed:
                for key, before in taken.befores:
                    out.setdefault(key, before)
        for key, before in self._befores:
            out.setdefault(key, before)
        return out

    def waits(self) -> bool:
        """Whether rows or staged work wait for its next commit."""
        return bool(self._rows) or self.staged()

    def staged(self) -> bool:
        """Whether a cycle's work waits for its next commit."""
        return bool(self._staged.records or self._staged.offsets)

    def staged_offsets(self) -> dict[tuple[str, int], int]:
        """The consumer offsets staged for its next transaction."""
        return self._staged.offsets


class Transaction:
    """One partition's taken work: its rows and staged cycles, committed by `send`."""

    def __init__(
        self,
        producer: TransactionalWriter,
        group_id: str,
        rows: list[OutRecord],
        staged: _Staged,
        on_commit: Callable[[float], None] | None = None,
        rows_landed: Callable[[int], Awaitable[None]] | None = None,
        *,
        befores: Sequence[tuple[bytes, Timer | None]] = (),
    ) -> None:
        self._producer = producer
        self._group_id = group_id
        self._rows = rows
        # Its rows' keys and the rows they replaced (`PartitionTransaction.unlanded`).
        self.befores = befores
        self._staged = staged
        self._on_commit = on_commit
        self._rows_landed = rows_landed
        # Its commit returned: what it holds landed.
        self.landed = False

    def topics(self) -> set[str]:
        """The topics its records are written to."""
        return {r[0] for r in self._rows} | {r[0] for r in self._staged.records}

    @property
    def offsets(self) -> dict[tuple[str, int], int]:
        """The consumer offsets it commits."""
        return self._staged.offsets

    async def send(self) -> list[int]:
        """Commits; tells each staged cycle its records' offsets; all the offsets."""
        rows, staged = self._rows, self._staged
        began = time.perf_counter()
        written = await self._producer.commit(
            [*rows, *staged.records], staged.offsets, self._group_id
        )
        self.landed = True
        # At once, before anything below may fail: its work is committed, and counts.
        staged.counts.apply()
        if self._on_commit is not None:
            self._on_commit(time.perf_counter() - began)
        base = len(rows)
        if self._rows_landed is not None and base:
            await self._landed(max(written[:base]))
        for start, end, committed in staged.after:
            committed(written[base + start : base + end])
        return written

    async def _landed(self, offset: int) -> None:
        """The store told its rows up to `offset` landed; a store let go or rolled back
        meanwhile (the partition's close) is not: its copy is read on from an earlier
        offset, which is only slower."""
        assert self._rows_landed is not None
        try:
            await self._rows_landed(offset)
        except ChangelogBehind:
            raise
        except StoreClosed as exc:
            logger.debug("rows landed through %d, not recorded in the store: %s", offset, exc)
        except Exception as exc:
            # The store's next write meets the same fault, and fails its partition there.
            logger.warning("rows landed through %d, not recorded in the store: %s", offset, exc)


@dataclass(slots=True)
class Counts:
    """Metric increments of staged work, applied when the transaction that carries it
    commits (`Transaction.send`): a failed or abandoned one applies none, as its work is
    decided again by the partition's next take (and counted then). Per counter child (a
    `labels()`), summed: a cycle adds to a few, whatever its records. A commit whose outcome
    is unknown (it timed out, or was abandoned by a close, and landed all the same) counts
    none: its work is not decided again, so it is never counted (rare; the counters are a
    lower bound then, never a double count)."""

    by_counter: dict[Counter, float] = field(default_factory=dict)
    # Increments told through a metrics method of their own (`NodeMetrics.round`).
    later: list[Callable[[], None]] = field(default_factory=list)

    def add(self, counter: Counter, n: float = 1) -> None:
        if n:
            self.by_counter[counter] = self.by_counter.get(counter, 0) + n

    def merge(self, other: Counts) -> None:
        for counter, n in other.by_counter.items():
            self.add(counter, n)
        self.later += other.later

    def apply(self) -> None:
        """Never raises: a fault of the metrics' own fails no commit that landed."""
        try:
            for counter, n in self.by_counter.items():
                counter.inc(n)
            for told in self.later:
                told()
        except Exception:
            logger.exception("counting a commit's work failed")


@dataclass
class _Staged:
    """A partition's decided work that its next transaction commits."""

    records: list[OutRecord] = field(default_factory=list)
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    after: list[tuple[int, int, Callable[[list[int]], None]]] = field(default_factory=list)
    counts: Counts = field(default_factory=Counts)
