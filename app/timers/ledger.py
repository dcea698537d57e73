"""The failure ledger on Kafka: the compacted topic `<context>.failure-ledger`.

One record per `(subscription, target)`: its key the JSON of both (orjson, sorted keys),
its value the `LedgerEntry` as JSON, a tombstone once resolved. The topic is small (one
record per parked target), so every node keeps all of it in memory: it reads the topic
to its end on start and then follows it, and `entries()` answers from memory. A node's
own writes are applied as soon as the broker acknowledged them, so it reads them back at
once.

Which record of a key is newer is told by its offset; all records of one key sit in the
same partition (Kafka's default partitioner on the key), so their offsets compare. A
record read twice (the follower starts before the read to the end, so that nothing falls
between them) or read after the node applied a newer one of its own changes nothing.

`record` merges the timers with the entry this node knows. Two nodes parking timers of
one target at the same moment each write what they know, and the later record wins, which
may name only one node's timers; so each node hears the changes it follows (`changed`,
another node's writes and every tombstone) and records again its PARKED timers of their
targets that the entry then does not name (`app.node.parked_names`). Retry and skip act
on the store's PARKED rows, not on these names, so nothing is lost to an operator
meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
from collections import defaultdict
from collections.abc import Sequence
from typing import Final, NamedTuple

import orjson
from pydantic import ValidationError

from app.errors import BadRecord, KafkaUnavailable
from app.kafka import Clients, Publisher, Record
from app.kafka.cluster import require_topic
from app.kafka.records import refused
from app.log_limit import LogLimit
from app.protocol.topics import ContextTopics
from tables.ledger import LedgerEntry, merged
from tables.partitioner import partition_of
from tables.refs import AggregateRef
from tables.timer import Timer

__all__ = [
    "KafkaFailureLedger",
    "LedgerKey",
    "LedgerView",
    "decode_key",
    "decode_value",
    "encode_entry",
    "ledger_key",
    "merged",
    "read_ledger",
]

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_MS: Final = 10_000
"""How long `record` and `resolve` wait for the broker's acknowledgement."""


class LedgerKey(NamedTuple):
    subscription: str
    target: AggregateRef


def ledger_key(subscription: str, target: AggregateRef) -> bytes:
    """The record key of `(subscription, target)`: the same bytes for the same pair."""
    return orjson.dumps(
        {"subscription": subscription, "target": target.model_dump(mode="json")},
        option=orjson.OPT_SORT_KEYS,
    )


def encode_entry(entry: LedgerEntry) -> bytes:
    return orjson.dumps(entry.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)


def decode_key(key: bytes | None) -> LedgerKey:
    """The pair a record key names; `BadRecord` for anything else."""
    if key is None:
        raise BadRecord("ledger record without a key")
    try:
        raw = orjson.loads(key)
        if not isinstance(raw, dict) or set(raw) != {"subscription", "target"}:
            raise BadRecord(f"ledger key is not {{subscription, target}}: {key[:200]!r}")
        subscription = raw["subscription"]
        if not isinstance(subscription, str) or not subscription:
            raise BadRecord(f"ledger key without a subscription: {key[:200]!r}")
        return LedgerKey(subscription, AggregateRef.model_validate(raw["target"]))
    except (orjson.JSONDecodeError, ValidationError) as exc:
        raise BadRecord(f"unreadable ledger key {key[:200]!r}: {exc}") from exc


def decode_value(key: LedgerKey, value: bytes | None) -> LedgerEntry | None:
    """The entry a record holds, None for a tombstone; `BadRecord` if it is unreadable or
    names another pair than its key."""
    if value is None:
        return None
    try:
        entry = LedgerEntry.model_validate_json(value)
    except ValidationError as exc:
        raise BadRecord(f"unreadable ledger entry for {key.target}: {exc}") from exc
    if (entry.subscription, entry.target) != key:
        raise BadRecord(
            f"ledger entry of {entry.subscription}/{entry.target} under the key of "
            f"{key.subscription}/{key.target}"
        )
    return entry


class _Held(NamedTuple):
    partition: int
    offset: int
    entry: LedgerEntry | None


class LedgerView:
    """The ledger as read so far: per pair, the newest record by offset. No I/O.

    A tombstone is kept (as None) until the follower read past it (`read_past`), so that
    an older record read late (the read to the end and the follower overlap at start; a
    node's own write is applied before the follower reads what came before it) cannot
    bring a resolved entry back. Past it, the follower only reads newer records, so the
    view holds the open entries and the tombstones still ahead of the follower.

    `log_limit` bounds the lines about unreadable records (by default, one a minute after
    the first).
    """

    def __init__(self, *, log_limit: LogLimit | None = None) -> None:
        self._held: dict[LedgerKey, _Held] = {}
        # Every node reads every bad record, again at each start (the topic is compacted,
        # not emptied): the first in full, then a count, whoever wrote them.
        self._bad_log = log_limit or LogLimit()
        # Per partition, the tombstones held, by offset (a heap: own writes come early),
        # then by when taken (a recreated topic's offsets repeat; keys do not compare).
        self._tombstones: dict[int, list[tuple[int, int, LedgerKey]]] = defaultdict(list)
        self._seq = itertools.count()

    def apply(self, key: LedgerKey, partition: int, offset: int, entry: LedgerEntry | None) -> bool:
        """Takes a record of `key` unless one as new or newer is held; whether it did."""
        held = self._held.get(key)
        # Offsets compare within one partition; a key found in another (the topic was
        # recreated, or a foreign writer picked the partition) is taken as it comes.
        if held is not None and held.partition == partition and held.offset >= offset:
            return False
        self._held[key] = _Held(partition, offset, entry)
        if entry is None:
            heapq.heappush(self._tombstones[partition], (offset, next(self._seq), key))
        return True

    def read_past(self, partition: int, offset: int) -> None:
        """The follower read `partition` up to `offset`: what it reads next is newer than
        the tombstones up to there, which are forgotten."""
        heap = self._tombstones.get(partition)
        while heap and heap[0][0] <= offset:
            at, _, key = heapq.heappop(heap)
            if self._held.get(key) == _Held(partition, at, None):
                del self._held[key]

    def __len__(self) -> int:
        """How many pairs it holds (open entries and tombstones)."""
        return len(self._held)

    def apply_record(self, record: Record) -> bool:
        """Takes a record read from the topic; an unreadable one is logged and skipped."""
        try:
            key = decode_key(record.key)
            entry = decode_value(key, record.value)
        except BadRecord as exc:
            # Every node reads the whole ledger: a dead letter from each would be noise.
            if (more := self._bad_log.check()) is not None:
                logger.error(
                    "skipping %s[%d]@%d: %s%s",
                    record.topic,
                    record.partition,
                    record.offset,
                    exc,
                    more,
                )
            return False
        return self.apply(key, record.partition, record.offset, entry)

    def get(self, key: LedgerKey) -> LedgerEntry | None:
        held = self._held.get(key)
        return None if held is None else held.entry

    def entries(self) -> list[LedgerEntry]:
        """The open entries, by subscription and target."""
        open_ = [h.entry for h in self._held.values() if h.entry is not None]
        return sorted(open_, key=lambda e: (e.subscription, str(e.target)))


async def read_ledger(
    clients: Clients, context: str, partitions: int | None = None
) -> list[LedgerEntry]:
    """The open entries of `context`'s ledger as the topic has them now (for the CLI).

    Creates no topic: `MissingTopic` when no worker of the context has run on this
    broker. `partitions`, when given, is the count the topic must have.
    """
    view = LedgerView()
    topic = ContextTopics(context).ledger
    why = f"no worker of context {context} has run there"
    have = await require_topic(clients.admin(), topic, why)
    if partitions is not None and have != partitions:
        raise KafkaUnavailable(f"topic {topic} has {have} partitions, expected {partitions}")
    async with clients.reader() as reader:
        for p in range(have):
            async for batch in reader.read(topic, p, 0):
                for record in batch:
                    view.apply_record(record)
    return view.entries()


class KafkaFailureLedger:
    """`tables.ledger.FailureLedger` on the context's compacted ledger topic.

    `start()` reads the topic to its end before it returns, then a task follows it;
    `record` and `resolve` return once the broker acknowledged the write, and raise
    (`KafkaUnavailable`, `TimeoutError`) when it did not: a park is then not written.
    The producer is the node's, started and stopped by it. `clients` makes the follower and
    the reader (`app.kafka.ports.Clients`).
    """

    def __init__(
        self,
        clients: Clients,
        context: str,
        partitions: int,
        producer: Publisher,
        *,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
    ) -> None:
        self.topic = ContextTopics(context).ledger
        self._clients = clients
        self._partitions = partitions
        self._producer = producer
        self._timeout = timeout_ms / 1000
        self._view = LedgerView()
        self._reader = self._clients.follower(self.topic)
        self._follower: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        # The pairs whose entries changed since start, other than by this node's own
        # records: a tombstone taken (this node's or another's), which may have hidden a
        # newer park, or another node's record, which may have written over this node's
        # names. The node records again its PARKED timers the entry does not name
        # (`app.node.parked_names`). Each with when it was taken (the loop's clock).
        self.changed: asyncio.Queue[tuple[LedgerKey, float]] = asyncio.Queue()

    async def start(self) -> None:
        """Reads the ledger to its end, then follows it."""
        await self._reader.start()
        try:
            # The follower's position is fixed first: whatever is written while the read
            # to the end runs is read by one or both, and applying twice changes nothing.
            for p in range(self._partitions):
                await self._reader.add(p)
            count = await self._read_to_end()
        except BaseException:
            await self._reader.stop()
            raise
        self._follower = asyncio.create_task(self._follow(), name=f"follow {self.topic}")
        logger.info(
            "read %s: %d record(s), %d open entr(ies)",
            self.topic,
            count,
            len(self._view.entries()),
        )

    async def _read_to_end(self) -> int:
        """Applies every partition from its start to its end as it is now; how many records."""
        count = 0
        reader = self._clients.reader()
        try:
            await reader.start()
            for p in range(self._partitions):
                async for batch in reader.read(self.topic, p, 0):
                    for record in batch:
                        self._view.apply_record(record)
                    count += len(batch)
        finally:
            await reader.stop()
        return count

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The following task (started by `start`): it ends only on an error no retry
        passes, which its owner must act on."""
        return self._follower

    async def stop(self) -> None:
        if self._follower is not None:
            self._follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follower
            self._follower = None
        await self._reader.stop()

    async def _follow(self) -> None:
        while True:
            try:
                records = await self._reader.poll()
            except KafkaUnavailable as exc:
                if refused(exc):
                    raise  # an ACL or the credentials: no retry passes it (the node stops)
                logger.warning("following %s failed, trying again: %s", self.topic, exc)
                await asyncio.sleep(1)
                continue
            # Under the writes' lock: a record of this node's own read back before its
            # write's acknowledgement applied it is not taken for another's change.
            async with self._lock:
                read: dict[int, int] = {}
                for record in records:
                    if self._view.apply_record(record):
                        self._followed(record)
                    read[record.partition] = max(record.offset, read.get(record.partition, -1))
                for partition, offset in read.items():
                    self._view.read_past(partition, offset)

    def _followed(self, record: Record) -> None:
        with contextlib.suppress(BadRecord):  # applied: its key was read
            self._taken(decode_key(record.key))

    def _taken(self, key: LedgerKey) -> None:
        self.changed.put_nowait((key, asyncio.get_running_loop().time()))

    async def record(
        self, subscription: str, target: AggregateRef, timers: Sequence[Timer]
    ) -> None:
        key = LedgerKey(subscription, target)
        async with self._lock:
            entry = merged(self._view.get(key), subscription, target, timers)
            await self._write(key, entry)
        logger.warning(
            "parked %d timer(s) of target %s under %s", len(timers), target, subscription
        )

    async def resolve(self, subscription: str, target: AggregateRef) -> bool:
        """Writes the entry's tombstone if this node knows the entry; whether it did.

        An entry this node does not know is not written over: should its record still be
        on its way here, a tombstone could land after a newer park of the same target.
        """
        key = LedgerKey(subscription, target)
        async with self._lock:
            if self._view.get(key) is None:
                return False
            await self._write(key, None)
        logger.info("resolved the ledger entry of %s under %s", target, subscription)
        return True

    async def entry(self, subscription: str, target: AggregateRef) -> LedgerEntry | None:
        return self._view.get(LedgerKey(subscription, target))

    async def entries(self) -> list[LedgerEntry]:
        return self._view.entries()

    @property
    def held(self) -> int:
        """How many pairs this node holds: the open entries, and the tombstones its
        follower has not read past yet (`LedgerView`); not every target ever parked."""
        return len(self._view)

    async def _write(self, key: LedgerKey, entry: LedgerEntry | None) -> None:
        raw = ledger_key(*key)
        value = None if entry is None else encode_entry(entry)
        # partition=None: the producer's default partitioner, as any other writer's.
        offset = await asyncio.wait_for(
            self._producer.send(self.topic, raw, value, None), self._timeout
        )
        partition = partition_of(raw.decode(), self._partitions)
        if self._view.apply(key, partition, offset, entry) and entry is None:
            self._taken(key)
