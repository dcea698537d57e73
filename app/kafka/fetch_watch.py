"""`FetchWatch`: an aiokafka consumer's partitions watched for fetches that never pass
(`app.kafka.fetch_stalls` decides), for the node's readers (`GroupConsumer`,
`PartitionReader`). May import aiokafka and `app.kafka.fetch_stalls`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from typing import Any, Final, Protocol

from aiokafka import TopicPartition
from aiokafka.errors import IllegalStateError, KafkaError

from app.kafka.fetch_stalls import FetchStalls, Key
from app.kafka.records import explain

__all__ = ["END_WAIT_S", "LOOK_EVERY_S", "FetchWatch", "Watched", "fetched_unread"]

logger = logging.getLogger(__name__)

END_WAIT_S: Final = 5.0
"""How long a look at a still partition may wait for its end offset: the poll waits on it
(the others' records too). Not had in time, the partition is watched on (a broker away is
the polls' own bound's)."""
POSITION_WAIT_S: Final = 0.05
"""How long it waits for the positions (together): a partition fetched has its own at
once; one being reset has none (no fetch stall: its reset is what waits)."""
LOOK_EVERY_S: Final = 1.0
"""How often at most the partitions' progress is read (a poll's cost: one marker per
partition assigned): against a bound of a minute, a second late at most."""


class Watched(Protocol):
    """What the watch asks of an aiokafka consumer (`AIOKafkaConsumer`)."""

    def assignment(self) -> set[TopicPartition]: ...

    def paused(self) -> set[TopicPartition]: ...

    def last_poll_timestamp(self, partition: TopicPartition) -> int | None: ...

    async def position(self, partition: TopicPartition) -> int: ...

    async def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]: ...


def fetched_unread(consumer: object) -> Collection[TopicPartition]:
    """The partitions whose last fetch answered left records (or an error to raise) in
    aiokafka 0.14's fetcher, not handed out yet (`Fetcher._records`): it fetches them
    again only once they are. None for a consumer with no fetcher (not started)."""
    fetcher = getattr(consumer, "_fetcher", None)
    if fetcher is None:
        return ()
    records: Mapping[TopicPartition, Any] = fetcher._records
    return records.keys()


class FetchWatch:
    """Watches `consumer`'s partitions read: `polled` after each poll with what it handed
    out, `check` before the next fetch of records (`getmany`), where the broker is asked
    about a partition that stood still: never between a poll's fetch and its return, so
    that a seek meanwhile (a take's rewind) is never handed records fetched before it.
    `moves`: how many times a partition was sought or given (`ReadPositions.moves`);
    `clock`: seconds, only compared."""

    def __init__(
        self,
        consumer: Watched,
        moves: Callable[[TopicPartition], int],
        clock: Callable[[], float],
        stalls: FetchStalls | None = None,
    ) -> None:
        self._consumer = consumer
        self._moves = moves
        self._clock = clock
        self._stalls = stalls or FetchStalls()
        self._handed: set[TopicPartition] = set()  # since the last look
        self._looked_at: float | None = None

    def polled(self, got: Mapping[TopicPartition, Sequence[Any]]) -> None:
        """A poll handed out `got`: those partitions made progress."""
        self._handed.update(tp for tp, records in got.items() if records)

    async def check(self) -> None:
        """Before a poll's fetch: `FetchStalled` when a partition read (assigned, not
        paused) made no progress for the bound while records wait behind its position. Its
        progress is read once every `LOOK_EVERY_S` at most; the broker is asked (its end,
        read_committed) only about one that stood still so long."""
        now = self._clock()
        if self._looked_at is not None and self._looked_at <= now < self._looked_at + LOOK_EVERY_S:
            return
        self._looked_at = now
        # Fetched and waiting in the client is progress: a partition behind others'
        # backlog is not fetched again until its batch is handed out.
        handed = self._handed.union(fetched_unread(self._consumer))
        self._handed = set()
        due = self._stalls.seen(self._markers(), {(tp.topic, tp.partition) for tp in handed}, now)
        if due:
            await self._look(due)

    def _markers(self) -> dict[Key, Hashable]:
        """Each partition read and the sign of its progress: its moves and its last fetch
        answered (aiokafka's stamp, in ms: never the same again)."""
        paused = self._consumer.paused()
        return {
            (tp.topic, tp.partition): (self._moves(tp), self._consumer.last_poll_timestamp(tp))
            for tp in self._consumer.assignment()
            if tp not in paused
        }

    async def _position(self, tp: TopicPartition) -> int | None:
        try:
            async with asyncio.timeout(POSITION_WAIT_S):
                return int(await self._consumer.position(tp))
        except (TimeoutError, IllegalStateError):
            return None  # being reset, or revoked meanwhile

    async def _look(self, due: list[Key]) -> None:
        tps = [TopicPartition(topic, partition) for topic, partition in due]
        # Together: a position being reset waits out its bound, and not one after another.
        positions = dict(zip(tps, await asyncio.gather(*map(self._position, tps)), strict=True))
        asked = [tp for tp, position in positions.items() if position is not None]
        ends: dict[TopicPartition, int] = {}
        if asked:
            try:
                # The consumer's own isolation (read_committed): the last stable offset, so
                # a position held by an open transaction is at its end, not behind it.
                async with asyncio.timeout(END_WAIT_S):
                    got = await self._consumer.end_offsets(asked)
                ends = {tp: int(offset) for tp, offset in got.items()}
            except (KafkaError, TimeoutError) as exc:
                said = explain(exc) if isinstance(exc, KafkaError) else f"none in {END_WAIT_S:g}s"
                logger.warning(
                    "%s: no fetch answered for %.0f s, and no end offset to compare its "
                    "position with (%s): watched on",
                    ", ".join(f"{tp.topic}[{tp.partition}]" for tp in asked),
                    self._stalls.stall_s,
                    said,
                )
        # Read again after the waits: one moved, answered, paused or revoked meanwhile is
        # not judged by what was asked before.
        markers, now = self._markers(), self._clock()
        stalled = None
        for tp, position in positions.items():
            key = (tp.topic, tp.partition)
            if key not in markers:
                continue  # paused or revoked: the next look forgets it
            error = self._stalls.looked(key, markers[key], position, ends.get(tp), now)
            stalled = stalled or error
        if stalled is not None:
            raise stalled
