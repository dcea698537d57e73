"""`ReadPositions`: where each partition's reading stands after the records a consumer
handed out, so that a poll that raises can be undone.

aiokafka's `getmany` takes the fetched records partition by partition, moving each
partition's position as it takes its records, and a later partition's error (a batch
whose CRC does not match, say) raises out of the call: the records already taken are
lost with the exception, their partitions' positions past them. Seeking every partition
back to the offset after its last record handed out reads them again. May import
aiokafka alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import IllegalStateError

__all__ = ["ReadPositions"]


class ReadPositions:
    """The next offset to read of each partition, as far as its owner handed records out
    or moved it (a seek); a partition never read nor moved since its assignment is not
    known, and is left where it is (its reader rewinds it before it counts)."""

    def __init__(self) -> None:
        self._next: dict[TopicPartition, int] = {}
        # Counts each partition's seeks and forgets (never reset): a caller that awaits
        # between an error and its seek sees whether another moved the partition meanwhile.
        self._moves: dict[TopicPartition, int] = {}

    def handed(self, got: Mapping[TopicPartition, Sequence[Any]]) -> None:
        """`got`, a poll's records by partition, was handed out."""
        for tp, records in got.items():
            if records:
                self._next[tp] = int(records[-1].offset) + 1

    def moved(self, tp: TopicPartition, offset: int) -> None:
        """`tp` was sought to `offset`."""
        self._next[tp] = offset
        self._moves[tp] = self._moves.get(tp, 0) + 1

    def forget(self, tps: Iterable[TopicPartition]) -> None:
        for tp in tps:
            self._next.pop(tp, None)
            self._moves[tp] = self._moves.get(tp, 0) + 1

    def moves(self, tp: TopicPartition) -> int:
        """How many times `tp` was sought or forgotten: unchanged, it was not moved since."""
        return self._moves.get(tp, 0)

    def undo(self, consumer: AIOKafkaConsumer) -> None:
        """Seeks each known partition still assigned back to where its reading stood:
        what a poll that raised took of it is read again."""
        assigned = consumer.assignment()
        for tp, offset in self._next.items():
            if tp in assigned:
                try:
                    consumer.seek(tp, offset)
                except IllegalStateError:
                    continue  # revoked in between: its next owner reads it
