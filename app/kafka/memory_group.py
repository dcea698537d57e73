"""Consumer groups and the admin port of a `MemoryLog`: members of a group share its topics'
partitions by the range assignor (partition p of every topic to one member), rebalancing
eagerly (every member's assignment revoked, then the new one assigned, callbacks awaited)
when a member joins or leaves; a member whose session expires (`expel`, as a frozen process
would) is taken out without being told, and learns at its next call, as aiokafka's member
does after a thaw: its partitions are revoked and it joins again. A member's position that
records deleted under it (`MemoryLog.delete_records`) or a topic made again left out of the
log is read on from the start, said and counted, as `GroupConsumer`'s is; a broker refusing
a position the log holds is played by `refuse_fetches`, its refusals followed as
`GroupConsumer`'s are (`InLogRefusals`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from aiokafka.errors import SaslAuthenticationFailed

from app.errors import KafkaUnavailable
from app.kafka.in_log_refusals import InLogRefusals
from app.kafka.ports import Assigned, DeletedUnread
from app.kafka.records import Record, TopicSpec
from app.kafka.resume_offset import deleted_unread, read_on_offset, resume_offset

__all__ = ["MemoryAdmin", "MemoryGroup", "MemoryGroupMember"]

_Key = tuple[str, int]


class MemoryLog(Protocol):
    """What a group reads of its `app.kafka.memory.MemoryLog`."""

    down: bool
    cluster_id: str
    login_refused: str | None

    def check_up(self) -> None: ...

    def ensure_topics(self, specs: Iterable[TopicSpec]) -> None: ...

    def max_message_bytes(self, topic: str) -> int: ...

    def topic_names(self) -> set[str]: ...

    def partitions(self, topic: str) -> int: ...

    def offsets(self, topic: str, partition: int, *, committed: bool = True) -> tuple[int, int]: ...

    def committed(self, group_id: str, topic: str, partition: int) -> int | None: ...

    def visible(
        self,
        topic: str,
        partition: int,
        position: int,
        end: int,
        committed: bool,
        limit: int | None,
    ) -> tuple[list[Record], int]: ...

    async def changed(self, seconds: float) -> None: ...

    def commit_group_offsets(self, group_id: str, offsets: dict[_Key, int]) -> None: ...


class MemoryGroup:
    """One group's members and their assignment."""

    def __init__(self, log: MemoryLog, group_id: str) -> None:
        self._log = log
        self.group_id = group_id
        self.members: list[MemoryGroupMember] = []
        self.generation = 0

    async def join(self, member: MemoryGroupMember) -> None:
        if member not in self.members:
            self.members.append(member)
        await self.rebalance()

    async def leave(self, member: MemoryGroupMember) -> None:
        if member in self.members:
            self.members.remove(member)
            member.assigned = set()
            await self.rebalance()

    async def expel(self, member: MemoryGroupMember) -> None:
        """Its session expired (a frozen process): the others rebalance without it, and it
        is not told until its next call."""
        if member in self.members:
            self.members.remove(member)
            member.expelled = True
            await self.rebalance()

    async def rebalance(self) -> None:
        """Every member gives its partitions back and is given its share of them again."""
        self.generation += 1
        for m in list(self.members):
            await m.revoked(m.assigned)
        shares = self._range(self.members)
        for m in list(self.members):
            await m.given(shares[m], self.generation)

    def _range(self, members: Sequence[MemoryGroupMember]) -> dict[MemoryGroupMember, set[_Key]]:
        """Kafka's range assignor, per topic: each member a run of partitions, the first
        ones one more when they do not divide evenly."""
        shares: dict[MemoryGroupMember, set[_Key]] = {m: set() for m in members}
        topics = sorted({t for m in members for t in m.topics})
        for topic in topics:
            subscribed = [m for m in members if topic in m.topics]
            if not subscribed:
                continue
            count = self._log.partitions(topic)
            each, extra = divmod(count, len(subscribed))
            start = 0
            for i, m in enumerate(subscribed):
                n = each + (1 if i < extra else 0)
                shares[m] |= {(topic, p) for p in range(start, start + n)}
                start += n
        return shares


class MemoryGroupMember:
    """`app.kafka.ports.GroupMember` on a `MemoryLog` (read_committed)."""

    def __init__(
        self,
        log: MemoryLog,
        group: MemoryGroup,
        topics: Sequence[str],
        *,
        on_assigned: Assigned,
        on_revoked: Assigned,
        max_poll_records: int = 2_000,
        on_deleted: DeletedUnread | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = log
        self._group = group
        self.topics = list(topics)
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self._on_deleted = on_deleted
        self._max = max_poll_records
        self.assigned: set[_Key] = set()
        self.expelled = False
        self._positions: dict[_Key, int] = {}
        self._paused: set[_Key] = set()
        self._generation = 0
        self._polls = asyncio.Event()
        self._polls.set()
        self.clock = clock
        """Seconds, only compared (how long a position has been refused): a test sets its own."""
        self._refusing: set[_Key] = set()
        self._refusals = InLogRefusals()
        # Per partition, how many times it was given or rewound: a refusal after one of
        # them starts over, as `GroupConsumer`'s after a seek or an assignment.
        self._moves: dict[_Key, int] = {}

    def refuse_fetches(self, partitions: Iterable[_Key]) -> None:
        """Its fetches of these partitions are refused as out of range wherever the log
        holds their position, until `serve_fetches`: a broker's fault, or a leader whose
        high watermark has not caught up."""
        self._refusing |= set(partitions)

    def serve_fetches(self, partitions: Iterable[_Key]) -> None:
        self._refusing -= set(partitions)

    def hold_polls(self) -> None:
        """Its polls wait until `release_polls`: the window of a thawed process whose
        timers and cycles run before its consumer learns that the group moved on."""
        self._polls.clear()

    def release_polls(self) -> None:
        self._polls.set()

    async def start(self) -> None:
        self._log.check_up()
        for t in self.topics:
            self._log.partitions(t)  # an unknown topic is an error, as subscribing is
        await self._group.join(self)

    async def stop(self) -> None:
        await self._group.leave(self)
        self._positions.clear()

    async def revoked(self, partitions: set[_Key]) -> None:
        self.assigned = set()
        self._positions.clear()
        self._paused.clear()
        await self._on_revoked(set(partitions))

    async def given(self, partitions: set[_Key], generation: int) -> None:
        self.assigned = set(partitions)
        self._generation = generation
        self._refusals.keep(self.assigned)
        for key in partitions:
            self._moved(key)
            # As aiokafka's fetcher: the committed offset, unchecked (a take's `rewind`, or
            # a fetch out of the log, says what was deleted unread, once).
            committed = self._log.committed(self._group.group_id, *key)
            self._positions[key] = self._log.offsets(*key)[0] if committed is None else committed
        await self._on_assigned(set(partitions))

    async def _rejoin_if_expelled(self) -> None:
        if self.expelled:
            # As aiokafka's member after a lost membership: its assignment was reset before
            # the revoke callback, which names none of what it held.
            self.expelled = False
            await self.revoked(set())
            await self._group.join(self)

    async def poll(self, timeout_ms: int = 500) -> dict[_Key, list[Record]]:
        await self._polls.wait()
        self._log.check_up()
        await self._rejoin_if_expelled()
        got = self._take()
        if not got:
            await self._log.changed(timeout_ms / 1000)
            self._log.check_up()
            got = self._take()
        return got

    def _take(self) -> dict[_Key, list[Record]]:
        keys = sorted(self.assigned - self._paused)
        refused = self._refused(keys)
        got: dict[_Key, list[Record]] = {}
        room = self._max
        for key in keys:
            if room <= 0:
                break
            if key in refused:
                continue
            topic, p = key
            begin, end = self._log.offsets(topic, p)
            position = self._positions.get(key, begin)
            high = self._log.offsets(topic, p, committed=False)[1]
            if not begin <= position <= high:
                # As Kafka refuses the fetch (OFFSET_OUT_OF_RANGE): read on, loudly.
                self._deleted(key, position, begin)
                position = read_on_offset(topic, p, position, begin, high)
            records, self._positions[key] = self._log.visible(topic, p, position, end, True, room)
            if records:
                got[key] = records
                room -= len(records)
        return got

    def _refused(self, keys: Sequence[_Key]) -> set[_Key]:
        """Those of `keys` whose fetch is refused (`refuse_fetches`) at a position the log
        holds, each refusal followed; `FetchRefused` (before any record is taken, so that
        none is lost with it) once one has lasted too long."""
        refused: set[_Key] = set()
        now = self.clock()
        for key in [k for k in keys if k in self._refusing]:
            begin = self._log.offsets(*key)[0]
            position = self._positions.get(key, begin)
            high = self._log.offsets(*key, committed=False)[1]
            if begin <= position <= high:
                refused.add(key)
                moves = self._moves.get(key, 0)
                stuck = self._refusals.refused(*key, position, begin, high, moves=moves, now=now)
                if stuck is not None:
                    raise stuck
        return refused

    def _moved(self, key: _Key) -> None:
        self._moves[key] = self._moves.get(key, 0) + 1

    async def commit(self, offsets: dict[_Key, int]) -> None:
        self._log.check_up()
        if not offsets:
            return
        if self.expelled or not set(offsets) <= self.assigned:
            raise KafkaUnavailable("offset commit failed: the group has rebalanced")
        self._log.commit_group_offsets(self._group.group_id, offsets)

    async def backlog(self, topic: str, partition: int) -> int:
        _, end = self._log.offsets(topic, partition, committed=False)
        return max(0, end - self._positions.get((topic, partition), end))

    def pause(self, partitions: Iterable[_Key]) -> None:
        self._paused |= set(partitions) & self.assigned

    def resume(self, partitions: Iterable[_Key]) -> None:
        self._paused -= set(partitions)

    def paused(self) -> set[_Key]:
        """The partitions paused (as aiokafka's `paused()`): for tests."""
        return set(self._paused)

    async def rewind(self, partitions: Iterable[_Key]) -> dict[_Key, int]:
        self._log.check_up()
        for key in partitions:
            if key in self.assigned:
                self._positions[key] = self._committed_or_start(key)
                self._moved(key)
        return {key: self._positions[key] for key in partitions if key in self.assigned}

    def seek(self, topic: str, partition: int, offset: int) -> bool:
        key = (topic, partition)
        if key not in self.assigned:
            return False
        self._positions[key] = offset
        self._moved(key)
        return True

    def assignment(self) -> set[_Key]:
        return set(self.assigned)

    def _committed_or_start(self, key: _Key) -> int:
        committed = self._log.committed(self._group.group_id, *key)
        start = self._log.offsets(*key)[0]
        self._deleted(key, committed, start)
        return resume_offset(*key, committed, start)

    def _deleted(self, key: _Key, position: int | None, start: int) -> None:
        if (n := deleted_unread(position, start)) and self._on_deleted is not None:
            self._on_deleted(*key, n)


class MemoryAdmin:
    """`app.kafka.ports.Admin` on a `MemoryLog`."""

    def __init__(self, log: MemoryLog) -> None:
        self._log = log

    async def ensure_topics(self, specs: Iterable[TopicSpec]) -> None:
        self._log.check_up()
        self._log.ensure_topics(specs)

    async def cluster_id(self) -> str:
        self._log.check_up()
        return self._log.cluster_id

    async def max_message_bytes(self, topic: str) -> int:
        self._log.check_up()
        return self._log.max_message_bytes(topic)

    async def topic_names(self) -> set[str]:
        self._log.check_up()
        return self._log.topic_names()

    async def probe(self) -> str | None:
        return "the broker is not reachable" if self._log.down else None

    async def check_access(self) -> None:
        """Refuses this client while the log's `login_refused` is set."""
        if (why := self._log.login_refused) is not None:
            raise KafkaUnavailable(f"memory: {why}") from SaslAuthenticationFailed(why)
