"""What a round of the runner did (`RoundStats`), as the loop and the metrics read it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from app.timers.runner.decision_types import Action, Decision

__all__ = ["RoundStats", "count"]


@dataclass
class RoundStats:
    """What one round did; `next_due` and `full` tell the loop when to run the next."""

    loaded: int = 0
    claimed: int = 0
    lost_claims: int = 0
    lapsed: int = 0
    """FIRING rows due again: a claim that lapsed (its send never settled, or a previous
    owner's), claimed again or expired."""
    expired: int = 0
    sent: int = 0
    fired: int = 0
    retried: int = 0
    busy: int = 0
    parked: int = 0
    released: int = 0
    swept: int = 0
    """Finished rows deleted past their retention (`TimerOptions.finished_retention`)."""
    ledger_failures: int = 0
    written: int = 0
    write_failures: int = 0
    """Outcome batches whose write raised something other than `StoreError` (which fails
    its partition): their claims lapse and are sent again. A round with any is a failed
    round to its loop (`TimerLoop.failing`; a node's partition is taken afresh after
    `FAILED_ROUNDS`), not one that passed while its timers never settle."""
    deferred: int = 0
    """Due, but not claimed: as many sends were in flight as may be (`max_in_flight`)."""
    full: bool = False
    next_due: int | None = None
    reload_at: int | None = None
    """When the wheel must be loaded again (it holds the rows due until then)."""

    def due_by(self, t: int | None) -> None:
        if t is not None:
            self.next_due = t if self.next_due is None else min(self.next_due, t)


def count(stats: RoundStats, decisions: Iterable[Decision]) -> None:
    """Counts the outcomes written, by what they did."""
    for d in decisions:
        match d.action:
            case Action.FIRE | Action.NEXT_SLOT:
                stats.fired += 1
            case Action.RETRY:
                stats.retried += 1
            case Action.BUSY:
                stats.busy += 1
            case Action.PARK:
                stats.parked += 1
            case Action.RELEASE:
                stats.released += 1
