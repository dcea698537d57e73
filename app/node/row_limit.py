"""Timer rows a partition's changelog takes no more (`RowLimit`, one per aggregate type).

A timer is taken only if its row, with room to grow, fits what its `timers` changelog takes
(`app.timers.timer_sizes`). One stored before that topic's `max.message.bytes` was lowered
(the nodes restarted since, reading the new limit) may not fit any more: its next row (a
claim, a settle, a cancel) joined the partition's transaction, the broker refused it at
every retake, and every command and timer of the partition waited behind it for good.

p's changelog sink refuses such a row before it joins the transaction (`check`), noting
its key, so the write fails as a store fault does and p is taken afresh. That take
dead-letters the row as the store holds it, whole, and deletes it (`letter_noted`): the
timer does not fire, the partition goes on. Its set event is still in its owner's log: an
operator raises the limit, then sets it again (or rebuilds the table). A row that fits
with room to grow by then (set again smaller since) is left as it is.

May import `app.errors`, `app.kafka`, `app.protocol`, `app.timers` and `tables`."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from app.errors import RecordTooLarge
from app.kafka import OutRecord
from app.kafka.records import topic_takes
from app.protocol.dead_letters import Headers, Stage, dead_letter
from app.timers.timer_sizes import ROW_GROWTH
from tables.keys import encode_timer
from tables.partition_handle import PartitionHandle
from tables.store import ChangelogRecord

__all__ = ["RowLimit"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Row:
    """A row the store holds, as its letter's source record: its changelog's, at the
    offset the copy has applied through (the row was written there or before)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: Headers = ()


class RowLimit:
    """What a type's timers changelog (`topic`) takes, a record's key and value together
    (`takes`), and per partition the row keys its sink refused since its last take."""

    def __init__(self, topic: str, takes: int) -> None:
        self.topic = topic
        self.takes = takes
        self._noted: dict[int, set[bytes]] = {}

    def __repr__(self) -> str:
        return f"RowLimit({self.topic}, {self.takes})"

    def noted(self, p: int) -> set[bytes]:
        """The row keys of p refused since p's last take."""
        return set(self._noted.get(p, ()))

    def check(self, p: int, records: Sequence[ChangelogRecord]) -> None:
        """`RecordTooLarge` for a write of p with a row over what the changelog takes (its
        keys noted for p's next take): nothing of the write joins p's transaction."""
        over = [
            r for r in records if r.value is not None and len(r.key) + len(r.value) > self.takes
        ]
        if not over:
            return
        self._noted.setdefault(p, set()).update(r.key for r in over)
        size = max(len(r.key) + len(r.value or b"") for r in over)
        raise RecordTooLarge(
            f"{self.topic}[{p}]: a timer row of {size} bytes with its key, over "
            f"{self.takes} ({topic_takes(self.takes, self.topic)}): stored before the "
            "topic took less, it is dead-lettered and deleted at the partition's next take"
        )

    async def letter_noted(self, handle: PartitionHandle, now: int, limit: int) -> list[OutRecord]:
        """At p's take (`handle`'s partition, its changelog sink attached): each row its
        sink refused since the last take, deleted (a tombstone joins p's transaction) when
        it still does not fit with room to grow; their letters (`limit`: what the
        dead-letter topic takes), for the caller to stage in p's next transaction."""
        p = handle.partition
        letters: list[OutRecord] = []
        for key in sorted(self._noted.pop(p, ())):
            held = handle.held(key)
            if held is None:
                continue
            value = encode_timer(held)
            size = len(key) + len(value)
            if size + ROW_GROWTH <= self.takes:
                continue  # written again since, within the limit
            if await handle.drop(key) is None:
                continue
            why = (
                f"timer {held.id} ({held.owner.id}, key {held.key!r}, {held.status}): its row "
                f"of {size} bytes with its key, with room to grow by {ROW_GROWTH}, is over "
                f"{self.takes} ({topic_takes(self.takes, self.topic)}): stored before the "
                "topic took less; deleted, it will not fire. Raise the topic's "
                "max.message.bytes, then set it again (its set event is in its owner's log)"
            )
            logger.error("%s[%d]: %s", self.topic, p, why)
            source = _Row(self.topic, p, handle.changelog_offset() or 0, key, value, now)
            letters.append(dead_letter(source, why, Stage.RESTORE, now, limit=limit))
        return letters
