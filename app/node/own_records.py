"""The records a partition's task wrote on its own input topics in transactions that
committed (`OwnRecords`): its events and the commands it decided in-process, by offset,
until its cycles read them back. Read back, such a record is passed over without being
decoded again: an event whose timer operation was carried out when its command was
decided (or that has none), or a command it decided itself, is exactly what the slow path
(decode, check, `follow`, `timer_op`, then pass over) would find it to be. One read back
before its commit was heard of goes the slow path, as every record of an earlier owner
does. Held by its `PartitionInput` (a retake starts with none); may import `app.kafka`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from app.kafka import Record

__all__ = ["NOT_OWN", "OwnRecords"]


class _NotOwn:
    def __repr__(self) -> str:
        return "NOT_OWN"


NOT_OWN: Final = _NotOwn()
"""`OwnRecords.take`'s answer for a record this task did not write (or not that it knows)."""


BOUND: Final = 100_000
"""How many own records a topic holds at most: the oldest beyond it (a read-back far
behind the writes) are forgotten, read the whole way when they come."""


class OwnRecords:
    """Per topic, by offset in increasing order, each own record's event id when it is a
    timer event (`wow.*`: passed over only when its operation was carried out), or None
    (a command, or an event that does nothing to the timers: passed over)."""

    def __init__(self, bound: int = BOUND) -> None:
        self._by_topic: dict[str, dict[int, str | None]] = {}
        self._bound = bound

    def __len__(self) -> int:
        return sum(len(held) for held in self._by_topic.values())

    def committed(self, records: Sequence[tuple[str, int, str | None]]) -> None:
        """A transaction's own records, committed: `(topic, offset, event id)`. None of them
        when an offset is negative (a client's batch it has no offset for: the offsets
        after it would be wrong too), so that no record is ever passed over unread on a
        client's word it cannot keep."""
        if any(offset < 0 for _, offset, _ in records):
            return
        for topic, offset, event_id in records:
            held = self._by_topic.setdefault(topic, {})
            if held and offset <= next(reversed(held)):
                held.clear()  # the topic's offsets went back (re-created, cut): none is sure
            elif len(held) >= self._bound:
                del held[next(iter(held))]
            held[offset] = event_id

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
