"""`PartitionFiring`: what the runner keeps of one partition whose timers it fires, from
`start_partition` to `stop_partition`. Its wheel, which of its timers fire in-process
(`InProcessTargets`) and those claimed to, waiting for its cycle to ask for them, its
sends in flight and their outcomes not written yet, whether it was just started (a
previous owner's claims taken over), and its BUSY counts. Nothing in it is shared with
another partition: a partition's stop drops it whole."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from app.timers.runner.decisions import Decision, SendResult, guarded, on_outcome
from app.timers.runner.options import TimerOptions
from app.timers.runner.wheel import Wheel
from tables.partitioner import partition_of
from tables.timer import Timer, TimerStatus

__all__ = ["InProcessTargets", "PartitionFiring", "offer_to"]


@dataclass(frozen=True)
class InProcessTargets:
    """The targets a node decides itself in a partition whose commands it decides: the
    aggregates of this type (`context`, `aggregate`) that live in the timer's own partition
    (its owner, by default). Their timers fire in the partition's own cycle, in its
    transaction, rather than round trip through the command topic."""

    context: str
    aggregate: str
    partitions: int

    def accepts(self, timer: Timer) -> bool:
        target = timer.target
        if target.context != self.context or target.aggregate != self.aggregate:
            return False
        return target == timer.owner or partition_of(target.id, self.partitions) == timer.partition


class PartitionFiring:
    """One partition's firing state (the runner's, per partition it fires)."""

    def __init__(
        self, partition: int, wheel: Wheel, in_process: InProcessTargets | None = None
    ) -> None:
        self.partition = partition
        self.wheel = wheel
        # None: every timer of it is sent (its commands are not decided here).
        self.in_process = in_process
        # Started since the last round: its FIRING rows are a previous owner's claims (or
        # cut short here), sent again at once rather than at their lapse.
        self.fresh = True
        # Timers handed over to fire in-process, by id: the row as loaded, which their
        # outcome's conditional write is made against.
        self.in_hand: dict[str, Timer] = {}
        # Of those, the claims its cycle has not asked for yet (`take_handed`).
        self.handed: list[Timer] = []
        self.in_flight: set[asyncio.Task[Decision]] = set()
        # Outcomes decided but not written yet, so that its stop can write them before the
        # hand-off without waiting for the round.
        self.outcomes: list[Decision] = []
        # BUSY refusals in a row, by timer id: this node's memory only.
        self.busy: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"PartitionFiring({self.partition})"

    def fires_in_process(self, timer: Timer) -> bool:
        return self.in_process is not None and self.in_process.accepts(timer)

    def hand(self, loaded: Timer, claimed: Timer) -> None:
        """Keeps `claimed` (the claim of `loaded`, not written) for its cycle to fire."""
        self.in_hand[claimed.id] = loaded
        self.handed.append(claimed)

    def take_handed(self) -> list[Timer]:
        taken, self.handed = self.handed, []
        return taken

    def offer(self, timers: Iterable[Timer]) -> None:
        """Puts its rows just written (PENDING) in its wheel, when they fall within it."""
        self.wheel.offer(timers, {self.partition})

    def backlog(self, now: int) -> dict[str, int]:
        """Due by `now` and neither sent nor fired yet, by id: its wheel's rows due and its
        timers handed over to fire in-process (as loaded, before the claim)."""
        due = self.wheel.due(now, {self.partition})
        due |= {t.id: t.due_at for t in self.in_hand.values()}
        return due

    def take_outcomes(self) -> list[Decision]:
        taken, self.outcomes = self.outcomes, []
        return taken

    def decide(
        self, claimed: Timer, result: SendResult, now: int, options: TimerOptions
    ) -> Decision:
        """What `claimed` becomes on `result`, its BUSY refusals in a row counted."""
        busy = self.busy.get(claimed.id, 0)
        return guarded(
            functools.partial(on_outcome, claimed, result, now, options, busy), claimed, now
        )

    def count_busy(self, decisions: Iterable[Decision]) -> None:
        # Kept only for a timer still in the wheel: a parked one starts over if retried, and
        # one the ledger refused to park keeps counting, as it was sent.
        for d in decisions:
            if d.change is None:
                continue
            timer = d.change.next
            if d.busy_in_a_row and timer.status is TimerStatus.PENDING:
                self.busy[timer.id] = d.busy_in_a_row
            else:
                self.busy.pop(timer.id, None)

    async def cut_short(self) -> int:
        """Cancels its sends in flight (their claims given back, or results already in
        kept) and waits for them; how many there were."""
        tasks = list(self.in_flight)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        return len(tasks)


def offer_to(firings: Mapping[int, PartitionFiring], timers: Iterable[Timer]) -> None:
    """Puts rows just written (PENDING) in their partitions' wheels, when they fall within
    them (a partition not fired here: nowhere)."""
    for t in timers:
        if (f := firings.get(t.partition)) is not None:
            f.offer((t,))
