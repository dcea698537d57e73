"""The group consumer whose assignment is the node's ownership (`GroupConsumer`): its
rebalance callbacks, its polls and commits with their errors said in our terms, and a
static member's rejoin (`static_membership`). May import `aiokafka` and `app.kafka`'s
records, connection, ports and consumers (their record making).

Its position never jumps quietly: aiokafka's `auto_offset_reset` ("earliest") would move a
partition whose records retention or DeleteRecords removed ahead of it (a lagging or
paused one) to the log's start without a word. With "none" the poll is told, and reads on
from the start itself, saying and counting what was deleted unread (`read_on_offset`); a
position the log holds refused again and again stops the node past a bound
(`InLogRefusals`), never fetched again for ever."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.errors import (
    IllegalStateError,
    KafkaError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
)

from app.errors import KafkaUnavailable
from app.kafka.connection import Connectable, client_options
from app.kafka.consumers import as_record, fetching
from app.kafka.fetch_watch import FetchWatch
from app.kafka.in_log_refusals import FetchRefused, InLogRefusals
from app.kafka.ports import Assigned, DeletedUnread
from app.kafka.read_positions import ReadPositions
from app.kafka.records import Record, explain, instance_fenced, start_client
from app.kafka.refused_topics import RefusedTopics
from app.kafka.resume_offset import deleted_unread, read_on_offset, resume_offset
from app.kafka.static_membership import Membership

__all__ = ["GROUP_CALL_S", "GROUP_METADATA_MAX_AGE_MS", "GroupConsumer", "rebalance_timeout_ms"]

logger = logging.getLogger(__name__)

GROUP_METADATA_MAX_AGE_MS = 10_000
"""How old the group member's metadata may get (aiokafka's default: 5 minutes)."""


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(
        self,
        on_assigned: Assigned,
        on_revoked: Assigned,
        forget: Callable[[Iterable[TopicPartition]], None],
        membership: Membership,
    ) -> None:
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self._forget = forget  # a partition's reading starts again where it is assigned
        self._membership = membership

    async def on_partitions_revoked(self, revoked: Any) -> None:
        self._forget(revoked)
        await self._on_revoked({(tp.topic, tp.partition) for tp in revoked})
        # After the close: the JoinGroup follows this callback.
        self._membership.rejoining()

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self._membership.joined()
        self._forget(assigned)
        await self._on_assigned({(tp.topic, tp.partition) for tp in assigned})


def rebalance_timeout_ms(session_timeout_ms: int) -> int:
    """How long the group waits for its members to rejoin a rebalance (their revoke
    callbacks included) before it throws a late one out: three sessions, at least 30 s."""
    return max(session_timeout_ms * 3, 30_000)


POSITION_WAIT_S: Final = 0.05
"""How long `GroupConsumer.backlog` waits for a position (a fetched partition has its own)."""

GROUP_CALL_S: Final = 30.0
"""How long an offset commit or a read of the committed offsets may take: aiokafka retries
them for as long as the group's coordinator is away, which would hold the poll loop of
every partition (a commit) or a take (never counted against its attempts) for good."""


class GroupConsumer:
    """A consumer-group member whose assignment is the node's partition ownership.

    The range assignor hands partition p of every subscribed topic to the same member,
    which is what co-partitioning needs (round robin, aiokafka's default, would not).
    The rebalance callbacks are awaited before fetching resumes, so a partition is
    restored before any of its records is processed.
    """

    def __init__(
        self,
        bootstrap: Connectable,
        group_id: str,
        topics: Sequence[str],
        *,
        on_assigned: Assigned,
        on_revoked: Assigned,
        session_timeout_ms: int = 10_000,
        max_poll_records: int = 2_000,
        group_instance_id: str | None = None,
        on_deleted: DeletedUnread | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`group_instance_id`: a static member's id (KIP-345); None: a dynamic member.
        `on_deleted`: told of the records read past, deleted before they were read.
        `clock`: seconds, only compared (how long a position has been refused)."""
        self._topics = list(topics)
        self._on_deleted = on_deleted
        self._clock = clock
        self._refusals = InLogRefusals()
        self._group_id = group_id
        self._instance_id = group_instance_id
        self._read = ReadPositions()
        self._refused = RefusedTopics()
        self._consumer = AIOKafkaConsumer(
            **client_options(bootstrap),
            group_id=group_id,
            # A static member's stop sends no LeaveGroup: its partitions wait for it (up
            # to the session timeout) instead of moving twice in a rolling restart.
            group_instance_id=group_instance_id,
            enable_auto_commit=False,
            # A position out of the log raises in `poll`, which reads on from the start
            # itself, loudly; a partition with no committed offset too (read from the start).
            auto_offset_reset="none",
            isolation_level="read_committed",
            partition_assignment_strategy=(RangePartitionAssignor,),
            session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=max(300, session_timeout_ms // 4),
            rebalance_timeout_ms=rebalance_timeout_ms(session_timeout_ms),
            max_poll_records=max_poll_records,
            # The group's leader assigns again when its metadata changes: a topic missing
            # from it for a moment (just made) or partitions added are seen within this,
            # well within the node's grace for an assignment it cannot run (30 s).
            metadata_max_age_ms=GROUP_METADATA_MAX_AGE_MS,
        )
        # A partition whose fetches never pass (an error aiokafka only logs) stops the node.
        self._watch = FetchWatch(self._consumer, self._read.moves, clock)
        membership = Membership(self._consumer, static=group_instance_id is not None)
        self._listener = _Listener(on_assigned, on_revoked, self._read.forget, membership)

    async def start(self) -> None:
        await start_client(self._consumer, "consumer")
        self._consumer.subscribe(self._topics, listener=self._listener)

    async def stop(self) -> None:
        await self._consumer.stop()

    async def poll(self, timeout_ms: int = 500) -> dict[tuple[str, int], list[Record]]:
        """A poll that raises hands nothing out and leaves every partition where the last
        one's records ended (`ReadPositions`): none of them is skipped. One that finds a
        partition's position out of its log (or none) moves it (`_read_on`) and hands
        nothing out: the next one reads it and the others on. `FetchRefused` (a
        `KafkaUnavailable`) when a position its log holds was refused for too long, or
        (`FetchStalled`) a partition's fetches went unanswered that long while records wait
        (`FetchWatch`): it then hands nothing out either."""
        fetching(self._consumer)
        self._refused.check(self._consumer, self._topics, time.monotonic())
        try:
            # Before the fetch, whose records go out with no await after it: a take's
            # rewind is never handed what was fetched before it (`app.node.polling`).
            await self._watch.check()
            got = await self._consumer.getmany(timeout_ms=timeout_ms)
            self._watch.polled(got)
        except (OffsetOutOfRangeError, NoOffsetForPartitionError) as exc:
            # aiokafka raises a partition's error only when it took no record of any
            # partition in this call (`Fetcher.fetched_records`): nothing to undo, and the
            # other partitions' records wait for the next poll.
            await self._read_on(exc)
            return {}
        except KafkaError as exc:
            self._read.undo(self._consumer)
            if instance_fenced(exc):
                raise KafkaUnavailable(self._fenced()) from exc
            raise KafkaUnavailable(f"poll failed: {explain(exc)}") from exc
        except BaseException:
            self._read.undo(self._consumer)
            raise
        self._read.handed(got)
        return {(tp.topic, tp.partition): [as_record(m) for m in ms] for tp, ms in got.items()}

    async def _read_on(self, exc: KafkaError) -> None:
        """Moves the partitions `exc` names (OffsetOutOfRangeError: {partition: fetch
        offset}; NoOffsetForPartitionError: a partition with no committed offset) to where
        they read on from: the start, for one with none, as its take's `rewind` would;
        `read_on_offset` for one out of its log, its deleted records said and counted. One
        whose position its log holds stays there, fetched again, its refusals followed
        (`InLogRefusals`): `FetchRefused` once they last too long."""
        arg = exc.args[0] if exc.args else None
        if isinstance(exc, OffsetOutOfRangeError) and isinstance(arg, dict):
            at: dict[TopicPartition, int | None] = {tp: int(o) for tp, o in arg.items()}
        elif isinstance(exc, NoOffsetForPartitionError) and isinstance(arg, TopicPartition):
            at = {arg: None}
        else:  # not as aiokafka 0.14 raises them: said, and the poll loop's to count
            raise KafkaUnavailable(f"poll failed: {explain(exc)}") from exc
        moves = {tp: self._read.moves(tp) for tp in at}
        tps = list(at)
        try:
            async with asyncio.timeout(GROUP_CALL_S):
                starts = await self._consumer.beginning_offsets(tps)
                ends = await self._consumer.end_offsets(tps)
        except KafkaError as e:
            raise KafkaUnavailable(f"poll failed: {explain(exc)}: {explain(e)}") from e
        except TimeoutError as e:
            raise KafkaUnavailable(f"poll failed: {explain(exc)}, and no offsets") from e
        assigned = self._consumer.assignment()
        self._refusals.keep({(tp.topic, tp.partition) for tp in assigned})
        now = self._clock()
        stuck: FetchRefused | None = None
        for tp, position in at.items():
            if tp not in assigned or self._read.moves(tp) != moves[tp]:
                continue  # revoked, or sought (a take's rewind) meanwhile: it reads on there
            start, end = int(starts[tp]), int(ends[tp])
            if position is not None and start <= position <= end:
                # Left where it is, which aiokafka's fetcher fetches again (after its retry
                # backoff): a seek would count as a move, and start the refusals over.
                refused = self._refusals.refused(
                    tp.topic, tp.partition, position, start, end, moves=moves[tp], now=now
                )
                stuck = stuck or refused
                continue
            if position is None:
                offset = start
            else:
                offset = read_on_offset(tp.topic, tp.partition, position, start, end)
            try:
                self._consumer.seek(tp, offset)
            except IllegalStateError:
                continue  # revoked in between
            self._read.moved(tp, offset)
            self._deleted(tp, position, start)
        if stuck is not None:
            raise stuck from exc

    def _deleted(self, tp: TopicPartition, position: int | None, start: int) -> None:
        if (n := deleted_unread(position, start)) and self._on_deleted is not None:
            self._on_deleted(tp.topic, tp.partition, n)

    def _fenced(self) -> str:
        return (
            f"fenced out of group {self._group_id!r}: another worker joined it with this "
            f"worker's TICKWHEEL_GROUP_INSTANCE_ID ({self._instance_id!r}); give each "
            "worker an id of its own"
        )

    async def commit(self, offsets: dict[tuple[str, int], int]) -> None:
        """Commits `offsets` (the next offset to read, per partition).

        `KafkaUnavailable` when the group rebalanced meanwhile: the partitions' next owner
        reads those records again, which every consumer here is written to survive.
        """
        if offsets:
            tps = {TopicPartition(t, p): o for (t, p), o in offsets.items()}
            try:
                async with asyncio.timeout(GROUP_CALL_S):
                    await self._consumer.commit(tps)
            except KafkaError as exc:
                raise KafkaUnavailable(f"offset commit failed: {explain(exc)}") from exc
            except TimeoutError as exc:
                raise KafkaUnavailable(f"no offset commit within {GROUP_CALL_S:g} s") from exc

    async def backlog(self, topic: str, partition: int) -> int:
        """How many records of the partition wait behind what was fetched; 0 when that is
        not known at once (its position being reset, or no longer assigned). A partition's
        cycle asks, just before it takes its lock: aiokafka's `position` waits, for as long
        as it takes, for a position being reset, and a cycle must not wait on the broker."""
        tp = TopicPartition(topic, partition)
        high = self._consumer.highwater(tp)
        if high is None:
            return 0
        try:
            async with asyncio.timeout(POSITION_WAIT_S):
                position = await self._consumer.position(tp)
        except (TimeoutError, IllegalStateError):
            return 0
        return max(0, int(high) - int(position))

    def pause(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Stops fetching these partitions (they are restored first)."""
        tps = [TopicPartition(t, p) for t, p in partitions]
        assigned = self._consumer.assignment()
        self._consumer.pause(*[tp for tp in tps if tp in assigned])

    def resume(self, partitions: Iterable[tuple[str, int]]) -> None:
        tps = [TopicPartition(t, p) for t, p in partitions]
        assigned = self._consumer.assignment()
        self._consumer.resume(*[tp for tp in tps if tp in assigned])

    def paused(self) -> set[tuple[str, int]]:
        """The partitions paused (for tests, as `MemoryGroupMember.paused`)."""
        return {(tp.topic, tp.partition) for tp in self._consumer.paused()}

    async def rewind(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Reads these partitions again from the group's committed offsets (the start where
        none is committed): what was read after them never counted. The offset each one
        still assigned reads from now."""
        assigned = self._consumer.assignment()
        committed: dict[TopicPartition, int | None] = {}
        targets: dict[TopicPartition, int] = {}
        sought: dict[tuple[str, int], int] = {}
        try:
            for t, p in partitions:
                tp = TopicPartition(t, p)
                if tp not in assigned:
                    continue
                async with asyncio.timeout(GROUP_CALL_S):
                    committed[tp] = await self._consumer.committed(tp)
            if committed:
                # Every start read, not only where none is committed: a committed offset
                # below it missed records deleted unread, which is said (`resume_offset`).
                async with asyncio.timeout(GROUP_CALL_S):
                    starts = await self._consumer.beginning_offsets(list(committed))
                for tp, offset in committed.items():
                    targets[tp] = resume_offset(tp.topic, tp.partition, offset, starts[tp])
            # All seeks at once, after the last await: a caller that marks the rewind
            # (a new take generation) right after it returns sees no batch fetched from
            # the old positions delivered after the mark.
            assigned = self._consumer.assignment()
            for tp, offset in targets.items():
                if tp in assigned:
                    self._consumer.seek(tp, offset)
                    self._read.moved(tp, offset)
                    sought[(tp.topic, tp.partition)] = offset
                    self._deleted(tp, committed[tp], starts[tp])
        except IllegalStateError:
            return sought  # revoked in between
        except KafkaError as exc:
            raise KafkaUnavailable(f"cannot read committed offsets: {explain(exc)}") from exc
        except TimeoutError as exc:
            raise KafkaUnavailable(f"no committed offsets within {GROUP_CALL_S:g} s") from exc
        return sought

    def seek(self, topic: str, partition: int, offset: int) -> bool:
        """Reads the partition again from `offset`; False when it is no longer assigned."""
        tp = TopicPartition(topic, partition)
        if tp not in self._consumer.assignment():
            return False
        try:
            self._consumer.seek(tp, offset)
        except IllegalStateError:
            return False  # revoked in between
        self._read.moved(tp, offset)
        return True

    def assignment(self) -> set[tuple[str, int]]:
        return {(tp.topic, tp.partition) for tp in self._consumer.assignment()}
