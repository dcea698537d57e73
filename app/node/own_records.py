"""The records a partition's task wrote on its own input topics in transactions that
committed (`OwnRecords`): its events and the commands it decided in-process, by offset,
until its cycles read them back. Read back, such a record is passed over without being
decoded again: an event whose timer operation was carried out when its command was
decided (or that has none), or a command it decided itself, is exactly what the slow path
(decode, check, `follow`, `timer_op`, then pass over) would find it to be. One read back
before its commit was heard of goes the slow path, as every record of an earlier owner
does. Held by its `PartitionInput` (a retake starts with none); may import `app.kafka`."""

from __future__ import annotations

from typing import Final

from app.kafka import Record

__all__ = ["NOT_OWN", "OwnRecords"]


class _NotOwn:
    def __repr__(self) -> str:
        return "NOT_OWN"


NOT_OWN: Final = _NotOwn()
"""`OwnRecords.take`'s answer for a record this task did not write (or not that it knows)."""


class OwnRecords:
    """Per topic, by offset in increasing order, each own record's event id when it is a
    timer event (`wow.*`: passed over only when its operation was carried out), or None
    (a command, or an event that does nothing to the timers: passed over)."""

    def __init__(self) -> None:
        self._by_topic: dict[str, dict[int, str | None]] = {}

    def __len__(self) -> int:
        return sum(len(held) for held in self._by_topic.values())

    def add(self, topic: str, offset: int, event_id: str | None) -> None:
        """A record written at `offset` of `topic` (the task's partition of it), committed."""
        self._by_topic.setdefault(topic, {})[offset] = event_id

    def command(self, record: Record) -> bool:
        """Whether `record` is a command this task decided in-process (forgotten here)."""
        return self.take(record.topic, record.offset) is None

    def take(self, topic: str, offset: int) -> str | _NotOwn | None:
        """What the record at `offset` of `topic` is, forgotten here with those before it
        (read already: a commit heard of after the record was read); `NOT_OWN` when it is
        not one of this task's known records."""
        held = self._by_topic.get(topic)
        if not held:
            return NOT_OWN
        # Committed in order: those below `offset` were read past (the slow path took them).
        while held and (first := next(iter(held))) < offset:
            del held[first]
        return held.pop(offset, NOT_OWN)
