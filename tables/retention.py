"""Which finished rows a store forgets: pure decisions, no clock, no I/O.

A FIRED or CANCELLED row stays as long as a replay of its schedule could still meet it:
while it is held, a replayed `ScheduleSet` of the same timer (its id) or of an older
version is refused (`tables.writes.put_row`). Past `retention` after it finished
(`tables.keys.finished_at`) it is deleted, in the store and, by a tombstone, in the
changelog, so that neither the disk nor a restore grows with every timer that ever fired.
"""

from __future__ import annotations

from collections.abc import Iterable

from tables.keys import finished_at
from tables.timer import Timer, TimerStatus
from tables.writes import Write

__all__ = ["FINISHED", "expired", "expiry_cutoff", "plan_expiry"]

FINISHED = frozenset({TimerStatus.FIRED, TimerStatus.CANCELLED})


def expiry_cutoff(now: int, retention: int) -> int:
    """The latest `finished_at` a row may have to be expired at `now` (may be negative)."""
    return now - retention


def expired(timer: Timer, now: int, retention: int) -> bool:
    """Whether `timer` is finished and has been for at least `retention` ms at `now`."""
    return timer.status in FINISHED and finished_at(
        timer.due_at, timer.slot_due_at
    ) <= expiry_cutoff(now, retention)


def plan_expiry(
    partition: int, rows: Iterable[tuple[bytes, Timer]], now: int, retention: int, limit: int
) -> list[Write]:
    """The deletes of at most `limit` of `(row key, row)`s that `expired` at `now`."""
    writes: list[Write] = []
    for row, timer in rows:
        if len(writes) >= limit:
            break
        if expired(timer, now, retention):
            writes.append(Write(partition, row, timer, None))
    return writes
