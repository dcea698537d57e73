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
    def __init__(self) -> None:
        self.commits: dict[int, asyncio.Future[bool]] = {}

    def running(self, kept: object, p: int) -> asyncio.Future[bool] | None:
        commit = self.commits.get(p)
        return None if commit is None or commit.done() else commit


class Cycles:
    def __init__(self) -> None:
        self.fired: list[int] = []

    def fire_local(self, type_name: str, p: int) -> None:
        self.fired.append(p)


async def test_a_burst_grows_once_its_first_commit_landed() -> None:
    runner, commits, cycles = BurstRunner(), FakeCommits(), Cycles()
    loop = NodeTimerLoop(
        cast(TimerRunner, runner),
        type_name="order",
        types=cast(Any, {"order": object()}),
        commits=cast(Commits, commits),
        cycles=cast(PartitionCycles, cycles),
    )
    runner.due = 6
    await loop.round()  # the burst begins: its first slice, whatever `grow` says
    assert runner.bursting and cycles.fired == [0, 1]
    await loop.round()  # its cycles have not staged yet: nothing in flight, held
    first = commits.commits[0] = asyncio.get_running_loop().create_future()
    await loop.round()
    await loop.round()
    assert runner.grows == [True, False, False, False], "held while the first commit goes"
    # p0's commit lands; p1's starts only now (not its first, for the loop, any more).
    first.set_result(True)
    commits.commits[1] = asyncio.get_running_loop().create_future()
    await loop.round()
    assert runner.grows[-1] is True
    await loop.round()
    assert runner.grows[-1] is True and not runner.bursting
    # A later burst is held again until one of its own commits lands.
    runner.due = 3
    await loop.round()
    await loop.round()
    assert runner.grows[-2:] == [True, False], "p1's commit, seen in flight, has not landed"
    commits.commits[1].set_result(True)
    await loop.round()
    assert runner.grows[-1] is True


async def test_a_burst_whose_first_commit_is_slow_grows_after_a_few_rounds_held() -> None:
    runner, commits, cycles = BurstRunner(), FakeCommits(), Cycles()
    loop = NodeTimerLoop(
        cast(TimerRunner, runner),
        type_name="order",
        types=cast(Any, {"order": object()}),
        commits=cast(Commits, commits),
        cycles=cast(PartitionCycles, cycles),
    )
    commits.commits[0] = asyncio.get_running_loop().create_future()  # never lands
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
