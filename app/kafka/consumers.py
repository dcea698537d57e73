"""Consumers: whole-partition readers (restores, operators' reads, tails) and the group
consumer whose assignment is the node's ownership."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any, Final

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.errors import (
    IllegalStateError,
    KafkaError,
)

from app.errors import KafkaUnavailable
from app.kafka import lenient_headers
from app.kafka.connection import Connectable, client_options
from app.kafka.ports import Assigned
from app.kafka.read_positions import ReadPositions
from app.kafka.records import Record, explain, instance_fenced, start_client
from app.kafka.refused_topics import RefusedTopics
from app.kafka.resume_offset import resume_offset

logger = logging.getLogger(__name__)

# A header key that is not UTF-8 stops no consumer (see the module).
lenient_headers.install()


GROUP_METADATA_MAX_AGE_MS = 10_000
"""How old the group member's metadata may get (aiokafka's default: 5 minutes)."""


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

    async def read(self, topic: str, partition: int, start: int) -> AsyncIterator[list[Record]]:
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
) -> AsyncIterator[list[Record]]:
    """Reads one partition from `start` to its end as it is now (a one-off `Reader`)."""
    async with Reader(bootstrap, batch=batch) as reader:
        async for records in reader.read(topic, partition, start):
            yield records


async def read_partitions(
    bootstrap: Connectable, topic: str, partitions: Iterable[int]
) -> AsyncIterator[list[Record]]:
    """Reads each of `partitions` from its start to its end as it is now, one after another."""
    async with Reader(bootstrap) as reader:
        for p in partitions:
            async for records in reader.read(topic, p, 0):
                yield records


async def tail(
    bootstrap: Connectable, topic: str, partitions: Iterable[int]
) -> AsyncIterator[Record]:
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


def rejoin_as(member_id: str, last: str | None) -> str | None:
    """The member id a static member rejoins as: its last one when the coordinator's
    answer reset it (`member_id` empty), else None (it joins as it is).

    aiokafka's heartbeat names no `group.instance.id`, so a static member whose id another
    worker joined with since hears only "unknown member", resets, and joins afresh, taking
    the id back: the two would fence each other at every heartbeat, quietly, both running
    the partitions. Joining as the member it was, the coordinator answers it
    FENCED_INSTANCE_ID when another holds its instance id now (it stops, the other goes
    on), or "unknown member" when its session merely expired (it then joins afresh)."""
    return last if not member_id and last else None


class _Membership:
    """A static member's last member id, and the rejoin as it (`rejoin_as`): aiokafka's
    coordinator state, read and set between its reset and its next JoinGroup (the revoke
    callback runs there). Nothing for a dynamic member."""

    def __init__(self, consumer: AIOKafkaConsumer, static: bool) -> None:
        self._consumer = consumer
        self._static = static
        self._last: str | None = None

    def _coordinator(self) -> Any:
        return getattr(self._consumer, "_coordinator", None) if self._static else None

    def joined(self) -> None:
        coordinator = self._coordinator()
        if coordinator is not None:
            self._last = getattr(coordinator, "member_id", None) or self._last

    def rejoining(self) -> None:
        coordinator = self._coordinator()
        if coordinator is None:
            return
        member = rejoin_as(getattr(coordinator, "member_id", ""), self._last)
        if member is not None:
            coordinator.member_id = member


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(
        self,
        on_assigned: Assigned,
        on_revoked: Assigned,
        forget: Callable[[Iterable[TopicPartition]], None],
        membership: _Membership,
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
    ) -> None:
        """`group_instance_id`: a static member's id (KIP-345); None: a dynamic member."""
        self._topics = list(topics)
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
            auto_offset_reset="earliest",
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
        membership = _Membership(self._consumer, static=group_instance_id is not None)
        self._listener = _Listener(on_assigned, on_revoked, self._read.forget, membership)

    async def start(self) -> None:
        await start_client(self._consumer, "consumer")
        self._consumer.subscribe(self._topics, listener=self._listener)

    async def stop(self) -> None:
        await self._consumer.stop()

    async def poll(self, timeout_ms: int = 500) -> dict[tuple[str, int], list[Record]]:
        """A poll that raises hands nothing out and leaves every partition where the last
        one's records ended (`ReadPositions`): none of them is skipped."""
        fetching(self._consumer)
        self._refused.check(self._consumer, self._topics, time.monotonic())
        try:
            got = await self._consumer.getmany(timeout_ms=timeout_ms)
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
