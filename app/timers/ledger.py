"""The failure ledger on Kafka: the compacted topic `<context>.failure-ledger`.

One record per `(subscription, target)`: its key the JSON of both (orjson, sorted keys),
its value the `LedgerEntry` as JSON, a tombstone once resolved (the records and the view
of them: `app.timers.ledger_view`). The topic is small (one record per parked target), so
every node keeps all of it in memory, within the view's bounds (another producer's records
are read too): it reads the topic to its end on start and then follows it, and `entries()`
answers from memory. A node's own writes are applied as soon
as the broker acknowledged them, so it reads them back at once.

Which record of a key is newer is told by its offset; all records of one key sit in the
same partition (named by the writer: murmur2 of the key over the context's partition count,
where Kafka's default partitioner puts it while the topic has that count, and where the
nodes read it should partitions be added to the topic), so their offsets compare. A
record read twice (the follower starts before the read to the end, so that nothing falls
between them) or read after the node applied a newer one of its own changes nothing.

`record` merges the timers with the entry this node knows. Two nodes parking timers of
one target at the same moment each write what they know, and the later record wins, which
may name only one node's timers; so each node hears the changes it follows (`changed`,
another node's writes and every tombstone) and records again its PARKED timers of their
targets that the entry then does not name (`app.node.parked_names`). Retry and skip act
on the store's PARKED rows, not on these names, so nothing is lost to an operator
meanwhile.

`forget` takes out of an entry the names of timers that are no longer PARKED (cancelled,
replaced, deleted with their owner, paused, retried or skipped), so that an entry names
what an operator can still act on, and goes once nothing is left; a paused one resumed is
PARKED again and recorded again (`app.timers.unparked`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Sequence
from typing import Final

from app.errors import BadRecord
from app.kafka import Clients, Publisher, Record
from app.kafka.ports import POLL_FAILING_S
from app.protocol.topics import ContextTopics
from app.timers.ledger_changes import LedgerChanges
from app.timers.ledger_view import (
    LedgerKey,
    LedgerView,
    decode_key,
    decode_value,
    encode_entry,
    ledger_key,
    read_ledger,
)
from app.timers.sender import FollowerPolls
from app.timers.unparked import pruned_entry
from tables.ledger import LedgerEntry, merged
from tables.partitioner import partition_of
from tables.refs import AggregateRef
from tables.timer import Timer

__all__ = [
    "KafkaFailureLedger",
    "LedgerChanges",
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
"""How long `record`, `resolve` and `forget` wait for the broker's acknowledgement."""


class KafkaFailureLedger:
    """`tables.ledger.FailureLedger` on the context's compacted ledger topic.

    `start()` reads the topic to its end before it returns, then a task follows it;
    `record`, `resolve` and `forget` return once the broker acknowledged the write, and raise
    (`KafkaUnavailable`, `TimeoutError`) when it did not: a park is then not written.
    The producer is the node's, started and stopped by it. `clients` makes the follower and
    the reader (`app.kafka.ports.Clients`). `failing_s` and `monotonic`: how long the
    follower's polls may fail, none passing (`app.timers.sender.FollowerPolls`).
    """

    def __init__(
        self,
        clients: Clients,
        context: str,
        partitions: int,
        producer: Publisher,
        *,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        failing_s: float = POLL_FAILING_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.topic = ContextTopics(context).ledger
        self._clients = clients
        self._partitions = partitions
        self._producer = producer
        self._timeout = timeout_ms / 1000
        self._view = LedgerView(partitions)
        self._reader = self._clients.follower(self.topic)
        self._polls = FollowerPolls(self._reader, failing_s=failing_s, monotonic=monotonic)
        self._follower: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        # The pairs whose entries changed since start, other than by this node's own
        # records: a tombstone taken (this node's or another's), which may have hidden a
        # newer park, or another node's record, which may have written over this node's
        # names. The node records again its PARKED timers the entry does not name
        # (`app.node.parked_names`). Each pair once, with when its first change not
        # looked at was taken (the loop's clock).
        self.changed = LedgerChanges()

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
            self._view.open_count,
        )

    async def _read_to_end(self) -> int:
        """Applies every partition from its start to its end as it is now; how many records."""
        count = 0
        reader = self._clients.reader()
        try:
            await reader.start()
            for p in range(self._partitions):
                async with contextlib.aclosing(reader.read(self.topic, p, 0)) as batches:
                    async for batch in batches:
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

    @property
    def failing(self) -> tuple[float, str] | None:
        """How long its follower's polls have failed, none passing, and why."""
        return self._polls.failing

    async def stop(self) -> None:
        if self._follower is not None:
            self._follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follower
            self._follower = None
        await self._reader.stop()

    async def _follow(self) -> None:
        while True:
            records = await self._polls.poll()
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
        self.changed.put(key, asyncio.get_running_loop().time())

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

    async def forget(
        self,
        subscription: str,
        target: AggregateRef,
        gone: Collection[str],
        parked: Sequence[Timer] = (),
    ) -> bool:
        """Takes the names `gone` out of the entry of `(subscription, target)` this node
        knows and names `parked` in it (`pruned_entry`), in one write, a tombstone when nothing
        is left; whether it wrote. An entry it does not know, or that names none of `gone`
        (or only ones `parked` still has), is left as it is."""
        key = LedgerKey(subscription, target)
        async with self._lock:
            known = self._view.get(key)
            if known is None or (entry := pruned_entry(known, gone, parked)) is known:
                return False
            await self._write(key, entry)
        left = () if entry is None else entry.timers
        logger.info(
            "the ledger entry of %s under %s named %d timer(s) no longer parked: %s",
            target,
            subscription,
            len(set(known.timers) - set(left)),
            "resolved" if entry is None else f"{len(left)} named now",
        )
        return True

    async def entry(self, subscription: str, target: AggregateRef) -> LedgerEntry | None:
        return self._view.get(LedgerKey(subscription, target))

    async def entries(self) -> list[LedgerEntry]:
        return self._view.entries()

    async def dated(self, limit: int | None = None) -> list[tuple[int, LedgerEntry]]:
        """The open entries with when they were written, the newest first, the first
        `limit` only when given (`LedgerView`)."""
        return self._view.dated(limit)

    @property
    def open_entries(self) -> int:
        """How many open entries it holds: `len(await entries())`, without listing them."""
        return self._view.open_count

    @property
    def held(self) -> int:
        """How many pairs this node holds: the open entries, and the tombstones its
        follower has not read past yet (`LedgerView`); not every target ever parked."""
        return len(self._view)

    async def _write(self, key: LedgerKey, entry: LedgerEntry | None) -> None:
        raw = ledger_key(*key)
        value = None if entry is None else encode_entry(entry)
        # The partition named, not the producer's default partitioner's: that one places by
        # the topic's count now, and partitions added to the ledger alone would take writes
        # (a park, or a tombstone beside the record it should delete) that no node reads.
        partition = partition_of(raw.decode(), self._partitions)
        offset = await asyncio.wait_for(
            self._producer.send(self.topic, raw, value, partition), self._timeout
        )
        # When it was written, as its record's timestamp says it to the nodes that read it.
        at = time.time_ns() // 1_000_000
        if self._view.apply(key, partition, offset, entry, at) and entry is None:
            self._taken(key)
