"""The RocksDB store's fast paths (#20) held to the reference store and to crash safety.

- `due()` takes each partition's due index in chunks and merges them by key: whatever
  the spread of due times over partitions (skewed, tied, one partition first), it
  answers what the in-memory store answers.
- A restore writes its batches without RocksDB's WAL: a process that dies mid-restore
  leaves an earlier offset with exactly the rows up to it, never a store that looks
  further restored than it is; and a write with the WAL after restored rows makes them
  durable first.
- `load_timer` shares one rule instance between rows with the same rule.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tables import AggregateRef, CommandSpec, IntervalRule, Timer, TimerStore, open_timer_store
from tables.keys import encode_timer, row_key
from tables.rowload import load_timer

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 5


def timer(n: int, partition: int, due: int, id: str | None = None) -> Timer:
    owner = AggregateRef(context="shop", aggregate="order", id=f"o{n}")
    return Timer(
        id=id or f"t{n}",
        owner=owner,
        key="k",
        version=1,
        partition=partition,
        rule=IntervalRule(start=due, every=60_000),
        target=owner,
        command=CommandSpec(type="Remind", body={"n": n}),
        slot_due_at=due,
        due_at=due,
    )


def record(offset: int, t: Timer) -> tuple[int, bytes, bytes]:
    return offset, row_key(t.owner, t.key), encode_timer(t)


async def restored(store: TimerStore, timers: list[Timer]) -> None:
    """Each partition's `timers` restored into `store`, as from its changelog."""
    for partition in range(PARTITIONS):
        rows = [t for t in timers if t.partition == partition]
        await store.apply_changelog(partition, [record(i, t) for i, t in enumerate(rows)])


# Per timer: its partition, due time and id. Few due times and ids, so that ties (equal
# due times across partitions, then equal ids) decide; a skew puts most timers in one
# partition, or all the early ones.
specs = st.lists(
    st.tuples(
        st.integers(0, PARTITIONS - 1) | st.just(0),
        st.integers(0, 40) | st.integers(0, 3),
        st.sampled_from(["a", "b", "c"]) | st.none(),
    ),
    min_size=0,
    max_size=160,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# One partition holds the early timers: the merge must go back to it for more chunks.
@example(
    specs=[(0, due, None) for due in range(100)] + [(1, 35 + due, None) for due in range(10)],
    limit=100,
    until=200,
    asked={0, 1, 2},
)
# Every timer due at once, ids tied across partitions: the row keys decide.
@example(specs=[(n % PARTITIONS, 7, "a") for n in range(90)], limit=60, until=7, asked={0, 1, 3, 4})
@given(
    specs=specs,
    limit=st.integers(1, 120),
    until=st.integers(0, 45),
    asked=st.sets(st.integers(0, PARTITIONS - 1), min_size=1),
)
def test_due_merges_the_partitions_as_the_reference_store_does(
    specs: list[tuple[int, int, str | None]], limit: int, until: int, asked: set[int]
) -> None:
    timers = [timer(n, partition, due, id) for n, (partition, due, id) in enumerate(specs)]

    async def both() -> tuple[list[Timer], list[Timer]]:
        with tempfile.TemporaryDirectory() as directory:
            memory = open_timer_store("memory://", partitions=PARTITIONS)
            rocks = open_timer_store(f"rocksdb://{directory}/s", partitions=PARTITIONS)
            for store in (memory, rocks):
                await restored(store, timers)
            found = await memory.due(asked, until, limit), await rocks.due(asked, until, limit)
            # Asked again (the low-water marks moved): the same answer.
            assert await rocks.due(asked, until, limit) == found[1]
            await memory.close()
            await rocks.close()
            return found

    expected, found = asyncio.run(both())
    assert found == expected
    wanted = sorted((t.due_at, t.id) for t in timers if t.partition in asked and t.due_at <= until)
    assert [(t.due_at, t.id) for t in found] == wanted[:limit]


# A child process restores batches and dies (os._exit: no close, no flush); the parent
# reopens the store and reads what survived.
_CHILD = """
import asyncio, os, sys
sys.path.insert(0, {root!r})
from tests.unit.test_store_rocksdb_fast_paths import batches, put_timer
from tables import open_timer_store

async def main():
    store = open_timer_store("rocksdb://" + {path!r}, partitions=1)
    for number, batch in enumerate(batches()):
        if number == {put_after}:
            assert await store.put(put_timer())
        await store.apply_changelog(0, batch)
    os._exit(0)

asyncio.run(main())
"""

BATCHES, PER_BATCH = 6, 200


def batches() -> list[list[tuple[int, bytes, bytes]]]:
    return [
        [
            record(b * PER_BATCH + i, timer(b * PER_BATCH + i, 0, 1_000 + i))
            for i in range(PER_BATCH)
        ]
        for b in range(BATCHES)
    ]


def put_timer() -> Timer:
    return timer(10**6, 0, 5)


def crash_mid_restore(path: Path, put_after: int) -> None:
    child = _CHILD.format(root=str(ROOT), path=str(path), put_after=put_after)
    subprocess.run([sys.executable, "-c", child], check=True, cwd=ROOT, timeout=60)


async def held_rows(path: Path) -> tuple[int | None, set[str], list[str]]:
    store = open_timer_store(f"rocksdb://{path}", partitions=1)
    try:
        offset = store.changelog_offset(0)
        ids = set()
        for b in batches():
            for _, _, value in b:
                t = load_timer(value)
                found = await store.find(t.owner, t.key)
                if found is not None:
                    assert found == t
                    ids.add(t.id)
        due = [t.id for t in await store.due({0}, 10**6, 10 * BATCHES * PER_BATCH)]
        return offset, ids, due
    finally:
        await store.close()


def expected_ids(offset: int | None) -> set[str]:
    last = -1 if offset is None else offset
    return {load_timer(v).id for b in batches() for o, _, v in b if o <= last}


def test_a_restore_killed_mid_way_holds_its_offset_and_exactly_the_rows_up_to_it(
    tmp_path: Path,
) -> None:
    crash_mid_restore(tmp_path / "s", put_after=-1)
    offset, ids, due = asyncio.run(held_rows(tmp_path / "s"))
    # Never further than it got: the rows of every batch up to its offset, and no others.
    assert offset is None or (offset + 1) % PER_BATCH == 0
    assert ids == expected_ids(offset)
    assert sorted(due) == sorted(ids)


@pytest.mark.parametrize("put_after", [1, 3])
def test_a_write_after_restored_batches_makes_them_durable_first(
    tmp_path: Path, put_after: int
) -> None:
    """The put goes through the WAL: without the restored rows before it made durable, a
    crash would replay the put on a store missing them (and their offset)."""
    crash_mid_restore(tmp_path / "s", put_after=put_after)
    offset, ids, due = asyncio.run(held_rows(tmp_path / "s"))
    assert offset is not None and offset >= put_after * PER_BATCH - 1
    assert (offset + 1) % PER_BATCH == 0
    assert ids == expected_ids(offset)
    assert put_timer().id in due
    assert sorted(due) == sorted(ids | {put_timer().id})


async def test_a_revoked_or_closed_partition_keeps_its_restored_rows(tmp_path: Path) -> None:
    store = open_timer_store(f"rocksdb://{tmp_path}/s", partitions=2)
    for partition in (0, 1):
        rows = [timer(partition * 100 + i, partition, 10 + i) for i in range(20)]
        await store.apply_changelog(partition, [record(i, t) for i, t in enumerate(rows)])
    await store.revoke({1})
    await store.close()
    again = open_timer_store(f"rocksdb://{tmp_path}/s", partitions=2)
    assert [again.changelog_offset(p) for p in (0, 1)] == [19, 19]
    assert len(await again.due({0, 1}, 10**6, 100)) == 40
    await again.close()


def test_rows_with_the_same_rule_share_its_instance() -> None:
    a, b = encode_timer(timer(1, 0, 1_000)), encode_timer(timer(2, 0, 1_000))
    other = encode_timer(timer(3, 0, 2_000))
    first, second, third = load_timer(a), load_timer(b), load_timer(other)
    assert first.rule is second.rule
    assert third.rule is not first.rule and third.rule == IntervalRule(start=2_000, every=60_000)
    assert encode_timer(first) == a and encode_timer(third) == other


def test_the_rule_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import tables.rowload as rowload

    monkeypatch.setattr(rowload, "_CACHE_SIZE", 3)
    monkeypatch.setattr(rowload, "_RULE_CACHE", {})
    for n in range(10):
        value = encode_timer(timer(n, 0, 1_000 + n))
        assert load_timer(value) == timer(n, 0, 1_000 + n)
        assert len(rowload._RULE_CACHE) <= 3


async def test_the_flush_before_the_first_write_after_a_restore_lets_the_loop_run(
    tmp_path: Path,
) -> None:
    """The memtable's flush takes tens of ms at a real restore's size: it runs in a
    thread, and other tasks go on meanwhile (a write without one never yields)."""
    store = open_timer_store(f"rocksdb://{tmp_path}/s", partitions=1)
    await store.apply_changelog(0, batches()[0])
    ran: list[str] = []

    async def other(name: str) -> None:
        ran.append(name)

    first = asyncio.create_task(other("during the first put"))
    assert await store.put(put_timer())
    assert ran == ["during the first put"]
    second = asyncio.create_task(other("after the second put"))
    assert await store.put(timer(10**6 + 1, 0, 6))
    assert ran == ["during the first put"]
    await asyncio.gather(first, second)
    await store.close()


async def test_a_restored_batch_lowers_the_low_water_marks_below_its_first_entries(
    tmp_path: Path,
) -> None:
    """`due()` and the sweep start from low-water marks that an empty scan raises: a later
    restore batch holding earlier due (and finished) rows must lower them again, whatever
    its order (its first entry is not its first record)."""
    from tables import TimerStatus

    def finished(n: int, at: int) -> Timer:
        return timer(n, 0, at).model_copy(update={"status": TimerStatus.FIRED})

    store = open_timer_store(f"rocksdb://{tmp_path}/s", partitions=1)
    memory = open_timer_store("memory://", partitions=1)
    first = [timer(1, 0, 500), finished(2, 600)]
    later = [timer(3, 0, 300), timer(4, 0, 20), finished(5, 40), finished(6, 90), timer(5, 0, 80)]
    for s in (store, memory):
        await s.apply_changelog(0, [record(i, t) for i, t in enumerate(first)])
        # Nothing due or finished by 100: the marks move past it.
        assert await s.due({0}, 100, 10) == []
        assert await s.expire(0, now=100, retention=0, limit=10) == 0
        await s.apply_changelog(0, [record(2 + i, t) for i, t in enumerate(later)])
    # o5's row was rewritten in the batch: finished at 40 first, then pending at 80.
    found = [(t.due_at, t.id) for t in await store.due({0}, 400, 10)]
    assert found == [(20, "t4"), (80, "t5"), (300, "t3")]
    assert found == [(t.due_at, t.id) for t in await memory.due({0}, 400, 10)]
    assert await store.expire(0, now=100, retention=0, limit=10) == 1  # o6, finished at 90
    assert await memory.expire(0, now=100, retention=0, limit=10) == 1
    await store.close()
    await memory.close()


# A burst drained as the firing loop drains it: each round claims some of what `due()`
# found (its entries move past the instant), and rows due at the same instants are put
# between rounds, their keys below or above where the last scan began.
drain_steps = st.lists(
    st.one_of(
        st.tuples(st.just("claim"), st.integers(1, 30), st.integers(0, 30)),
        st.tuples(
            st.just("put"),
            st.integers(0, PARTITIONS - 1),
            st.sampled_from([5, 7]),
            st.sampled_from(["a", "m", "z"]),
        ),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=specs, steps=drain_steps)
def test_a_burst_drained_round_by_round_is_found_as_the_reference_store_finds_it(
    specs: list[tuple[int, int, str | None]], steps: list[tuple[Any, ...]]
) -> None:
    """Each partition's scan starts at the key of the first due entry its last scan found
    (the claims' tombstones before it are not stepped over again): a row put since at
    the same instant with a key below it must still be found."""
    from tables import TimerChange, TimerStatus

    timers = [timer(n, p, min(due, 7), id) for n, (p, due, id) in enumerate(specs)]

    async def both() -> None:
        with tempfile.TemporaryDirectory() as directory:
            memory = open_timer_store("memory://", partitions=PARTITIONS)
            rocks = open_timer_store(f"rocksdb://{directory}/s", partitions=PARTITIONS)
            stores = (memory, rocks)
            for store in stores:
                await restored(store, timers)
            every = set(range(PARTITIONS))
            for n, step in enumerate(steps, start=len(timers)):
                if step[0] == "put":
                    new = timer(n, step[1], step[2], f"{step[3]}{n}")
                    for store in stores:
                        assert await store.put(new)
                    continue
                expected = await memory.due(every, 7, step[1])
                assert await rocks.due(every, 7, step[1]) == expected
                moved = {"status": TimerStatus.FIRING, "due_at": 1_000}
                claims = [TimerChange(loaded=t, next=t.model_copy(update=moved)) for t in expected]
                for store in stores:
                    assert await store.settle(claims[: step[2]]) == min(step[2], len(claims))
            assert await rocks.due(every, 7, 1_000) == await memory.due(every, 7, 1_000)
            for store in stores:
                await store.close()

    asyncio.run(both())
