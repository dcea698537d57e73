"""A partition's timer loop lets its burst's slice grow (`slow_start`) only once the first
of the burst's commits of that partition landed (#20): until then its rounds stay small,
so that the round trips of the first transactions, which fire the burst's first timers,
wait behind small turns; and while that first commit is in flight it takes no slice at
all. Each partition's burst is its own (#19)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import pytest
from fakes_node import FakeClock

from app.node import partition_timers
from app.node.commits import Commits
from app.node.cycles import PartitionCycles
from app.node.partition_timers import PartitionTimerLoop, TypeLoops
from app.node.task_id import TaskId
from app.timers.runner import PartitionFiring, Round, RoundStats, TimerOptions, TimerRunner
from app.timers.runner.slow_start import HELD_AT_MOST_MS
from app.timers.runner.wheel import Wheel
from tables import DueRow


async def _no_rows(partitions: set[int], until: int, limit: int) -> list[DueRow]:
    return []


def firing_of(p: int) -> PartitionFiring:
    return PartitionFiring(p, Wheel(_no_rows, 100, 1000))


class BurstRunner:
    """A runner whose rounds of a partition hand timers to it while `due` rounds are left
    of its burst; it notes whether each round was let grow."""

    def __init__(self, firings: dict[int, PartitionFiring]) -> None:
        self.clock = FakeClock(0)
        self.options = TimerOptions()
        self.answered = asyncio.Event()
        self.firings = firings
        self.due = dict.fromkeys(firings, 0)
        self.grows: dict[int, list[bool]] = {p: [] for p in firings}
        # Called within each round, as its claims are written (a cycle running meanwhile).
        self.during: Callable[[], None] | None = None

    def firing_of(self, p: int) -> PartitionFiring | None:
        return self.firings.get(p)

    @contextlib.asynccontextmanager
    async def partition_round(
        self, p: int, *, grow: bool = True, of: PartitionFiring | None = None
    ) -> AsyncIterator[Round]:
        assert of is self.firings[p]
        self.grows[p].append(grow)
        r = Round(RoundStats(), 0, frozenset({p}))
        if self.due[p]:
            self.due[p] -= 1
            r.in_process = frozenset({p})
        of.rounds.burst = 32 if self.due[p] > 0 else None
        if self.during is not None:
            self.during()
        yield r


class FakeCommits:
    """The commits of each partition that landed, and the one in flight, as the loop reads
    them."""

    def __init__(self) -> None:
        self.landed_of: dict[int, int] = {0: 0, 1: 0}
        self.in_flight: dict[int, asyncio.Future[bool]] = {}

    def landed(self, kept: object, p: int) -> int:
        return self.landed_of[p]

    def running(self, kept: object, p: int) -> asyncio.Future[bool] | None:
        commit = self.in_flight.get(p)
        return None if commit is None or commit.done() else commit

    def land(self, p: int) -> None:
        """p's commit in flight lands: counted, then done (as `PartitionCommits._send`)."""
        self.landed_of[p] += 1
        self.in_flight[p].set_result(True)


class Cycles:
    def __init__(self) -> None:
        self.fired: list[int] = []

    def fire_local(self, type_name: str, p: int) -> None:
        self.fired.append(p)


class Task:
    def __init__(self, firing: PartitionFiring) -> None:
        self.firing = firing

    def failed(self, what: str, exc: BaseException) -> None:
        raise AssertionError(f"{what}: {exc}")

    def worked(self, what: str) -> None:
        pass


def gated() -> tuple[BurstRunner, FakeCommits, Cycles, dict[int, PartitionTimerLoop]]:
    """The timer loops of partitions 0 and 1 over a burst runner, their commits and cycles."""
    firings = {p: firing_of(p) for p in (0, 1)}
    runner, commits, cycles = BurstRunner(firings), FakeCommits(), Cycles()
    tasks = {p: Task(f) for p, f in firings.items()}
    shared = TypeLoops(
        cast(TimerRunner, runner),
        type_name="order",
        types=cast(Any, {"order": object()}),
        commits=cast(Commits, commits),
        cycles=cast(PartitionCycles, cycles),
        running={TaskId("order", p): task for p, task in tasks.items()},
    )
    loops = {p: PartitionTimerLoop(shared, firing, tasks[p]) for p, firing in firings.items()}
    return runner, commits, cycles, loops


async def test_a_burst_grows_once_its_first_commit_landed() -> None:
    runner, commits, cycles, loops = gated()
    loop = loops[0]
    runner.due[0] = 6
    commits.landed_of[0] = 4  # commits of p0 before the burst: not the burst's
    await loop.round()  # the burst begins: its first slice, whatever `grow` says
    assert runner.firings[0].rounds.bursting and cycles.fired == [0]
    await loop.round()
    await loop.round()
    assert runner.grows[0] == [True, False, False], "held while none of its commits landed"
    commits.landed_of[1] += 1
    await loop.round()
    assert runner.grows[0][-1] is False, "another partition's commit is not its burst's"
    # p0's first commit lands between two rounds (never seen in flight): it counts.
    commits.landed_of[0] += 1
    await loop.round()
    assert runner.grows[0][-1] is True
    await loop.round()
    assert runner.grows[0][-1] is True and not runner.firings[0].rounds.bursting
    # A later burst is held again until one of its own commits lands.
    runner.due[0] = 3
    await loop.round()
    await loop.round()
    assert runner.grows[0][-2:] == [True, False], "no commit landed since this burst began"
    commits.landed_of[0] += 1
    await loop.round()
    assert runner.grows[0][-1] is True


async def test_a_burst_in_one_partition_never_holds_anothers_slice() -> None:
    runner, _, cycles, loops = gated()
    runner.due[0] = 6
    await loops[0].round()
    await loops[0].round()
    assert runner.grows[0] == [True, False], "p0's burst is held"
    runner.due[1] = 1  # p1's timers: fewer than a round takes, no burst of its own
    await loops[1].round()
    await loops[1].round()
    assert runner.grows[1] == [True, True] and cycles.fired == [0, 0, 1]


async def test_a_burst_whose_first_commit_is_slow_grows_after_a_few_rounds_held() -> None:
    runner, _, _, loops = gated()
    loop = loops[0]
    # No commit of the burst lands.
    runner.due[0] = 8
    runner.clock.set(1_000)
    await loop.round()  # the burst begins at 1,000
    for _ in range(3):
        runner.clock.advance(HELD_AT_MOST_MS // 3 - 1)
        await loop.round()
    runner.clock.advance(3)
    await loop.round()
    await loop.round()
    assert runner.grows[0] == [True, False, False, False, True, True]


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


LONG_HOLD_MS = 60_000

QUICK_S = 5.0
"""Far under `LONG_HOLD_MS` and far over any stall of a loaded machine: a round that ends
within it was not held for its time."""


@pytest.fixture
def long_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hold's bound far beyond any stall of a loaded machine: what ends a hold in these
    tests is the commit (or the clock's time), never a wait for its bound."""
    monkeypatch.setattr(partition_timers, "HELD_AT_MOST_MS", LONG_HOLD_MS)


def pending() -> asyncio.Future[bool]:
    return asyncio.get_running_loop().create_future()


@pytest.mark.usefixtures("long_hold")
async def test_a_burst_takes_no_slice_while_its_first_commit_is_in_flight() -> None:
    runner, commits, cycles, loops = gated()
    runner.due[0] = 6
    runner.due[1] = 6
    await loops[0].round()  # p0's burst begins: its first slice, fired in-process
    await loops[1].round()
    commits.in_flight[0] = pending()  # the commit of that slice goes
    commits.in_flight[1] = pending()  # another partition's: never holds p0
    held = asyncio.create_task(loops[0].round())
    await settle()
    assert not held.done() and runner.grows[0] == [True], "no round while it is in flight"
    commits.land(0)
    await asyncio.wait_for(held, QUICK_S)
    assert runner.grows[0] == [True, True], "its commit landed: the round goes on, grown"
    assert cycles.fired == [0, 1, 0]
    # Once one of its commits landed, a commit in flight holds no round of this burst.
    commits.in_flight[0] = pending()
    await asyncio.wait_for(loops[0].round(), QUICK_S)


@pytest.mark.usefixtures("long_hold")
async def test_a_commit_of_earlier_work_in_flight_is_not_the_bursts_first() -> None:
    runner, commits, _, loops = gated()
    commits.in_flight[0] = pending()  # p0's steady work, committing
    runner.due[0] = 6
    await loops[0].round()  # the burst begins while it is in flight
    held = asyncio.create_task(loops[0].round())
    await settle()
    assert not held.done(), "the burst's first commit starts only after it"
    commits.land(0)
    commits.in_flight[0] = pending()  # now the burst's own
    await settle()
    assert not held.done(), "the earlier commit landing is not the burst's"
    commits.land(0)
    await asyncio.wait_for(held, QUICK_S)
    assert runner.grows[0] == [True, True], "its own commit landed: it grows"


async def held_round() -> tuple[BurstRunner, FakeCommits, PartitionTimerLoop, asyncio.Task[Any]]:
    """p0's burst begun, its first commit in flight (not landing), its next round held."""
    runner, commits, _, loops = gated()
    runner.due[0] = 6
    await loops[0].round()
    commits.in_flight[0] = pending()
    held = asyncio.create_task(loops[0].round())
    await settle()
    assert not held.done()
    return runner, commits, loops[0], held


@pytest.mark.usefixtures("long_hold")
async def test_a_loop_ended_while_held_takes_no_round() -> None:
    runner, commits, loop, held = await held_round()
    loop.end()  # its task closes while it waits
    commits.land(0)
    await asyncio.wait_for(held, QUICK_S)
    assert runner.grows[0] == [True], "no slice claimed for a closing task"


@pytest.mark.usefixtures("long_hold")
async def test_ending_a_held_loop_ends_its_hold_at_once() -> None:
    """Its task's close does not wait out the hold for a commit that may never land."""
    runner, commits, loop, held = await held_round()
    loop.end()
    await asyncio.wait_for(held, QUICK_S)
    assert runner.grows[0] == [True], "no slice claimed for a closing task"
    assert not commits.in_flight[0].done()


@pytest.mark.usefixtures("long_hold")
async def test_stopping_a_held_loop_ends_its_hold_at_once() -> None:
    """The node's stop does not wait out the hold either; a loop started again holds as
    a new one."""
    runner, _, loop, held = await held_round()
    await asyncio.wait_for(loop.stop(), QUICK_S)
    await asyncio.wait_for(held, QUICK_S)
    assert runner.grows[0] == [True]
    loop.start()
    assert not loop._ended.is_set()
    await loop.stop()


@pytest.mark.usefixtures("long_hold")
async def test_a_first_commit_in_flight_past_the_hold_holds_no_round() -> None:
    runner, commits, _, loops = gated()
    runner.due[0] = 8
    runner.clock.set(1_000)
    await loops[0].round()  # the burst begins at 1,000
    commits.in_flight[0] = pending()  # never ends
    runner.clock.advance(LONG_HOLD_MS)
    await asyncio.wait_for(loops[0].round(), QUICK_S)
    assert runner.grows[0] == [True, True], "held long enough: it grows, without the commit"


@pytest.mark.usefixtures("long_hold")
async def test_a_wall_clock_stepped_back_ends_the_bursts_hold() -> None:
    runner, commits, _, loops = gated()
    runner.due[0] = 8
    runner.clock.set(1_000_000)
    await loops[0].round()
    commits.in_flight[0] = pending()  # never ends
    runner.clock._now = 1_000  # stepped back by ~1,000 s (`set` never goes back)
    await asyncio.wait_for(loops[0].round(), QUICK_S)
    assert runner.grows[0] == [True, True], "its time taken as up, not held until caught up"


@pytest.mark.usefixtures("long_hold")
async def test_a_commit_started_during_the_claims_is_the_bursts_own() -> None:
    runner, commits, _, loops = gated()
    first = pending()
    # The burst's first timers committed by a cycle that ran while the round claimed.
    runner.during = lambda: commits.in_flight.__setitem__(0, first)
    runner.due[0] = 6
    await loops[0].round()
    runner.during = None
    held = asyncio.create_task(loops[0].round())
    await settle()
    assert not held.done()
    commits.land(0)
    await asyncio.wait_for(held, QUICK_S)
    assert runner.grows[0] == [True, True], "the burst's own commit landed: it grows"


@pytest.mark.usefixtures("long_hold")
async def test_a_round_without_a_burst_is_never_held() -> None:
    runner, commits, _, loops = gated()
    runner.due[0] = 1  # fewer than a round takes: no burst
    commits.in_flight[0] = pending()
    await asyncio.wait_for(loops[0].round(), QUICK_S)
    await asyncio.wait_for(loops[0].round(), QUICK_S)
    assert runner.grows[0] == [True, True]
