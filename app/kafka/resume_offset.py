"""Where a group member reads a partition from when it takes it (`resume_offset`: the
group's committed offset, or the partition's start where none is committed), and when its
position fell out of the log while it ran (`read_on_offset`: a lagging or paused partition
whose records retention or DeleteRecords removed ahead of it). A position below the start
means records were deleted before the group read them: the read goes on from the start,
as Kafka's `auto.offset.reset=earliest` would, but loudly and counted
(`deleted_unread`), never as if nothing was missed. No I/O; may import nothing of the
project."""

from __future__ import annotations

import logging

__all__ = ["deleted_unread", "read_on_offset", "resume_offset"]

logger = logging.getLogger(__name__)


def deleted_unread(position: int | None, start: int) -> int:
    """How many records were deleted before a reader at `position` (None or negative: no
    position) read them, the partition now starting at `start`."""
    if position is None or position < 0:
        return 0
    return max(0, start - position)


def resume_offset(topic: str, partition: int, committed: int | None, start: int) -> int:
    """The offset to read `topic`[`partition`] from, given the group's `committed` offset
    (None or negative: none) and the partition's first offset `start`."""
    if committed is None or committed < 0:
        return start
    if committed < start:
        _said_deleted(topic, partition, f"committed offset {committed}", committed, start)
        return start
    return committed


def read_on_offset(topic: str, partition: int, position: int, start: int, end: int) -> int:
    """The offset to read `topic`[`partition`] on from, its reader's `position` found out of
    the log (its fetch refused: OFFSET_OUT_OF_RANGE), which now holds `start` to `end`.

    Below the start: records deleted unread, said; the start. Past the end: the log was cut
    back (an unclean leader election) or made again: said; the start, as Kafka's `earliest`
    reset reads it, every record read again rather than any missed. Within them: the
    position, fetched again, unsaid here (`app.kafka.in_log_refusals` says it, and follows
    a broker refusing it again and again)."""
    if position < start:
        _said_deleted(topic, partition, f"position {position}", position, start)
        return start
    if position > end:
        logger.error(
            "%s[%d]: the log ends at %d, before this group's position %d: it was cut back "
            "or deleted and made again. Reading it again from its start, %d",
            topic,
            partition,
            end,
            position,
            start,
        )
        return start
    return position


def _said_deleted(topic: str, partition: int, where: str, position: int, start: int) -> None:
    logger.error(
        "%s[%d]: %d records were deleted before this group read them (%s, the partition "
        "now starts at %d): reading on from %d. What they held (events, commands) was "
        "never applied; a log the node folds must keep every record (retention.ms=-1)",
        topic,
        partition,
        start - position,
        where,
        start,
        start,
    )
