"""Slow start for a burst (#20): when a round would be full, the runner takes a small first
slice and doubles it each round while rows are left due, so the first timers of a burst
fire (are claimed, decided and committed) without waiting for a thousand others; steady
load is never sliced. The rows not taken stay in the wheel: a full load is loaded again
only once its rows due were taken."""

from __future__ import annotations

from itertools import pairwise

from fakes import PARTITIONS, T0, World, make_timer, raw_store, world
from hypothesis import given
from hypothesis import strategies as st

from app.timers.runner.slow_start import FIRST_SLICE, burst_after, round_slice
from app.timers.runner.wheel import Wheel, count_due_of, due_step_of, load_due_of, take_from
from tables import DueRow, OnceRule

__all__ = ["raw_store", "world"]  # the fixtures, imported for pytest


def rounds(backlog: int, limit: int, first: int, grows: list[bool]) -> list[int]:
    """How many each round takes of `backlog` rows all due at once, round after round
    (each counts what is due up to `limit`; `grows`: whether its slice may grow, True
    past the list's end), until none is left."""
    taken: list[int] = []
    burst: int | None = None
    left = backlog
    while left > 0:
        grow = grows[len(taken)] if len(taken) < len(grows) else True
        n = round_slice(min(left, limit), burst, limit=limit, first=first, grow=grow)
        took = min(n, left)
        left -= took
        burst = burst_after(n, left > 0)
        taken.append(took)
        assert len(taken) <= backlog + 1, "every round takes at least one"
    assert burst is None, "the burst ends with its last round"
    return taken


@given(
    backlog=st.integers(0, 20_000),
    limit=st.integers(1, 2_000),
    first=st.integers(1, 200),
    grows=st.lists(st.booleans(), max_size=12),
)
def test_slices_take_all_that_is_due_starting_small_then_doubling(
    backlog: int, limit: int, first: int, grows: list[bool]
) -> None:
    taken = rounds(backlog, limit, first, grows)
    assert sum(taken) == backlog
    if backlog < limit:
        # Steady load: one round takes all of it, as without slow start.
        assert taken == ([backlog] if backlog else [])
        return
    assert taken[0] == min(first, limit), "a burst's first slice is small"
    body = taken[:-1]  # the last round takes what is left
    for i, (before, after) in enumerate(pairwise(body), start=1):
        grow = grows[i] if i < len(grows) else True
        assert after == (min(limit, 2 * before) if grow else before), "held, or doubled"
    if len(taken) > 1:
        assert taken[-1] <= min(limit, 2 * taken[-2])
    assert all(0 < n <= limit for n in taken)


@given(due=st.integers(0, 5_000), limit=st.integers(1, 2_000), grow=st.booleans())
def test_a_round_without_a_burst_under_way_is_sliced_only_when_it_would_be_full(
    due: int, limit: int, grow: bool
) -> None:
    n = round_slice(due, None, limit=limit, grow=grow)
    assert n == (min(FIRST_SLICE, limit) if due >= limit else limit)
    assert burst_after(n, more=False) is None, "a round that leaves nothing due ends it"


@given(
    due=st.integers(0, 5_000),
    limit=st.integers(1, 2_000),
    spread=st.integers(1, 64),
    grow=st.booleans(),
)
def test_a_partitions_own_round_begins_a_burst_at_its_share_with_its_share_of_the_slice(
    due: int, limit: int, spread: int, grow: bool
) -> None:
    # `spread` partitions' rounds run side by side, each with its own slice: each begins
    # a burst at its share of a full round, and their first slices together are one's.
    n = round_slice(due, None, limit=limit, grow=grow, spread=spread)
    if due >= max(1, limit // spread):
        assert n == max(1, min(FIRST_SLICE // spread, limit))
        assert n * spread <= max(FIRST_SLICE, spread)
    else:
        assert n == limit  # steady: all that is due
    assert round_slice(due, None, limit=limit, grow=grow) == round_slice(
        due, None, limit=limit, grow=grow, spread=1
    )
    # a burst under way grows as any other, whatever the spread
    assert round_slice(due, 7, limit=limit, grow=grow, spread=spread) == min(
        limit, 14 if grow else 7
    )


@given(
    due=st.integers(0, 5_000),
    before=st.integers(0, 5_000),
    limit=st.integers(1, 2_000),
    spread=st.integers(1, 64),
)
def test_a_burst_begins_on_a_rise_never_again_and_again_under_a_steady_backlog(
    due: int, before: int, limit: int, spread: int
) -> None:
    # A steady load whose rounds keep as many due (slow rounds) is taken whole each round:
    # restarting it at a small slice every time would only add round trips to a backlog.
    n = round_slice(due, None, limit=limit, spread=spread, before=before)
    mark = max(1, limit // spread)
    if due >= mark and before < mark:
        assert n == max(1, min(FIRST_SLICE // spread, limit))
    else:
        assert n == limit


def test_a_steady_backlog_is_sliced_once_then_taken_whole() -> None:
    # 12 partitions, rounds too slow for the load: 100 due at every round (over the mark
    # of 83); sliced when it first rose over it, then never again once the burst ended.
    limit, spread, before, burst = 1_000, 12, 0, None
    takes = []
    for _ in range(12):
        take = round_slice(100, burst, limit=limit, spread=spread, before=before)
        burst, before = burst_after(take, more=take < 100), 100
        takes.append(min(take, 100))
    assert takes[0] == 2  # the rise: a small first slice
    assert takes[-4:] == [100] * 4  # then the backlog whole, each round


def at(ms: int, id: str, partition: int) -> DueRow:
    return DueRow.of(make_timer(id=id, key=id, rule=OnceRule(at=T0 + ms), partition=partition))


async def test_a_slice_spreads_over_the_partitions_and_a_full_load_is_taken_first() -> None:
    # 30 rows due at T0 in each of three partitions; a load holds 60 (the earliest by id).
    rows = sorted(
        (at(0, f"t{i:03d}-{p}", p) for p in range(3) for i in range(30)),
        key=lambda r: (r.due_at, r.id),
    )
    loads: list[int] = []

    async def load(partitions: set[int], until: int, limit: int) -> list[DueRow]:
        loads.append(until)
        return [r for r in rows if r.partition in partitions and r.due_at < until][:limit]

    wheels = {p: Wheel(load, horizon_ms=100, limit=60) for p in range(3)}
    await load_due_of(wheels, load, T0, 100, 60)
    assert count_due_of(wheels, T0, 1_000) == 60 and count_due_of(wheels, T0, 25) == 25
    taken, more = take_from(wheels, T0, 6)
    assert more and len(taken) == 6
    assert {t.partition for t in taken} == {0, 1, 2}, "a few of each partition, by id"
    assert [t.id for t in taken] == [r.id for r in rows[:6]]
    for _ in range(9):
        await load_due_of(wheels, load, T0 + 1, 100, 60)
        taken, more = take_from(wheels, T0 + 1, 6)
        assert more and len(taken) == 6
    assert len(loads) == 1, "the rows of a full load are taken before it loads again"
    await load_due_of(wheels, load, T0 + 1, 100, 60)
    assert len(loads) == 2, "taken: loaded again (here, the same rows: none were settled)"


async def test_a_burst_is_claimed_in_slices_that_double_and_steady_load_in_one_round(
    world: World,
) -> None:
    for i in range(300):
        await world.put(id=f"t-{i:03d}", key=f"k{i:03d}", partition=i % PARTITIONS)
    runner = world.runner(partitions=range(PARTITIONS), batch_limit=200)
    claimed: list[tuple[int, bool]] = []
    while len(claimed) < 10:
        stats = await runner.run_round()
        if not stats.claimed:
            break
        claimed.append((stats.claimed, stats.full))
    # 32 of the load of 200, then 64, then the 104 left of it; loaded again: the other 100,
    # fewer than a round may take, so the burst is over.
    assert claimed == [(32, True), (64, True), (104, True), (100, False)]
    assert len(world.store.due_calls) == 2, "one load per 200 rows, not one per round"
    assert len(set(world.sender.request_ids)) == 300 == len(world.sender.request_ids)
    # Then steady load: fewer due than a round may take are taken at once, not sliced.
    for i in range(150):
        await world.put(id=f"s-{i:03d}", key=f"s{i:03d}", rule=OnceRule(at=T0 + 1_000))
    world.clock.set(T0 + 1_000)
    stats = await runner.run_round()
    assert (stats.claimed, stats.full) == (150, False)


async def test_a_burst_held_takes_the_same_slice_until_it_may_grow(world: World) -> None:
    for i in range(300):
        await world.put(id=f"t-{i:03d}", key=f"k{i:03d}", partition=i % PARTITIONS)
    runner = world.runner(partitions=range(PARTITIONS), batch_limit=100)
    claimed: list[int] = []
    for grow in [False, False, False, True, True]:
        async with runner.round(grow=grow) as r:
            r.claims_committed(r.to_commit)
        claimed.append(r.stats.claimed)
        assert runner.bursting
    # Held at 32 (the first slice); then 64, of which the 4 left of the load of 100;
    # then 128, at most the limit: loaded again, 100.
    assert claimed == [32, 32, 32, 4, 100]


@given(
    due=st.integers(0, 5_000),
    before=st.integers(0, 5_000),
    limit=st.integers(1, 2_000),
    spread=st.integers(1, 64),
    data=st.data(),
)
def test_a_streams_backlog_is_never_begun_as_a_burst(
    due: int, before: int, limit: int, spread: int, data: st.DataObject
) -> None:
    # Rows due spread wide (a steady stream whose rounds were held up: fewer than half of
    # them in the step) are taken whole: a burst begun on them took 5 a round, growing
    # only as commits landed, while the stream kept adding to them.
    step = data.draw(st.integers(0, max(0, (due - 1) // 2)))
    assert round_slice(due, None, limit=limit, spread=spread, before=before, step=step) == limit


@given(
    due=st.integers(0, 5_000),
    before=st.integers(0, 5_000),
    limit=st.integers(1, 2_000),
    spread=st.integers(1, 64),
    data=st.data(),
)
def test_a_step_of_half_the_rows_due_or_more_begins_a_burst_as_if_all_were_in_it(
    due: int, before: int, limit: int, spread: int, data: st.DataObject
) -> None:
    step = data.draw(st.integers((due + 1) // 2, due))
    whole = round_slice(due, None, limit=limit, spread=spread, before=before)
    assert round_slice(due, None, limit=limit, spread=spread, before=before, step=step) == whole


async def test_the_step_of_the_rows_due_is_over_the_wheels() -> None:
    rows = [at(0, "a", 0), at(40, "b", 1), at(90, "c", 1), at(95, "e", 0), at(500, "d", 2)]

    async def load(partitions: set[int], until: int, limit: int) -> list[DueRow]:
        return [r for r in rows if r.partition in partitions and r.due_at < until]

    wheels = {p: Wheel(load, horizon_ms=1_000, limit=60) for p in range(3)}
    await load_due_of(wheels, load, T0, 1_000, 60)
    assert due_step_of(wheels, T0 - 1, 100) == 0, "none due"
    assert due_step_of(wheels, T0, 100) == 1, "one instant"
    assert due_step_of(wheels, T0 + 100, 100) == 4, "all within 100 ms of the latest"
    assert due_step_of(wheels, T0 + 100, 60) == 3, "a, 95 ms before the latest, is not"
    assert due_step_of(wheels, T0 + 600, 100) == 1, "d alone: 405 ms after e"


async def test_a_burst_beside_an_older_straggler_still_begins_slow(world: World) -> None:
    # A deferred send, a hand-off's gap or a timer set in the past: one row due 300 ms
    # before a burst at one instant does not make the burst a stream's backlog.
    await world.put(id="old", key="old", rule=OnceRule(at=T0 - 300))
    for i in range(250):
        await world.put(id=f"t-{i:03d}", key=f"k{i:03d}", rule=OnceRule(at=T0))
    runner = world.runner(partitions=range(PARTITIONS), batch_limit=200)
    world.clock.set(T0)
    stats = await runner.run_round()
    assert stats.claimed == FIRST_SLICE


async def test_a_streams_backlog_after_a_stall_is_claimed_in_one_round(world: World) -> None:
    # A stream of a row every 2 ms whose rounds stalled for 400 ms: 200 due, a full round,
    # over a span of 400 ms. Taken in one round, not begun as a burst of 32.
    for i in range(250):
        await world.put(id=f"t-{i:03d}", key=f"k{i:03d}", rule=OnceRule(at=T0 + 2 * i))
    runner = world.runner(partitions=range(PARTITIONS), batch_limit=200)
    world.clock.set(T0 + 398)
    stats = await runner.run_round()
    assert stats.claimed == 200
