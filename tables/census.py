"""What a partition of a timer store holds, as the operator page shows it (`TimerStore.census`).

Read from the store's two indexes only: the due index (PENDING and FIRING rows, by due
time) and the parked index (PARKED rows, by target then due time). Finished rows (FIRED,
CANCELLED) are in neither and are not counted. The counting stops at a limit so that a
page load costs a bounded scan however large the partition grows; `complete` says
whether it stopped early (the counts are then lower bounds).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import islice

from pydantic import BaseModel, ConfigDict, Field

from tables.timer import Timer, TimerStatus

__all__ = ["TimerCensus", "tally"]


class TimerCensus(BaseModel):
    """One partition's active timers, counted by status, and what is due next."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    partition: int = Field(ge=0)
    pending: int = Field(ge=0)
    firing: int = Field(ge=0)
    parked: int = Field(ge=0)
    complete: bool = Field(description="False: a count reached the limit and stopped")
    oldest_overdue: int | None = Field(
        description="epoch ms: the earliest due time of a PENDING timer due at or before now"
    )
    next_due: int | None = Field(
        description="epoch ms: the earliest due time of a PENDING timer due after now"
    )
    parked_timers: tuple[Timer, ...] = Field(
        description="the first PARKED timers, by target then due time, up to parked_limit"
    )


DueEntries = Callable[[int], Iterable[tuple[int, str]]]
"""A partition's due index from a due time on: `(due_at, status)` in due order."""


def tally(
    partition: int,
    now: int,
    limit: int,
    parked_limit: int,
    due_from: DueEntries,
    parked: Iterable[Callable[[], Timer]],
) -> TimerCensus:
    """The census both backends answer: `due_from` and `parked` are their index scans
    (`parked` yields a loader per entry, so that only the listed ones are decoded)."""
    counts = {TimerStatus.PENDING.value: 0, TimerStatus.FIRING.value: 0}
    oldest: int | None = None
    upcoming: int | None = None
    complete = True
    for seen, (due_at, status) in enumerate(due_from(0)):
        if seen == limit:  # one entry more than the limit: the count stops here
            complete = False
            break
        counts[status] += 1
        if status == TimerStatus.PENDING.value:
            if due_at <= now:
                oldest = due_at if oldest is None else oldest
            elif upcoming is None:
                upcoming = due_at
    if upcoming is None and not complete:
        # The count stopped before the due index passed `now`: look past it directly.
        upcoming = next(
            (d for d, s in islice(due_from(now + 1), limit) if s == TimerStatus.PENDING.value),
            None,
        )
    parked_count = 0
    listed: list[Timer] = []
    for load in parked:
        if parked_count == limit:
            complete = False
            break
        parked_count += 1
        if len(listed) < parked_limit:
            listed.append(load())
    return TimerCensus(
        partition=partition,
        pending=counts[TimerStatus.PENDING.value],
        firing=counts[TimerStatus.FIRING.value],
        parked=parked_count,
        complete=complete,
        oldest_overdue=oldest,
        next_due=upcoming,
        parked_timers=tuple(listed),
    )
