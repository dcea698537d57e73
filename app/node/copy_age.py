"""Whether a clean local copy of a compacted changelog may still be read on from its offset,
by its age (`copy_usable`).

A copy is read on from the offset it applied through: what the changelog holds after it is
applied on top. Compaction drops a key's superseded records, and drops its tombstone once
the topic's `delete.retention.ms` passed (a day by default), without moving the log's first
offset. A copy last in step with the changelog longer ago than that may hold a row whose
later records all went: the FIRED update superseded by the retention sweep's tombstone, then
the tombstone itself. Nothing after the copy's offset mentions the key, and a timer that
fired on another node weeks ago is PENDING, due, in the copy (a whole restore holds no
row). So a copy is read on from only while its age is under the tombstones' retention less
a margin (`margin_ms`); an older one, or one whose age is not known, is restored whole.

The age is the node's wall clock now less the one its clean mark recorded (`CleanMarks`):
the same machine's clock at both ends, so a constant skew from the broker's clock cancels
out. A mark of a time after now (the clock moved back) or of none (written by an older
version) is of no known age: restored whole. A clock moved back by less than the copy's
age, or a broker cleaning late, is what the margin is for.

May import nothing of `app`: pure decisions, `app.node.partition_open`'s and the topic
watch's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

__all__ = [
    "CHANGELOG_DELETE_RETENTION_MS",
    "DELETE_RETENTION",
    "UNKNOWN_DELETE_RETENTION_MS",
    "copy_usable",
    "margin_ms",
    "tombstones_kept",
]

DELETE_RETENTION: Final = "delete.retention.ms"
"""The topic config that says how long compaction keeps a tombstone."""

CHANGELOG_DELETE_RETENTION_MS: Final = 86_400_000
"""`delete.retention.ms` a node creates a timer changelog with: Kafka's default (a day),
set explicitly so that a broker's lower `log.cleaner.delete.retention.ms` does not apply.
Changed on the topic (`kafka-configs --alter`), the node reads it again (at its start and
every minute)."""

UNKNOWN_DELETE_RETENTION_MS: Final = 3_600_000
"""What a node assumes of a changelog whose `delete.retention.ms` it could not read (no
DescribeConfigs ACL, the broker away at the start): an hour, far below Kafka's default,
so that only a copy of a short stop (a rolling restart) is read on from."""

MAX_MARGIN_MS: Final = 3_600_000
"""The most of the tombstones' retention kept back from a copy's age: an hour."""


def margin_ms(kept_ms: int) -> int:
    """How much younger than `kept_ms` (the tombstones' retention) a copy must be to be read
    on from: half of it, at most an hour (`MAX_MARGIN_MS`), for the clock moved back a
    little, the restore's own time and the cleaner's timing."""
    return min(max(kept_ms, 0) // 2, MAX_MARGIN_MS)


def copy_usable(in_step_at: int | None, now: int, kept_ms: int) -> bool:
    """Whether a clean copy last in step with its changelog at `in_step_at` (epoch ms, this
    node's clock; None: not known) may be read on from at `now`, its changelog keeping
    tombstones `kept_ms`: only when its age is known (not in the future) and under
    `kept_ms` less `margin_ms`."""
    if in_step_at is None or in_step_at > now:
        return False
    return now - in_step_at < kept_ms - margin_ms(kept_ms)


def tombstones_kept(configs: Mapping[str, str]) -> int | None:
    """A topic's `delete.retention.ms` as its configs read (None: not said, or no integer)."""
    text = configs.get(DELETE_RETENTION, "").strip()
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value >= 0 else None
