"""An owner's timers as an operator's view shows them: a bounded few, live ones first.

An owner may keep any number of rows (tens of thousands of a job's slots, or of a
producer's sets): a view of them holds and shows at most `limit`, the live ones (PENDING,
FIRING, PARKED, PAUSED) before the finished ones (FIRED, CANCELLED kept for the
retention), each in key order, and says how many there were in all. The rows are taken
one at a time (`OwnerPick.add`), so no more than `limit` of them are held while reading.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tables.timer import ACTIVE, Timer
from tables.tombstones import is_deletion_mark

__all__ = ["OwnerPick", "OwnerTimers"]


@dataclass(frozen=True)
class OwnerTimers:
    timers: list[Timer]
    """At most the pick's `limit`: the live ones first, then the finished, each by key."""
    total: int
    """The owner's timers read (its deletion mark is none)."""
    complete: bool = True
    """False: the read stopped after as many rows as it may read; the owner keeps more."""

    @property
    def cut(self) -> bool:
        """Whether some of the owner's timers are not in `timers`."""
        return not self.complete or self.total > len(self.timers)


@dataclass
class OwnerPick:
    """Takes an owner's rows in key order and keeps the first `limit` to show."""

    limit: int
    total: int = 0
    _live: list[Timer] = field(default_factory=list)
    _done: list[Timer] = field(default_factory=list)

    def add(self, timer: Timer) -> None:
        if is_deletion_mark(timer):  # no timer (`tables.tombstones`)
            return
        self.total += 1
        kept = self._live if timer.status in ACTIVE else self._done
        if len(kept) < self.limit:
            kept.append(timer)

    def result(self, *, complete: bool = True) -> OwnerTimers:
        shown = self._live + self._done[: self.limit - len(self._live)]
        return OwnerTimers(shown, self.total, complete)
