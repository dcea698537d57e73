"""`PartitionHandle.as_loaded`: the rows a cycle's in-process timers were loaded from, read
again at once (#20). Whatever became of a row since its load, it is judged still as loaded
(`Timer.same_as_loaded`) exactly when a lookup of its key (`find`) judges so, on both
backends; and `Outcomes.still_due` over it judges each timer against its own partition's
row."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.timers.runner.options import TimerOptions
from app.timers.runner.outcomes import Outcomes
from app.timers.runner.partition import PartitionFiring
from app.timers.runner.partition_store import PartitionStore
from app.timers.runner.ports import SystemClock
from app.timers.runner.wheel import Wheel
from tables import (
    DEFAULT_TENANT,
    AggregateRef,
    CommandSpec,
    IntervalRule,
    StoreClosed,
    Timer,
    TimerChange,
    TimerStatus,
    open_timer_store,
)
from tables.ledger import MemoryFailureLedger
from tables.partition_handle import PartitionHandle
from tables.partitioned import PartitionedStore
from tables.store import DueRow


def _ref(id: str) -> AggregateRef:
    return AggregateRef(context="shop", aggregate="order", tenant=DEFAULT_TENANT, id=id)


def _timer(
    owner: str, *, version: int = 1, due: int = 1_000, partition: int = 0, id: str | None = None
) -> Timer:
    ref = _ref(owner)
    return Timer(
        id=id or f"{owner}/k/{version}",
        owner=ref,
        key="k",
        version=version,
        partition=partition,
        rule=IntervalRule(start=due, every=60_000),
        target=ref,
        command=CommandSpec(type="Remind", body={"n": 1}),
        slot_due_at=due,
        due_at=due,
    )


@pytest.fixture(params=["memory", "rocksdb"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[PartitionedStore]:
    url = "memory://" if request.param == "memory" else f"rocksdb://{tmp_path / 's'}"
    opened = open_timer_store(url, partitions=2)
    assert isinstance(opened, PartitionedStore)
    yield opened
    await opened.close()


async def _judged(handle: PartitionHandle, loaded: list[Timer]) -> list[bool]:
    """Each of `loaded` still as loaded, by `as_loaded`; asserted the same by `find`."""
    now = handle.as_loaded(loaded)
    by_find = [await handle.find(t.owner, t.key) for t in loaded]
    judged = [r is not None and r.same_as_loaded(t) for r, t in zip(now, loaded, strict=True)]
    assert judged == [
        r is not None and r.same_as_loaded(t) for r, t in zip(by_find, loaded, strict=True)
    ]
    return judged


async def test_each_row_judged_as_find_judges_it(store: PartitionedStore) -> None:
    """Loaded PENDING, FIRING and FIRED rows, then: one kept, one claimed, one cancelled,
    one set again (a later version, another due time), one settled FIRED, one whose slot
    moved on, one unchanged but FIRED when loaded; an absent key among them."""
    handle = store.partition(0)
    names = ["kept", "claimed", "cancelled", "reset", "fired", "moved", "done"]
    for i, name in enumerate(names):
        assert await handle.put(_timer(name, due=1_000 + i))
    loaded_firing = (await handle.find(_ref("claimed"), "k")) or _timer("x")
    assert await handle.settle(
        [
            TimerChange(
                loaded=loaded_firing,
                next=loaded_firing.model_copy(update={"status": TimerStatus.FIRING}),
            )
        ]
    )
    done = (await handle.find(_ref("done"), "k")) or _timer("x")
    assert await handle.settle(
        [TimerChange(loaded=done, next=done.model_copy(update={"status": TimerStatus.FIRED}))]
    )
    loaded = [(await handle.find(_ref(n), "k")) or _timer("x") for n in names]
    absent = _timer("absent")
    assert await _judged(handle, [*loaded, absent]) == [True] * len(names) + [False]

    by_name = dict(zip(names, loaded, strict=True))
    claimed = by_name["claimed"]
    assert await handle.settle(
        [TimerChange(loaded=claimed, next=claimed.model_copy(update={"attempts": 1}))]
    )
    assert await handle.cancel(_ref("cancelled"), "k", 1)
    assert await handle.put(_timer("reset", version=2, due=5_000))
    fired = by_name["fired"]
    assert await handle.settle(
        [TimerChange(loaded=fired, next=fired.model_copy(update={"status": TimerStatus.FIRED}))]
    )
    moved = by_name["moved"]
    next_slot = moved.model_copy(update={"slot": 1, "slot_due_at": 61_005, "due_at": 61_005})
    assert await handle.settle([TimerChange(loaded=moved, next=next_slot)])

    assert await _judged(handle, [*loaded, absent]) == [
        True,  # kept
        False,  # claimed: its attempts counted
        False,  # cancelled
        False,  # reset
        False,  # fired
        False,  # moved
        True,  # done: FIRED as loaded
        False,  # absent
    ]
    assert handle.as_loaded([]) == []


async def test_a_row_of_another_partition_or_a_closed_handle_is_refused(
    store: PartitionedStore,
) -> None:
    handle = store.partition(0)
    assert await handle.put(_timer("a"))
    with pytest.raises(ValueError, match="partition 1"):
        handle.as_loaded([_timer("b", partition=1)])
    await store.revoke({0})
    with pytest.raises(StoreClosed):
        handle.as_loaded([_timer("a")])


async def _no_rows(partitions: set[int], until: int, limit: int) -> list[DueRow]:
    return []


def _firing(store: PartitionedStore, p: int) -> PartitionFiring:
    return PartitionFiring(p, Wheel(_no_rows, 100, 1000), store=PartitionStore(store.partition(p)))


async def test_still_due_judges_each_timer_by_its_own_partitions_row(
    store: PartitionedStore,
) -> None:
    """Two partitions' timers of one id (another writer's ids need not be unique across
    partitions), the first cancelled since its load: it alone is dropped from hand, the
    other kept; a timer of that id in a partition of no firing is not kept either."""
    a, b = _timer("a", id="X", partition=0), _timer("b", id="X", partition=1)
    assert await store.partition(0).put(a)
    assert await store.partition(1).put(b)
    firings = {0: _firing(store, 0), 1: _firing(store, 1)}
    for p, t in ((0, a), (1, b)):
        firings[p].in_hand["X"] = (await store.partition(p).find(t.owner, t.key)) or t
    assert await store.partition(0).cancel(a.owner, a.key, 2)
    outcomes = Outcomes(store, MemoryFailureLedger(), SystemClock(), TimerOptions(), firings)
    elsewhere = _timer("c", id="X", partition=2)
    kept = await outcomes.still_due([a, b, elsewhere])
    assert [(t.partition, t.owner.id) for t in kept] == [(1, "b")]
    assert "X" not in firings[0].in_hand and "X" in firings[1].in_hand
