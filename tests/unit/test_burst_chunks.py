"""A burst fires in chunks (#20): the wheel hands each partition at most what its in-process
firer has room for (`LocalFirer.room`) and keeps the rest unbuilt; a partition's room is a
chunk once its last chunk was decided, within a window of fired timers not committed yet
(`FireWindow`); a full wheel's rows are taken at their due instant without loading them
again; and a node hands its first chunk's transaction to its producer before the rest of
a burst is decided."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from fakes import T0, FakeClock, FakeLocal, World, make_timer, raw_store, until, world
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType, Command, Decision, Event
from app.node import Node
from app.node.fire_window import FireWindow
from app.node.kept import KeptType
from app.node.settings import Settings
from app.protocol.topics import AggregateTopics
from app.protocol.wire import CommandEnvelope, encode
from app.service import Service
from app.timers.runner import TimerLoop, TimerOptions, TimerRunner
from app.timers.runner.wheel import LOAD_ROUNDS, Wheel
from tables import AggregateRef, CommandSpec, DueRow, OnceRule, TimerStatus
from tables.partitioner import partition_of

__all__ = ["raw_store", "world"]  # the fixtures, imported for pytest

# --- the wheel -----------------------------------------------------------------------------

rows_st = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5)), max_size=40)
"""(partition, due offset) of each row."""


@given(rows_st, st.dictionaries(st.integers(0, 3), st.integers(0, 6)), st.integers(1, 50))
async def test_a_take_hands_each_partition_at_most_its_room_earliest_first(
    rows: list[tuple[int, int]], room: dict[int, int], limit: int
) -> None:
    loaded = sorted(
        (
            DueRow.of(
                make_timer(id=f"t-{i:02}", key=f"k{i}", partition=p, rule=OnceRule(at=T0 + d))
            )
            for i, (p, d) in enumerate(rows)
        ),
        key=lambda r: (r.due_at, r.id),
    )[:limit]

    async def load(partitions: set[int], until: int, n: int) -> list[DueRow]:
        return loaded

    wheel = Wheel(load, horizon_ms=100, limit=limit)
    now = T0 + 3
    taken, _ = await wheel.take_due(frozenset(range(4)), now, room.get)
    assert len(taken) <= limit
    for p in range(4):
        mine = [t.id for t in taken if t.partition == p]
        due = [r.id for r in loaded if r.partition == p and r.due_at <= now]
        cap = room.get(p)
        # The earliest of its due rows, as many as its room allows (None: all of them).
        assert mine == due[: len(mine)]
        assert cap is None or len(mine) <= cap
        if len(taken) < limit:  # not cut short by the limit
            assert len(mine) == (len(due) if cap is None else min(cap, len(due)))
            assert (p in wheel.held) == (len(mine) < len(due))


def burst_rows(n: int, partitions: int, due: int) -> list[DueRow]:
    return [
        DueRow.of(
            make_timer(id=f"t-{i:03}", key=f"k{i}", partition=i % partitions, rule=OnceRule(at=due))
        )
        for i in range(n)
    ]


async def test_a_held_partition_keeps_its_rows_unbuilt_and_out_of_next_due() -> None:
    rows = burst_rows(9, 3, T0)
    loads = 0

    async def load(partitions: set[int], until: int, n: int) -> list[DueRow]:
        nonlocal loads
        loads += 1
        return rows

    wheel = Wheel(load, horizon_ms=100, limit=100)
    room = {0: 1, 1: 0, 2: None}
    taken, more = await wheel.take_due(frozenset({0, 1, 2}), T0, room.get)
    assert sorted(t.id for t in taken) == ["t-000", "t-002", "t-005", "t-008"]
    assert wheel.held == {0, 1} and not more
    assert wheel.next_due is None, "held rows wake the loop by their room, not by time"
    room.update({0: 5, 1: 5})
    taken, _ = await wheel.take_due(frozenset({0, 1, 2}), T0 + 1, room.get)
    assert sorted(t.id for t in taken) == ["t-001", "t-003", "t-004", "t-006", "t-007"]
    assert wheel.held == frozenset() and loads == 1


async def test_a_full_load_is_taken_before_it_is_loaded_again() -> None:
    """Rows all due at T0, loaded (full) just before: not loaded a second time at T0."""
    rows = burst_rows(50, 2, T0)
    loads: list[int] = []

    async def load(partitions: set[int], until: int, n: int) -> list[DueRow]:
        loads.append(n)
        return rows[:n]

    wheel = Wheel(load, horizon_ms=100, limit=5)
    taken, more = await wheel.take_due(frozenset({0, 1}), T0 - 50)
    assert taken == [] and not more and wheel.next_due == T0
    assert loads == [5 * LOAD_ROUNDS], "a load holds several takes' worth"
    for _ in range(LOAD_ROUNDS):
        taken, more = await wheel.take_due(frozenset({0, 1}), T0)
        assert len(taken) == 5 and more, "beyond a full load: more may be due"
    assert len(loads) == 1, "the rows loaded for T0 were not read again"
    taken, _ = await wheel.take_due(frozenset({0, 1}), T0)
    assert len(loads) == 2, "its rows taken: loaded again"


async def test_a_full_load_whose_due_rows_are_all_held_is_not_loaded_again() -> None:
    """Past a full load, rounds while every due row waits for room do not read the same
    rows again and again: the wheel is loaded again once its due rows were taken."""
    rows = burst_rows(40, 2, T0)
    loads: list[int] = []

    async def load(partitions: set[int], until: int, n: int) -> list[DueRow]:
        loads.append(n)
        return rows[:n]

    wheel = Wheel(load, horizon_ms=100, limit=5)
    room: dict[int, int | None] = {0: 2, 1: 2}
    taken, _ = await wheel.take_due(frozenset({0, 1}), T0, room.get)
    assert len(taken) == 4 and len(loads) == 1
    room.update({0: 0, 1: 0})
    for _ in range(3):
        taken, more = await wheel.take_due(frozenset({0, 1}), T0 + 1, room.get)
        assert taken == [] and not more and wheel.held == {0, 1}
    assert len(loads) == 1, "held rows are not read again"
    room.update({0: None, 1: None})
    while len(loads) == 1:
        taken, _ = await wheel.take_due(frozenset({0, 1}), T0 + 1, room.get)
    assert len(loads) == 2, "its due rows taken: loaded again"


async def test_a_take_serves_a_partition_its_whole_room_before_the_next() -> None:
    """Not one row of each partition in turn: each partition's share is one chunk."""
    rows = burst_rows(12, 3, T0)

    async def load(partitions: set[int], until: int, n: int) -> list[DueRow]:
        return rows

    wheel = Wheel(load, horizon_ms=100, limit=6)
    taken, more = await wheel.take_due(frozenset({0, 1, 2}), T0, lambda p: 3)
    assert [t.partition for t in taken] == [0, 0, 0, 1, 1, 1] and more


# --- the window ----------------------------------------------------------------------------

steps_st = st.lists(st.tuples(st.sampled_from(["take", "decide", "commit"]), st.integers(0, 9)))


@given(steps_st, st.integers(1, 10), st.integers(1, 30))
def test_a_window_hands_a_chunk_at_a_time_and_never_more_than_the_window(
    steps: list[tuple[str, int]], chunk: int, window: int
) -> None:
    """Whatever the order of takes, decisions and commits: a partition is handed nothing
    while what it was handed is undecided, a chunk when nothing of its own waits for a
    commit, and never so much that its uncommitted timers would pass the window."""
    fw = FireWindow({}, lambda _t, _p: None)
    key = ("t", 0)
    undecided = 0
    uncommitted: list[int] = []  # per decided chunk, not committed yet
    for step, n in steps:
        room = fw.left(key, chunk, window)
        if step == "take":
            left = window - sum(uncommitted)
            assert room == (0 if undecided else min(chunk, left) if not sum(uncommitted) else left)
            if room:
                take = min(room, n) or room
                fw.handed(key, take)
                undecided += take
        elif step == "decide" and undecided:
            kept = min(n, undecided)
            fw.decided(key, undecided, kept)
            undecided = 0
            uncommitted.append(kept)
        elif step == "commit" and uncommitted:
            fw.committed(key, uncommitted.pop(0))
        assert sum(uncommitted) + undecided <= window
    fw.drop(0)
    assert fw.left(key, chunk, window) == min(chunk, window)


# --- the runner ----------------------------------------------------------------------------


class RoomyLocal(FakeLocal):
    """Takes every timer, each partition as much as `rooms` says."""

    def __init__(self, rooms: dict[int, int | None]) -> None:
        super().__init__()
        self.rooms = rooms

    def room(self, partition: int) -> int | None:
        return self.rooms.get(partition)


def local_runner(world: World, local: FakeLocal) -> TimerRunner:
    world.runner()  # makes the world's sender
    return TimerRunner(
        world.store,
        world.sender,
        world.clock,
        world.ledger,
        TimerOptions(batch_limit=10),
        (0, 1),
        local=local,
    )


async def test_a_partition_gets_only_its_room_and_the_rest_later_without_a_reload(
    world: World,
) -> None:
    for i in range(8):
        assert await world.store.inner.put(make_timer(id=f"t-{i}", key=f"k{i}", partition=i % 2))
    local = RoomyLocal({0: 3, 1: 3})
    runner = local_runner(world, local)
    stats = await runner.run_round()
    assert sorted(t.partition for t in local.fired) == [0, 0, 0, 1, 1, 1]
    assert stats.claimed == 6 and runner.held == {0, 1} and not stats.full
    local.rooms.update({0: 0, 1: 0})
    stats = await runner.run_round()
    assert (stats.claimed, len(local.fired)) == (0, 6)
    assert len(world.store.due_calls) == 1, "held rows stay in the wheel"
    local.rooms[1] = 5
    stats = await runner.run_round()
    assert [t.partition for t in local.fired[6:]] == [1]
    assert stats.claimed == 1 and runner.held == {0}
    assert len(world.store.due_calls) == 1


async def test_a_loop_whose_rows_are_held_waits_for_a_wake_not_the_clock(world: World) -> None:
    """The loop does not spin on rows it may not hand over yet: it sleeps (the poll
    interval at most) until the partition's room wakes it."""
    for i in range(4):
        assert await world.store.inner.put(make_timer(id=f"t-{i}", key=f"k{i}"))
    local = RoomyLocal({0: 3})
    runner = local_runner(world, local)
    loop = TimerLoop(runner)
    loop.start()
    try:
        await until(lambda: len(local.fired) == 3)
        local.rooms[0] = 0
        await until(lambda: runner.held == {0})
        rounds = loop.rounds
        for _ in range(50):
            await asyncio.sleep(0)
        assert loop.rounds <= rounds + 2, "it spun on held rows"
        assert T0 + 100 in world.clock.sleeping_until  # the poll interval, at the latest
        local.rooms[0] = 3
        loop.wake(reload=False)
        await until(lambda: len(local.fired) == 4)
    finally:
        await loop.stop()


# --- a node on the in-memory log -----------------------------------------------------------

PARTITIONS = 2
TOPICS = AggregateTopics("burst", "counter")


class Counter(BaseModel):
    fired: int = 0


counter = AggregateType("burst", "counter", Counter)


@counter.command("Schedule")
def _schedule(state: Counter, cmd: Command, d: Decision) -> None:
    for k in range(int(cmd.body["n"])):
        d.schedule(f"k{k}", OnceRule(at=int(cmd.body["at"])), CommandSpec(type="Fire"))


@counter.command("Fire")
def _fire(state: Counter, cmd: Command, d: Decision) -> None:
    d.emit("Fired", {"n": state.fired + 1})


@counter.applies("Fired")
def _fired(state: Counter, e: Event) -> Counter:
    return state.model_copy(update={"fired": e.body["n"]})


async def within(check: Callable[[], bool], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.01)


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[tuple[Node, MemoryLog, FakeClock]]:
    log = MemoryLog()
    clock = FakeClock(T0 - 60_000)
    settings = Settings(
        bootstrap_servers="memory",
        partitions=PARTITIONS,
        data_dir=tmp_path / "n",
        group_id="g",
        session_timeout_ms=1_000,
        commit_interval_ms=20,
    )
    n = Node(
        settings,
        Service(aggregates=(counter,)),
        clients=log,
        clock=clock,
        options=TimerOptions(fire_chunk=20, fire_window=60),
    )
    await n.start()
    task = asyncio.create_task(n.run())
    try:
        yield n, log, clock
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await n.stop()


async def test_a_bursts_first_chunk_is_handed_to_the_producer_before_the_rest_is_decided(
    node: tuple[Node, MemoryLog, FakeClock],
) -> None:
    n, log, clock = node
    await within(lambda: bool(n.health()["ready"]) and len(n.owned) == PARTITIONS)
    owners = [f"o{i}" for i in range(10)]
    for owner in owners:  # 10 owners x 30 timers, across both partitions, all due at T0
        cmd = CommandEnvelope(
            request_id=uuid.uuid4().hex,
            type="Schedule",
            aggregate=AggregateRef(context="burst", aggregate="counter", id=owner),
            body={"at": T0, "n": 30},
            issued_at=clock.now(),
        )
        p = partition_of(owner, PARTITIONS)
        await log.publisher().send(TOPICS.commands, owner.encode(), encode(cmd), p)
    kept = n.types["burst.counter"]
    store: Any = kept.store

    async def pending() -> int:
        rows = await store.due(set(range(PARTITIONS)), until=T0 + 1, limit=1000)
        return sum(t.status is TimerStatus.PENDING for t in rows)

    deadline = time.monotonic() + 20
    while await pending() < 300:
        assert time.monotonic() < deadline, "the burst was never put"
        await asyncio.sleep(0.01)
    await within(lambda: not any(kept.transactions.staged(p) for p in range(PARTITIONS)))

    decided: list[int] = []  # timers decided in-process, in order
    at_first_take: list[int] = []
    record = kept.runner.record_outcomes
    start = n.commits.start

    async def recording(results: Any) -> Any:
        decided.append(len(results))
        return await record(results)

    def starting(kept: KeptType, p: int) -> asyncio.Task[bool] | None:
        task = start(kept, p)
        if decided and not at_first_take and task is not None:
            at_first_take.append(sum(decided))
        return task

    kept.runner.record_outcomes = recording  # type: ignore[method-assign]
    n.commits.start = starting  # type: ignore[method-assign]
    clock.set(T0)
    await within(lambda: sum(decided) == 300)
    assert max(decided) <= 20, "a chunk at most is decided per turn"
    # The first chunks' transaction left before the rest of the burst was decided: at most
    # one chunk of each partition (the commit may wait for the last commit's interval).
    assert at_first_take and at_first_take[0] <= 20 * PARTITIONS, at_first_take
    applied = await within_fired(n, owners)
    assert applied == 300, "every timer fired once"


async def within_fired(n: Node, owners: list[str]) -> int:
    """The timers FIRED in the table, once all are."""
    kept = n.types["burst.counter"]
    store: Any = kept.store

    async def fired() -> int:
        total = 0
        for owner in owners:
            for k in range(30):
                row = await store.find(
                    AggregateRef(context="burst", aggregate="counter", id=owner), f"k{k}"
                )
                total += row is not None and row.status is TimerStatus.FIRED
        return total

    deadline = time.monotonic() + 20
    while (count := await fired()) < 300:
        assert time.monotonic() < deadline, f"only {count} fired"
        await asyncio.sleep(0.02)
    return count
