"""`PartitionReader`: a changing set of one topic's partitions read without a group (the
results of this node's own sends), each from where it was added."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from app.errors import KafkaUnavailable
from app.kafka.connection import Connectable, client_options
from app.kafka.consumers import as_record, fetching
from app.kafka.fetch_watch import FetchWatch
from app.kafka.read_positions import ReadPositions
from app.kafka.records import Record, explain, start_client

__all__ = ["PartitionReader"]

POSITIONS_WITHIN_S = 45.0
"""How long the read positions may take (the client's 40 s request timeout, and slack)."""


class PartitionReader:
    """Reads a changing set of one topic's partitions, each from where it was added.

    For the results of this node's own sends: no group, no committed offsets.
    """

    def __init__(
        self, bootstrap: Connectable, topic: str, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """`clock`: seconds, only compared (how long a partition's fetches went unanswered)."""
        self.topic = topic
        self._consumer = AIOKafkaConsumer(
            **client_options(bootstrap),
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            fetch_max_wait_ms=50,
        )
        self._lock = asyncio.Lock()
        self._changed = asyncio.Event()
        self._read = ReadPositions()
        # A partition whose fetches never pass (an error aiokafka only logs) stops the node.
        self._watch = FetchWatch(self._consumer, self._read.moves, clock)
        # The partitions asked for (`add`) and not let go since (`remove`), as asked: an
        # add waiting for its end offset outside the lock reads p only if still wanted.
        self._wanted: set[int] = set()

    async def start(self) -> None:
        await start_client(self._consumer, f"reader of {self.topic}")

    async def stop(self) -> None:
        await self._consumer.stop()

    async def add(self, partition: int) -> None:
        """Reads `partition` on from its end now; `KafkaUnavailable` when its end cannot be
        had (no leader within the client's request timeout)."""
        tp = TopicPartition(self.topic, partition)
        self._wanted.add(partition)
        # Asked before the lock: a partition with no leader holds this for the client's
        # whole request timeout (40 s), and every other partition's poll waits on the lock.
        try:
            end = (await self._consumer.end_offsets([tp]))[tp]
        except BaseException as exc:
            self._wanted.discard(partition)
            if isinstance(exc, KafkaError):
                said = f"{tp.topic}[{partition}]: no end offset: {explain(exc)}"
                raise KafkaUnavailable(said) from exc
            raise
        async with self._lock:
            kept = await self._positions()
            if tp in kept or partition not in self._wanted:
                return  # read already, or let go (`remove`) while its end was asked
            # assign() forgets positions: put back those of the partitions already read.
            self._consumer.assign([*kept, tp])
            self._seek({**kept, tp: end})
            self._changed.set()

    async def remove(self, partition: int) -> None:
        self._wanted.discard(partition)
        async with self._lock:
            tp = TopicPartition(self.topic, partition)
            kept = await self._positions()
            kept.pop(tp, None)
            self._consumer.assign(list(kept))
            self._read.forget([tp])
            self._seek(kept)

    async def _positions(self) -> dict[TopicPartition, int]:
        """Where each partition read is (the next offset to hand out). Bounded: a position
        reset (its offset out of range) of a partition with no leader waits for ever."""
        try:
            async with asyncio.timeout(POSITIONS_WITHIN_S):
                return {t: await self._consumer.position(t) for t in self._consumer.assignment()}
        except (KafkaError, TimeoutError) as exc:
            raise KafkaUnavailable(f"{self.topic}: no read positions: {explain(exc)}") from exc

    def _seek(self, positions: dict[TopicPartition, int]) -> None:
        for tp, position in positions.items():
            self._consumer.seek(tp, position)
            self._read.moved(tp, position)

    async def poll(self, timeout_ms: int = 200) -> list[Record]:
        """The records read since the last poll. `KafkaUnavailable` when the broker does not
        answer (nothing handed out, nothing skipped); `FetchStalled` (a `FetchRefused`: for
        good) when a partition's fetches went unanswered for `STALL_S` while records wait."""
        fetching(self._consumer)
        if not self._consumer.assignment():
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout_ms / 1000)
            return []
        async with self._lock:
            try:
                await self._watch.check()  # before the fetch, as a group's poll
                got = await self._consumer.getmany(timeout_ms=timeout_ms)
                self._watch.polled(got)
            except KafkaError as exc:
                self._read.undo(self._consumer)  # as a group's poll (`GroupConsumer.poll`)
                raise KafkaUnavailable(f"reading {self.topic} failed: {explain(exc)}") from exc
            except BaseException:
                self._read.undo(self._consumer)
                raise
            self._read.handed(got)
        return [as_record(m) for ms in got.values() for m in ms]
