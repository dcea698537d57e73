"""A partition whose fetches a broker refuses as out of range at a position its log holds
(start <= position <= end). A leader just elected whose high watermark has not caught up
refuses a few, for a moment, and the same fetch then passes. One refused again and again at
the same position is a broker that never will serve it (its bug, an unclean leader
election mid-way, a follower left behind the high watermark): fetched again for ever, that
partition stops while the rest go on, and the node says it is ready.

`InLogRefusals` follows them per partition (`refusal` decides): the first at a position
is said at INFO, the repeats at most one WARNING per `SAY_EVERY_S`, and past `STUCK_S` and
`STUCK_REFUSALS` the poll raises `FetchRefused`, which stops the node loudly
(`app.node.polling`), as polls failing for good do. Anything that moves the partition (its
reading past the position, a seek, a new assignment: `moves` changed) starts over, and so
does a refusal more than `GAP_S` after the one before: the fetches between passed (an idle
partition's position stays where it is), or the partition was paused, so a leader change
hours later is a first refusal again, not the end of a minute of them. No I/O; may import
`app.errors`."""

from __future__ import annotations

import enum
import logging
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Final

from app.errors import KafkaUnavailable

__all__ = [
    "GAP_S",
    "SAY_EVERY_S",
    "STUCK_REFUSALS",
    "STUCK_S",
    "FetchRefused",
    "InLogRefusals",
    "Refusals",
    "Verdict",
    "refusal",
]

logger = logging.getLogger(__name__)

STUCK_S: Final = 60.0
"""How long one position may be refused: a leader elected from the in-sync replicas
refuses only until its high watermark catches up, which its slowest in-sync follower holds
back at most `replica.lag.time.max.ms` (30 s by default) before it is dropped from them.
As `app.kafka.ports.POLL_FAILING_S`: a broker in flux passes well within it."""
STUCK_REFUSALS: Final = 10
"""And at least this many refusals: the time alone would count a partition paused in
between (its worker's queue full) as refused all along. A stuck one is fetched again after
each (aiokafka's retry backoff, 0.1 s): hundreds a minute."""
GAP_S: Final = 10.0
"""A refusal this long after the one before starts the count over: a stuck partition is
refused many times a second; one refused, then served (or paused), is not stuck."""
SAY_EVERY_S: Final = 10.0
"""The repeats at one position are said at most this often (a burst within it: one INFO)."""


class FetchRefused(KafkaUnavailable):
    """A partition's fetches refused at a position its log holds, past `STUCK_S`: no poll
    again reads it, and the node must not go on as if it did."""


class Verdict(enum.Enum):
    FIRST = "first"
    """The first refusal at this position (since it last moved): said at INFO."""
    QUIET = "quiet"
    """A repeat, counted, not said."""
    SAY = "say"
    """A repeat said (WARNING): the first in `SAY_EVERY_S`."""
    STUCK = "stuck"
    """Refused too long, too often: `FetchRefused`."""


@dataclass(frozen=True, slots=True)
class Refusals:
    """A partition's fetches refused at `position`, nothing having moved it since (its
    owner's count of moves was `moves`): the first at `first`, `count` in all, the last
    said at `said`, the last at `last` (clock seconds)."""

    position: int
    moves: int
    first: float
    count: int
    said: float
    last: float


def refusal(
    last: Refusals | None, position: int, moves: int, now: float
) -> tuple[Refusals, Verdict]:
    """A partition refused at `position` at `now`, its owner's count of its moves `moves`,
    after `last`: its refusals now, and what is done."""
    if (
        last is None
        or last.position != position
        or last.moves != moves
        or now < last.last  # a clock gone back: never stuck by it
        or now - last.last > GAP_S  # served (or paused) in between: not refused all along
    ):
        return Refusals(position, moves, now, 1, now, now), Verdict.FIRST
    counted = replace(last, count=last.count + 1, last=now)
    if counted.count >= STUCK_REFUSALS and now - counted.first >= STUCK_S:
        return counted, Verdict.STUCK
    if now - last.said >= SAY_EVERY_S:
        return replace(counted, said=now), Verdict.SAY
    return counted, Verdict.QUIET


class InLogRefusals:
    """Per partition, its fetches refused at a position its log holds. One thread's."""

    def __init__(self) -> None:
        self._of: dict[tuple[str, int], Refusals] = {}

    def refused(
        self,
        topic: str,
        partition: int,
        position: int,
        start: int,
        end: int,
        *,
        moves: int,
        now: float,
    ) -> FetchRefused | None:
        """`topic`[`partition`]'s fetch at `position` was refused, its log holding `start`
        to `end`; `moves`: how many times its owner moved it (sought it, was given it) so
        far. Said as `refusal` decides; the error to raise once it is stuck."""
        key = (topic, partition)
        self._of[key], verdict = refusal(self._of.get(key), position, moves, now)
        count, spent = self._of[key].count, now - self._of[key].first
        where = f"{topic}[{partition}]: a fetch at {position} was refused as out of the log"
        if verdict is Verdict.FIRST:
            logger.info(
                "%s, which holds %d to %d (a leader not caught up yet): fetched again",
                where,
                start,
                end,
            )
        elif verdict is Verdict.SAY:
            logger.warning(
                "%s %d times in %.0f s, though it holds %d to %d: longer than a leader "
                "catching up mostly takes (or a broker fault, an unclean leader election, a "
                "follower behind the high watermark). Fetched again; the node stops if it "
                "lasts %.0f s",
                where,
                count,
                spent,
                start,
                end,
                STUCK_S,
            )
        elif verdict is Verdict.STUCK:
            return FetchRefused(
                f"{where} {count} times in {spent:.0f} s, though it holds {start} to {end}: "
                "the partition's records are read no further here. Look at its leader and "
                "replicas (kafka-topics --describe); a restart fetches its metadata afresh, "
                "or another worker takes it"
            )
        return None

    def keep(self, partitions: Collection[tuple[str, int]]) -> None:
        """Forgets the partitions not among `partitions` (no longer assigned)."""
        for key in [k for k in self._of if k not in partitions]:
            del self._of[key]
