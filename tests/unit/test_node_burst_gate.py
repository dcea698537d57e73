"""A node's timer loop lets a burst's slice grow (`slow_start`) only once the first of
its commits landed (#20): until then its rounds stay small, so that the round trips of
the first transactions, which fire the burst's first timers, wait behind small turns."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, cast

from fakes_node import FakeClock

from app.node.commits import Commits
from app.node.cycles import PartitionCycles
from app.node.in_process import NodeTimerLoop
from app.timers.runner import Round, RoundStats, TimerOptions, TimerRunner
from app.timers.runner.slow_start import HELD_AT_MOST_MS


class BurstRunner:
    """A runner whose rounds hand timers to partitions 0 and 1 while `due` rounds are
    left of a burst; it notes whether each round was let grow."""

    def __init__(self) -> None:
        self.clock = FakeClock(0)
        self.options = TimerOptions()
        self.answered = asyncio.Event()
        self.bursting = False
        self.due = 0
        self.grows: list[bool] = []

    @contextlib.asynccontextmanager
    async def round(self, *, grow: bool = True) -> AsyncIterator[Round]:
        self.grows.append(grow)
        r = Round(RoundStats(), 0, frozenset({0, 1}))
        if self.due:
            self.due -= 1
            r.in_process = frozenset({0, 1})
        self.bursting = self.due > 0
        yield r


class FakeCommits:
    """The commits of partitions 0 and 1 that landed, as the loop reads them."""

    def __init__(self) -> None:
        self.landed_of: dict[int, int] = {0: 0, 1: 0}

    def landed(self, kept: object, p: int) -> int:
        return self.landed_of[p]


class Cycles:
    def __init__(self) -> None:
        self.fired: list[int] = []

    def fire_local(self, type_name: str, p: int) -> None:
        self.fired.append(p)


def gated() -> tuple[BurstRunner, FakeCommits, Cycles, NodeTimerLoop]:
    """A node's timer loop over a burst runner, its commits and its cycles."""
    runner, commits, cycles = BurstRunner(), FakeCommits(), Cycles()
    loop = NodeTimerLoop(
        cast(TimerRunner, runner),
        type_name="order",
        types=cast(Any, {"order": object()}),
        commits=cast(Commits, commits),
        cycles=cast(PartitionCycles, cycles),
        running={},
    )
    return runner, commits, cycles, loop


async def test_a_burst_grows_once_its_first_commit_landed() -> None:
    runner, commits, cycles, loop = gated()
    runner.due = 6
    commits.landed_of[1] = 4  # commits of p1 before the burst: not the burst's
    await loop.round()  # the burst begins: its first slice, whatever `grow` says
    assert runner.bursting and cycles.fired == [0, 1]
    await loop.round()
    await loop.round()
    assert runner.grows == [True, False, False], "held while none of its commits landed"
    # p0's first commit lands between two rounds (never seen in flight): it counts.
    commits.landed_of[0] += 1
    await loop.round()
    assert runner.grows[-1] is True
    await loop.round()
    await loop.round()
    assert runner.grows[-1] is True and not runner.bursting
    # A later burst is held again until one of its own commits lands.
    runner.due = 3
    await loop.round()
    await loop.round()
    assert runner.grows[-2:] == [True, False], "no commit landed since this burst began"
    commits.landed_of[1] += 1
    await loop.round()
    assert runner.grows[-1] is True


async def test_a_burst_whose_first_commit_is_slow_grows_after_a_few_rounds_held() -> None:
    runner, _, _, loop = gated()
    # No commit of the burst lands.
    runner.due = 8
    runner.clock.set(1_000)
    await loop.round()  # the burst begins at 1,000
    for _ in range(3):
        runner.clock.advance(HELD_AT_MOST_MS // 3 - 1)
        await loop.round()
    runner.clock.advance(3)
    await loop.round()
    await loop.round()
    assert runner.grows == [True, False, False, False, True, True]
