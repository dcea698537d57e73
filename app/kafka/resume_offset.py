"""Where a group member reads a partition from when it takes it: the group's committed
offset, or the partition's start where none is committed. A committed offset below the
start means records were deleted (retention, DeleteRecords) before the group read them:
the read goes on from the start, as Kafka's `auto.offset.reset=earliest` would, but
loudly, never as if nothing was missed. No I/O; may import nothing of the project."""

from __future__ import annotations

import logging

__all__ = ["resume_offset"]

logger = logging.getLogger(__name__)


def resume_offset(topic: str, partition: int, committed: int | None, start: int) -> int:
    """The offset to read `topic`[`partition`] from, given the group's `committed` offset
    (None or negative: none) and the partition's first offset `start`."""
    if committed is None or committed < 0:
        return start
    if committed < start:
        logger.error(
            "%s[%d]: %d records were deleted before this group read them (committed "
            "offset %d, the partition now starts at %d): reading on from %d. What they "
            "held (events, commands) was never applied; a log the node folds must keep "
            "every record (retention.ms=-1)",
            topic,
            partition,
            start - committed,
            committed,
            start,
            start,
        )
        return start
    return committed
