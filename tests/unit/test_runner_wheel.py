"""The runner's wheel builds a row's Timer only when it takes the row (`DueRow`): a load
of rows due over the next poll interval costs the index scan, not a thousand Timers."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import OWNER, T0, make_timer

from app.timers.runner.wheel import Wheel, take_due_of
from tables import DueRow, OnceRule, StoreError, Timer, open_timer_store


class SpyRow(DueRow):
    """A DueRow that notes which rows were built."""

    built_ids: list[str]

    def timer(self) -> Timer:
        SpyRow.built_ids.append(self.id)
        return super().timer()


def at(ms: int, id: str) -> Timer:
    return make_timer(id=id, key=id, rule=OnceRule(at=T0 + ms), owner=OWNER)


@pytest.fixture(params=["memory", "rocksdb"])
async def loaded(request: pytest.FixtureRequest, tmp_path: Path) -> list[DueRow]:
    """Rows due at T0, T0+10 and T0+20 as a store's due_rows reads them."""
    url = "memory://" if request.param == "memory" else f"rocksdb://{tmp_path / 's'}"
    store = open_timer_store(url, partitions=1)
    for ms, id in [(0, "a"), (10, "b"), (20, "c")]:
        assert await store.put(at(ms, id))
    rows = await store.due_rows({0}, T0 + 1_000, 100)
    await store.close()
    return rows


def spied(rows: list[DueRow]) -> list[DueRow]:
    SpyRow.built_ids = []
    # The Timer as read (bytes or model): built by the wheel through `timer()` only.
    return [SpyRow(r.due_at, r.id, r.partition, timer=r.timer()) for r in rows]


async def test_a_row_is_built_when_it_is_taken_not_when_it_is_loaded(loaded: list[DueRow]) -> None:
    loads = 0

    async def load(partitions: set[int], until: int, limit: int) -> list[DueRow]:
        nonlocal loads
        loads += 1
        return spied(loaded)

    wheel = Wheel(load, horizon_ms=100, limit=10)
    taken, more = await wheel.take_due(frozenset({0}), T0)
    assert [t.id for t in taken] == ["a"] and not more
    assert SpyRow.built_ids == ["a"], "b and c are not due yet: not built"
    assert wheel.next_due == T0 + 10
    wheel.invalidate()  # a reload drops b and c unbuilt
    taken, _ = await wheel.take_due(frozenset({0}), T0 + 10)
    assert [t.id for t in taken] == ["a", "b"] and loads == 2
    assert SpyRow.built_ids == ["a", "b"], "the reload's own rows: built when taken"
    # A row offered (just written) is taken as the Timer it is.
    offered = at(15, "d")
    wheel.offer([offered], {0})
    taken, _ = await wheel.take_due(frozenset({0}), T0 + 20)
    assert taken == [offered, loaded[2].timer()]


async def test_a_row_that_cannot_be_built_fails_the_take_and_the_wheel_loads_again(
    loaded: list[DueRow],
) -> None:
    good = loaded[0].timer()
    answers = [
        [DueRow(T0, "bad", 0, raw=b"{not a row"), *loaded],
        loaded,
    ]

    async def load(partitions: set[int], until: int, limit: int) -> list[DueRow]:
        return answers.pop(0)

    wheel = Wheel(load, horizon_ms=100, limit=10)
    # The store's error, naming the row (#20: it was orjson's JSONDecodeError).
    with pytest.raises(StoreError, match=rf"DueRow\({T0}, 'bad', partition=0\)"):
        await wheel.take_due(frozenset({0}), T0)
    assert wheel.until is None, "loaded again at the next take, as after a failed load"
    taken, _ = await wheel.take_due(frozenset({0}), T0)
    assert taken == [good] and answers == []


async def test_the_partitions_wheels_load_together_and_give_the_earliest_rows_first() -> None:
    """One wheel per partition (`take_due_of`): one load for all of them when one ran out,
    and the rows due taken across them by due time, at most `limit` a take."""
    rows = {
        0: [at(0, "a0"), at(20, "c0"), at(500, "z0")],
        1: [at(10, "b1"), at(30, "d1")],
    }
    loads: list[set[int]] = []

    async def load(partitions: set[int], until: int, limit: int) -> list[DueRow]:
        loads.append(set(partitions))
        return [
            DueRow.of(t.model_copy(update={"partition": p}))
            for p in sorted(partitions)
            for t in rows[p]
            if t.due_at < until
        ]

    wheels = {p: Wheel(load, horizon_ms=100, limit=5) for p in (0, 1)}
    taken, more = await take_due_of(wheels, load, T0 + 15, horizon_ms=100, limit=5)
    assert [t.id for t in taken] == ["a0", "b1"] and not more
    assert loads == [{0, 1}]
    taken, more = await take_due_of(wheels, load, T0 + 30, horizon_ms=100, limit=5)
    assert [t.id for t in taken] == ["c0", "d1"] and not more, "from the wheels: no load"
    assert loads == [{0, 1}]
    wheels[1].invalidate()  # one ran out: all loaded again, together
    taken, _ = await take_due_of(wheels, load, T0 + 40, horizon_ms=100, limit=3)
    assert loads == [{0, 1}, {0, 1}]
    assert [t.id for t in taken] == ["a0", "b1", "c0"], "the earliest, at most the limit"
