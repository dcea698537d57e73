"""Timer rows a partition's changelog takes no more (`RowLimit`, one per aggregate type).

A timer is taken only if its row, with room to grow, fits what its `timers` changelog takes
(`app.timers.timer_sizes`). One stored before that topic's `max.message.bytes` was lowered
may not fit any more: its next row (a claim, a settle, a cancel) joined the partition's
transaction, the broker refused it at every retake, and every command and timer of the
partition waited behind it for good. What the changelog takes is the least of what the
node read at its start and what its topic catalog last read (`TopicCatalog.takes`, read
again every 30 s: a lowering while the node runs is seen within that, after which the
rows the broker refused meanwhile are refused here).

p's changelog sink refuses such a row before it joins the transaction (`check`), noting
its key, so the write fails as a store fault does and p is taken afresh. That take
dead-letters the row as the store holds it, whole, and deletes it (`letter_noted`): the
timer does not fire, the partition goes on. Its set event is still in its owner's log: an
operator raises the limit, then sets it again (or rebuilds the table). A row that fits
with room to grow by then (set again smaller since) is left as it is.

May import `app.errors`, `app.kafka`, `app.protocol`, `app.timers` and `tables`."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from app.errors import RecordTooLarge
from app.kafka import OutRecord, Record
from app.kafka.catalog import TopicCatalog, takes_at_most
from app.kafka.records import TOPIC_RECORD_BYTES, topic_takes
from app.protocol.dead_letters import Stage, dead_letter
from app.timers.timer_sizes import ROW_GROWTH
from tables.keys import encode_timer
from tables.partition_handle import PartitionHandle
from tables.store import ChangelogRecord

__all__ = ["RowLimit"]

logger = logging.getLogger(__name__)


class RowLimit:
    """What a type's timers changelog (`topic`) takes, a record's key and value together
    (`takes`: as `limits` say, `InputLimits.topic_record_bytes`, and `catalog`'s last
    read), and per partition the row keys its sink refused since its last take."""

    def __init__(
        self, topic: str, limits: Mapping[str, int], catalog: TopicCatalog | None = None
    ) -> None:
        self.topic = topic
        self._limits = limits
        self._catalog = catalog
        self._noted: dict[int, set[bytes]] = {}

    @property
    def takes(self) -> int:
        return takes_at_most(self.topic, self._limits, self._catalog)

    def __repr__(self) -> str:
        # Not `takes`: a repr starts no read of the topic's limit.
        return f"RowLimit({self.topic})"

    def noted(self, p: int) -> set[bytes]:
        """The row keys of p refused and not yet deleted by a take that committed."""
        return set(self._noted.get(p, ()))

    def over(self, key: bytes, value: bytes) -> bool:
        """Whether a row, with room to grow (`ROW_GROWTH`), is over what the changelog
        takes, when that is less than what a topic of the broker's defaults takes (one
        that takes that much or more holds any row the node takes: none is refused)."""
        takes = self.takes
        return takes < TOPIC_RECORD_BYTES and len(key) + len(value) + ROW_GROWTH > takes

    def note(self, p: int, key: bytes) -> None:
        """Has p's next take delete the row under `key` (`letter_noted`) if it is `over`."""
        self._noted.setdefault(p, set()).add(key)

    def check(self, p: int, records: Sequence[ChangelogRecord]) -> None:
        """`RecordTooLarge` for a write of p with a row over what the changelog takes (its
        keys noted for p's next take): nothing of the write joins p's transaction."""
        takes = self.takes
        if takes >= TOPIC_RECORD_BYTES:
            return  # as the broker's defaults or more: every row the node takes fits
        over = [r for r in records if r.value is not None and len(r.key) + len(r.value) > takes]
        if not over:
            return
        for r in over:
            self.note(p, r.key)
        size = max(len(r.key) + len(r.value or b"") for r in over)
        raise RecordTooLarge(
            f"{self.topic}[{p}]: a timer row of {size} bytes with its key, over "
            f"{takes} ({topic_takes(takes, self.topic)}): stored before the "
            "topic took less, it is dead-lettered and deleted at the partition's next take"
        )

    def landed(self, p: int, keys: Sequence[bytes]) -> None:
        """The take's transaction that deleted the rows under `keys` committed."""
        if (noted := self._noted.get(p)) is not None:
            noted.difference_update(keys)
            if not noted:
                del self._noted[p]

    async def letter_noted(
        self, handle: PartitionHandle, now: int, limit: int
    ) -> tuple[list[OutRecord], list[bytes]]:
        """At p's take (`handle`'s partition, its changelog sink attached): each row noted
        for p (`note`, `check`) deleted when it is still `over` (a tombstone joins p's
        transaction); their letters (`limit`: what the dead-letter topic takes), for the
        caller to stage in p's next transaction, and their keys, noted until that commits
        (`landed`): a take that fails before deletes them again. Those no longer over (set
        again smaller since, or gone) are forgotten."""
        p = handle.partition
        letters: list[OutRecord] = []
        deleted: list[bytes] = []
        if self._noted.get(p) and self._catalog is not None:
            # Read now, not 30 s ago: a limit raised since deletes nothing.
            await self._catalog.read_takes(self.topic)
        for key in sorted(self._noted.get(p, ())):
            held = handle.held(key)
            value = None if held is None else encode_timer(held)
            if held is None or value is None or not self.over(key, value):
                self.landed(p, [key])  # nothing to delete
                continue
            if await handle.drop(key) is None:
                continue
            takes, size = self.takes, len(key) + len(value)
            why = (
                f"timer {held.id} ({held.owner.id}, key {held.key!r}, {held.status}): its row "
                f"of {size} bytes with its key, with room to grow by {ROW_GROWTH}, is over "
                f"{takes} ({topic_takes(takes, self.topic)}): stored before the topic took "
                "less; deleted, nothing of it fires from now on (a recurring timer's later "
                "slots included; a command it sent before stays sent). Raise the topic's "
                "max.message.bytes, then set it again (its set event is in its owner's log)"
            )
            logger.error("%s[%d]: %s", self.topic, p, why)
            # Its letter's source: the row as its changelog holds it, at the offset the
            # copy has applied through (written there or before).
            source = Record(self.topic, p, handle.changelog_offset() or 0, key, value, now)
            letters.append(dead_letter(source, why, Stage.RESTORE, now, limit=limit))
            deleted.append(key)
        return letters, deleted
