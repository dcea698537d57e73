"""Finished rows expire after their retention: the pure decision, and each backend's sweep."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from fakes import RecordingSink
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tables import (
    AggregateRef,
    ChangelogRecord,
    CommandSpec,
    IntervalRule,
    Timer,
    TimerChange,
    TimerStatus,
    TimerStore,
    open_timer_store,
)
from tables.keys import finished_at, row_key
from tables.retention import FINISHED, expired, plan_expiry

P = 2
DAY = 86_400_000
STATUSES = list(TimerStatus)


def timer(
    n: int,
    *,
    partition: int = 0,
    due: int = 1_000,
    status: TimerStatus = TimerStatus.PENDING,
    slot_due: int | None = None,
) -> Timer:
    owner = AggregateRef(context="shop", aggregate="order", id=f"o{n}")
    return Timer(
        id=f"t{n}",
        owner=owner,
        key="k",
        version=1,
        partition=partition,
        status=status,
        rule=IntervalRule(start=due, every=60_000),
        target=owner,
        command=CommandSpec(type="Remind", body={"n": n}),
        slot_due_at=due if slot_due is None else slot_due,
        due_at=due,
    )


# --- the pure decision ----------------------------------------------------------------

times = st.integers(0, 2**45)


@given(st.sampled_from(STATUSES), times, times, times, st.integers(0, 30 * DAY))
def test_a_row_expires_once_finished_for_the_retention(
    status: TimerStatus, due: int, slot_due: int, now: int, retention: int
) -> None:
    row = timer(1, due=due, slot_due=slot_due, status=status)
    finished = finished_at(due, slot_due)
    assert finished == max(due, slot_due)
    assert expired(row, now, retention) == (status in FINISHED and finished + retention <= now)


@given(st.sampled_from(STATUSES), times, times, st.integers(0, 30 * DAY), times)
def test_a_fake_clock_moving_on_never_brings_a_row_back(
    status: TimerStatus, due: int, now: int, retention: int, later: int
) -> None:
    row = timer(1, due=due, status=status)
    if expired(row, now, retention):
        assert expired(row, now + later, retention)
    # Active rows never expire, however late.
    if status not in FINISHED:
        assert not expired(row, 2**62, 0)


@given(
    st.lists(st.tuples(st.sampled_from(STATUSES), times), max_size=30),
    times,
    st.integers(0, DAY),
    st.integers(1, 10),
)
def test_a_plan_deletes_the_expired_rows_only_and_at_most_limit(
    rows: list[tuple[TimerStatus, int]], now: int, retention: int, limit: int
) -> None:
    held = [(b"row%d" % n, timer(n, due=due, status=s)) for n, (s, due) in enumerate(rows)]
    writes = plan_expiry(1, held, now, retention, limit)
    wanted = [(row, t) for row, t in held if expired(t, now, retention)][:limit]
    assert [(w.row, w.old) for w in writes] == wanted
    assert all(w.new is None and w.partition == 1 for w in writes)


# --- each backend ---------------------------------------------------------------------

Opener = Callable[..., Awaitable[TimerStore]]


@pytest.fixture(params=["memory", "rocksdb"])
async def opener(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Opener]:
    stores: list[TimerStore] = []

    async def open_store(name: str = "s", sink: RecordingSink | None = None) -> TimerStore:
        url = "memory://" if request.param == "memory" else f"rocksdb://{tmp_path / name}"
        store = open_timer_store(url, partitions=P, changelog=sink)
        stores.append(store)
        return store

    yield open_store
    for store in stores:
        await store.close()


async def finish(store: TimerStore, row: Timer, status: TimerStatus, due: int) -> Timer:
    """`row` put, then settled to `status` with `due_at` `due` (as the runner does)."""
    assert await store.put(row)
    done = row.model_copy(update={"status": status, "due_at": due})
    assert await store.settle([TimerChange(loaded=row, next=done)]) == 1
    return done


async def test_the_sweep_deletes_expired_rows_with_a_tombstone_each(opener: Opener) -> None:
    sink = RecordingSink()
    store = await opener(sink=sink)
    fired = await finish(store, timer(1), TimerStatus.FIRED, 2_000)
    cancelled = await finish(store, timer(2), TimerStatus.CANCELLED, 3_000)
    recent = await finish(store, timer(3), TimerStatus.FIRED, 50_000)
    pending = timer(4, due=0)
    assert await store.put(pending)
    other = await finish(store, timer(5, partition=1), TimerStatus.FIRED, 1_000)
    sink.records.clear()

    # The fake clock: at 10,000 with a retention of 5,000, rows finished by 5,000 go.
    assert await store.expire(0, now=10_000, retention=5_000, limit=100) == 2
    assert sink.records == [
        ChangelogRecord(0, row_key(fired.owner, "k"), None, fired),
        ChangelogRecord(0, row_key(cancelled.owner, "k"), None, cancelled),
    ]
    assert await store.find(fired.owner, "k") is None
    assert await store.find(cancelled.owner, "k") is None
    assert await store.find(recent.owner, "k") == recent
    assert await store.find(pending.owner, "k") == pending
    assert await store.find(other.owner, "k") == other  # another partition's
    assert await store.due({0}, 10_000, 10) == [pending]
    assert store.status_counts(0)[TimerStatus.PENDING] == 1
    # Nothing more until the clock moves on.
    assert await store.expire(0, now=10_000, retention=5_000, limit=100) == 0
    assert await store.expire(0, now=55_000, retention=5_000, limit=100) == 1
    assert await store.find(recent.owner, "k") is None


async def test_the_sweep_works_in_bounded_batches_oldest_first(opener: Opener) -> None:
    sink = RecordingSink()
    store = await opener(sink=sink)
    dues = [100 * (10 - n) for n in range(7)]
    rows = [await finish(store, timer(n, due=d), TimerStatus.FIRED, d) for n, d in enumerate(dues)]
    sink.records.clear()
    counts = []
    while (count := await store.expire(0, now=DAY, retention=DAY - 1_000, limit=3)) > 0:
        counts.append(count)
    assert counts == [3, 3, 1]
    oldest_first = sorted(rows, key=lambda t: t.due_at)
    assert [r.key for r in sink.records] == [row_key(t.owner, "k") for t in oldest_first]


async def test_a_row_put_again_after_its_row_expired_is_a_new_timer(opener: Opener) -> None:
    """What a replay older than the retention does: the row is gone, so a put of the same
    timer is taken again (the runner then expires or fires it by its due time)."""
    store = await opener()
    row = timer(1)
    await finish(store, row, TimerStatus.FIRED, 1_000)
    assert not await store.put(row)  # held: a replay within the retention is refused
    assert await store.expire(0, now=DAY, retention=1_000, limit=10) == 1
    assert await store.put(row)
    assert await store.find(row.owner, "k") == row


async def test_a_restore_of_the_changelog_loads_no_expired_row(opener: Opener) -> None:
    sink = RecordingSink()
    store = await opener("a", sink)
    kept = await finish(store, timer(1), TimerStatus.FIRED, 9_000)
    await finish(store, timer(2), TimerStatus.CANCELLED, 1_000)
    await finish(store, timer(3), TimerStatus.FIRED, 1_500)
    assert await store.expire(0, now=6_000, retention=4_000, limit=10) == 2
    records = [
        (offset, r.key, r.value) for offset, r in enumerate(sink.records) if r.partition == 0
    ]
    restored = await opener("b")
    assert await restored.apply_changelog(0, records) == []
    assert await restored.timers_of(kept.owner) == [kept]
    assert await restored.timers_of(timer(2).owner) == []
    assert await restored.timers_of(timer(3).owner) == []
    # And the restored store sweeps what it loaded, later.
    assert await restored.expire(0, now=20_000, retention=4_000, limit=10) == 1


async def test_bad_arguments_are_value_errors(opener: Opener) -> None:
    store = await opener()
    for bad in ({"now": -1}, {"retention": -1}, {"limit": 0}, {"now": True}, {"limit": 1.5}):
        args: dict[str, Any] = {"now": 1, "retention": 1, "limit": 1, **bad}
        with pytest.raises(ValueError):
            await store.expire(0, **args)
    with pytest.raises(ValueError):
        await store.expire(P, now=1, retention=1, limit=1)


_examples = itertools.count()
rows_st = st.lists(
    st.tuples(st.sampled_from(STATUSES), st.integers(0, 20), st.integers(0, 20)), max_size=12
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows_st, st.integers(0, 40), st.integers(0, 10), st.integers(1, 4))
async def test_each_backend_expires_exactly_what_the_decision_says(
    tmp_path: Path, rows: list[tuple[TimerStatus, int, int]], now: int, retention: int,
    limit: int,
) -> None:  # fmt: skip
    for backend in ("memory", "rocksdb"):
        folder = tmp_path / f"{backend}-{next(_examples)}"  # a fresh store each example
        url = "memory://" if backend == "memory" else f"rocksdb://{folder}"
        store = open_timer_store(url, partitions=1)
        try:
            held = []
            for n, (status, due, later) in enumerate(rows):
                row = timer(n, due=due)
                await store.put(row)
                final = row.model_copy(update={"status": status, "due_at": due + later})
                if status is not TimerStatus.PENDING:
                    await store.settle([TimerChange(loaded=row, next=final)])
                held.append(final)
            doomed = sorted(
                (t for t in held if expired(t, now, retention)),
                key=lambda t: (finished_at(t.due_at, t.slot_due_at), t.id),
            )
            assert await store.expire(0, now, retention, limit) == min(limit, len(doomed))
            gone = {t.id for t in doomed[:limit]}
            for t in held:
                found = await store.find(t.owner, "k")
                assert (found is None) == (t.id in gone), (backend, t)
        finally:
            await store.close()


async def test_a_store_of_the_older_layout_is_thrown_away_and_restored(tmp_path: Path) -> None:
    """Format 1 kept finished rows under their row key, where no sweep finds them: such a
    copy is dropped on open (its offsets with it, so the node restores the changelog)."""
    folder = tmp_path / "s"
    store = open_timer_store(f"rocksdb://{folder}", partitions=P)
    await store.apply_changelog(0, [(5, b"gone", None)])
    assert store.changelog_offset(0) == 5
    await store.close()
    (folder / "STORE.json").write_text(json.dumps({"format": 1, "partitions": P}))
    reopened = open_timer_store(f"rocksdb://{folder}", partitions=P)
    try:
        assert reopened.changelog_offset(0) is None
        assert json.loads((folder / "STORE.json").read_text())["format"] == 2
    finally:
        await reopened.close()
    with pytest.raises(ValueError, match="partitions"):
        open_timer_store(f"rocksdb://{folder}", partitions=P + 1)
    (folder / "STORE.json").write_text(json.dumps({"format": 3, "partitions": P}))
    with pytest.raises(ValueError, match="format 3"):
        open_timer_store(f"rocksdb://{folder}", partitions=P)
