"""What a node holds of the `<context>.nodes` topics: each key's newest report (#22).

Pure (no I/O): `app.ops.cluster_status` feeds it the records it reads and writes. What it
holds is bounded: `MAX_REPORT_BYTES` per record, `MAX_HELD_KEYS` keys and `MAX_HELD_ROWS`
rows across them (a report is held decoded, many times its bytes), only the group's
reports, none past `FORGET_MS`. And, for every key whose newest record is a report of any
group, when that report was written: the keys `silent` past `PURGE_MS`, whose node is gone
without its tombstone, are the ones the live nodes delete (`ClusterStatus.purge`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from app.node.partition_count import KEY_PREFIX
from app.ops.node_report import (
    MAX_HELD_ROWS,
    NodeReport,
    decode_report,
    from_the_future,
    held_rows,
)

__all__ = ["FORGET_MS", "MAX_HELD_KEYS", "MAX_HELD_ROWS", "PURGE_MS", "StatusView"]

logger = logging.getLogger(__name__)

FORGET_MS: Final = 3_600_000
"""A report older than an hour is left out altogether (a node that died without its
tombstone; the compacted topic keeps its last record)."""

PURGE_MS: Final = 24 * FORGET_MS
"""A key whose newest report is older than a day is tombstoned by the live nodes that read
it: a node that died without its tombstone (killed, its pod gone; a new pod may be a new
node id) would otherwise stay in the compacted topic, and be read by every node's start,
for ever. Far past `FORGET_MS` (no page shows it any more), so that only a node silent for
a day, or with its clock that far behind the reader's, is deleted; one that writes again
is back with its next report."""

MAX_HELD_KEYS: Final = 10_000
"""Status records a node holds at most (one per key of the topics): past it the oldest
written is dropped, counted and logged, so another producer's flood of keys is bounded
(with `MAX_REPORT_BYTES` each)."""


class StatusView:
    """The reports read so far, per node: the newest by offset. No I/O."""

    def __init__(self, group: str, partitions: int, clock: Callable[[], int] | None = None) -> None:
        self._group = group
        self._partitions = partitions
        self._clock = clock
        # Per key: its newest record's offset, its report, and what it counts (`held_rows`).
        self._held: dict[tuple[str, bytes], tuple[int, NodeReport, int]] = {}
        # Per key whose newest record is a report of any group: its offset, its time, and
        # this node's clock when it was read (None without a clock), the oldest written
        # first (bounded as `_held`): what `silent` picks from.
        self._heard: dict[tuple[str, bytes], tuple[int, int, int | None]] = {}
        self._applied = 0
        self.max_keys = MAX_HELD_KEYS
        self.max_rows = MAX_HELD_ROWS
        self.rows = 0
        """What the reports held count against `max_rows` (`held_rows`)."""
        self.dropped = 0
        self.bad = 0
        self.on_bad: Callable[[], None] | None = None

    def apply(self, topic: str, key: bytes | None, offset: int, value: bytes | None) -> bool:
        """Takes a record of `topic`; a bad one is counted and skipped."""
        if key is not None and key.startswith(KEY_PREFIX):
            return False  # a type's partition count (`app.node.partition_count`): no report
        try:
            report = decode_report(key, value)
            if report is not None and any(
                r.partition >= self._partitions for r in report.partitions
            ):
                raise ValueError(f"a partition past the group's {self._partitions}")
            if (
                report is not None
                and self._clock is not None
                and from_the_future(report, self._clock())
            ):
                raise ValueError(f"dated {report.at}, ahead of this node's clock")
        except ValueError as exc:
            if key:  # the key's newest record is none of a node's: not `silent`'s to delete
                self._hear(topic, key, offset, None)
            self.bad += 1
            if self.on_bad is not None:
                self.on_bad()
            if self.bad == 1 or self.bad % 100 == 0:  # another team's producer: not a flood
                logger.warning("skipping status record @%d of %s: %s", offset, topic, exc)
            return False
        assert key is not None
        held = self._held.get((topic, key))
        if held is not None and held[0] >= offset:
            return False
        self._hear(topic, key, offset, report)
        # Held in the order written (the oldest first), and only what a page shows: a
        # tombstone or another group's report lets its key go. (A record read again from
        # before it, as `start` and the follower overlap, holds it until it is read again.)
        self._let_go((topic, key))
        if report is not None and report.group == self._group:
            counted = held_rows(report, len(value or b""))
            self._held[(topic, key)] = (offset, report, counted)
            self.rows += counted
            while len(self._held) > self.max_keys or self.rows > self.max_rows:
                self._let_go(next(iter(self._held)))
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 100 == 0:
                    logger.warning(
                        "%d status record(s) dropped: past %d keys or %d rows",
                        self.dropped,
                        self.max_keys,
                        self.max_rows,
                    )
        if self._clock is not None and self._applied % 100 == 0:
            self.sweep(self._clock())
        self._applied += 1
        return True

    def _let_go(self, k: tuple[str, bytes]) -> None:
        held = self._held.pop(k, None)
        if held is not None:
            self.rows -= held[2]

    def _hear(self, topic: str, key: bytes, offset: int, report: NodeReport | None) -> None:
        heard = self._heard.get((topic, key))
        if heard is not None and heard[0] >= offset:
            return  # read again (`start` and the follower overlap): the newer one holds
        self._heard.pop((topic, key), None)
        if report is not None:
            read_at = None if self._clock is None else self._clock()
            self._heard[(topic, key)] = (offset, report.at, read_at)
            while len(self._heard) > self.max_keys:
                self._heard.pop(next(iter(self._heard)))

    def silent(self, now: int) -> list[tuple[str, bytes]]:
        """The (topic, key)s whose newest record is a report, of any group, written more
        than `PURGE_MS` before `now`, and read here more than `FORGET_MS` ago: nodes gone
        without their tombstones. Both: a reader whose clock runs a day ahead of the
        others' finds every live node's report a day old (its time is its writer's clock),
        but never one it read an hour ago (a live node reports every few seconds, and the
        moment it was read is this reader's own clock); so a node that just started
        purges nothing for its first hour."""
        return [
            k
            for k, (_, at, read_at) in self._heard.items()
            if now - at > PURGE_MS and (read_at is None or now - read_at > FORGET_MS)
        ]

    def sweep(self, now: int) -> None:
        """Lets the reports past `FORGET_MS` go: never shown again unless rewritten."""
        for k in [k for k, (_, r, _) in self._held.items() if now - r.at > FORGET_MS]:
            self._let_go(k)

    def reports(self, now: int) -> list[NodeReport]:
        """The group's reports not yet forgotten, newest first."""
        found = [
            r
            for _, r, _ in self._held.values()
            if r.group == self._group
            and now - r.at <= FORGET_MS
            and not from_the_future(r, now)  # held before this node's clock went back
        ]
        return sorted(found, key=lambda r: (-r.at, r.node))
