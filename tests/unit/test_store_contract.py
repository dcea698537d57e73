"""The TimerStore contract (seed 000), run unchanged against every backend."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from tables import (
    DEFAULT_TENANT,
    AggregateRef,
    ChangelogRecord,
    CommandSpec,
    IntervalRule,
    Outcome,
    StoreClosed,
    StoreError,
    Timer,
    TimerChange,
    TimerStatus,
    TimerStore,
    open_timer_store,
)
from tables.keys import row_key
from tables.partitioned import PartitionedStore

P = 4
PENDING, FIRING, FIRED, CANCELLED, PARKED, PAUSED = (
    TimerStatus.PENDING,
    TimerStatus.FIRING,
    TimerStatus.FIRED,
    TimerStatus.CANCELLED,
    TimerStatus.PARKED,
    TimerStatus.PAUSED,
)


def ref(id: str = "o1", tenant: str = DEFAULT_TENANT, **fields: str) -> AggregateRef:
    return AggregateRef(
        context=fields.get("context", "shop"),
        aggregate=fields.get("aggregate", "order"),
        tenant=tenant,
        id=id,
    )


def timer(
    owner: AggregateRef | None = None,
    key: str = "k",
    *,
    id: str | None = None,
    version: int = 1,
    partition: int = 0,
    due: int = 1_000,
    target: AggregateRef | None = None,
    **fields: Any,
) -> Timer:
    owner = owner or ref()
    return Timer(
        id=id or f"{owner.id}/{key}/{version}",
        owner=owner,
        key=key,
        version=version,
        partition=partition,
        rule=IntervalRule(start=due, every=60_000),
        target=target or owner,
        command=CommandSpec(type="Remind", body={"n": 1}),
        slot_due_at=due,
        due_at=due,
        **fields,
    )


def change(loaded: Timer, **next_fields: Any) -> TimerChange:
    return TimerChange(loaded=loaded, next=loaded.model_copy(update=next_fields))


class Sink:
    """Records every call; fails while `failing` is set."""

    def __init__(self) -> None:
        self.calls: list[list[ChangelogRecord]] = []
        self.failing = False

    async def __call__(self, records: list[ChangelogRecord]) -> None:
        if self.failing:
            raise ConnectionError("broker down")
        self.calls.append(list(records))

    @property
    def records(self) -> list[ChangelogRecord]:
        return [record for call in self.calls for record in call]


Opener = Callable[..., Awaitable[TimerStore]]


@pytest.fixture(params=["memory", "rocksdb"])
def backend(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


@pytest.fixture
async def opener(backend: str, tmp_path: Path) -> AsyncIterator[Opener]:
    """`await opener(name=..., partitions=..., changelog=...)`: a store; the same name
    reopens the same RocksDB directory. All are closed at the end."""
    opened: list[TimerStore] = []

    async def open_store(
        name: str = "a", partitions: int = P, changelog: Sink | None = None
    ) -> TimerStore:
        url = "memory://" if backend == "memory" else f"rocksdb://{tmp_path / name}"
        store = open_timer_store(url, partitions=partitions, changelog=changelog)
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        await store.close()


@pytest.fixture
def sink() -> Sink:
    return Sink()


@pytest.fixture
async def store(opener: Opener, sink: Sink) -> TimerStore:
    return await opener(changelog=sink)


async def into(store: TimerStore, t: Timer, status: TimerStatus, **fields: Any) -> Timer:
    """Puts `t` and moves it to `status` as the store's callers would; the row held."""
    assert await store.put(t)
    if status is CANCELLED:
        assert await store.cancel(t.owner, t.key, t.version)
    elif status is PAUSED:
        assert await store.pause(t.owner, t.key, t.version)
    elif status is not PENDING:
        assert await store.settle([change(t, status=status, **fields)]) == 1
    held = await store.find(t.owner, t.key)
    assert held is not None and held.status is status
    return held


def ids(timers: list[Timer]) -> list[str]:
    return [t.id for t in timers]


# --- key --------------------------------------------------------------------------------


async def test_put_writes_pending_and_find_returns_it(store: TimerStore) -> None:
    t = timer()
    assert await store.put(t)
    assert await store.find(t.owner, t.key) == t


async def test_put_writes_pending_whatever_status_it_carries(store: TimerStore) -> None:
    t = timer(status=FIRING)
    assert await store.put(t)
    assert await store.find(t.owner, t.key) == t.model_copy(update={"status": PENDING})


async def test_find_of_an_absent_key_is_none(store: TimerStore) -> None:
    await store.put(timer(key="a"))
    assert await store.find(ref(), "b") is None
    assert await store.find(ref("o2"), "a") is None


@pytest.mark.parametrize("field", ["context", "aggregate", "tenant", "id"])
async def test_owners_are_compared_field_by_field(store: TimerStore, field: str) -> None:
    one = ref("o1", tenant="t1", context="shop", aggregate="order")
    other = one.model_copy(update={field: one.model_dump()[field] + "x"})
    first, second = timer(one, id="first"), timer(other, id="second")
    assert await store.put(first)
    assert await store.put(second)
    assert await store.find(one, "k") == first
    assert await store.find(other, "k") == second
    assert await store.cancel(other, "k", 5)
    assert (await store.find(one, "k")) == first
    assert await store.cancel_all(one, 5) == 1
    assert ids(await store.due(set(range(P)), 10_000, 10)) == []


async def test_an_owners_keys_are_distinct(store: TimerStore) -> None:
    a, b = timer(key="a"), timer(key="b")
    assert await store.put(a)
    assert await store.put(b)
    assert await store.find(ref(), "a") == a
    assert await store.find(ref(), "b") == b


async def test_owner_ids_that_prefix_each_other_stay_apart(store: TimerStore) -> None:
    assert await store.put(timer(ref("o1"), key="1"))
    assert await store.put(timer(ref("o11"), key="x"))
    assert await store.cancel_all(ref("o1"), 9) == 1
    held = await store.find(ref("o11"), "x")
    assert held is not None and held.status is PENDING


# --- put: idempotent, ordered --------------------------------------------------------


@pytest.mark.parametrize("status", list(TimerStatus))
@pytest.mark.parametrize("version", [1, 2])
async def test_put_of_the_same_timer_again_does_nothing(
    store: TimerStore, status: TimerStatus, version: int
) -> None:
    t = timer(version=1)
    held = await into(store, t, status, due_at=5_000)
    assert not await store.put(t.model_copy(update={"version": version}))
    assert await store.find(t.owner, t.key) == held


async def test_put_older_than_the_held_version_does_nothing(store: TimerStore) -> None:
    held = timer(version=5)
    assert await store.put(held)
    assert not await store.put(timer(id="older", version=4, due=10))
    assert await store.find(held.owner, held.key) == held
    assert ids(await store.due(set(range(P)), 100, 10)) == []


async def test_put_at_the_held_version_with_a_new_id_writes(store: TimerStore) -> None:
    # The key set twice in one command: the last set wins.
    assert await store.put(timer(version=5))
    same = timer(id="same-version", version=5, due=2_000)
    assert await store.put(same)
    assert await store.find(same.owner, same.key) == same


async def test_put_at_the_held_version_of_the_same_timer_under_a_new_id_keeps_it(
    store: TimerStore,
) -> None:
    # Its set written again (a producer's retry), read before it fired: passed over, so
    # the timer keeps its id and request id (`tables.writes.rewritten`).
    held = timer(version=5)
    assert await store.put(held)
    assert not await store.put(timer(id="retried", version=5))
    assert await store.find(held.owner, held.key) == held


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (FIRING, None),
        (FIRED, Outcome.COMMITTED),
        (PARKED, Outcome.FAILED),
        (PENDING, Outcome.COMMITTED),  # a recurring timer whose slot fired
    ],
)
async def test_put_at_the_held_version_with_a_new_id_never_revives_what_sent_at_it(
    store: TimerStore, status: TimerStatus, outcome: Outcome | None
) -> None:
    # The set read again under another id (a producer's retry that wrote the event anew):
    # written, it would send the timer's command again.
    t = timer(version=5)
    if status is PENDING:
        assert await store.put(t)
        fired = t.model_copy(update={"slot": 1, "slot_due_at": 61_000, "due_at": 61_000})
        assert await store.settle([change(t, outcome=outcome, **_slot(fired))]) == 1
        held = await store.find(t.owner, t.key)
    else:
        held = await into(store, t, status, outcome=outcome)
    assert not await store.put(timer(id="retried", version=5))
    assert await store.find(t.owner, t.key) == held
    # A later version is a new timer whatever the held one did.
    later = timer(id="later", version=6)
    assert await store.put(later)
    assert await store.find(t.owner, t.key) == later


@pytest.mark.parametrize("status", [CANCELLED, PAUSED])
async def test_put_at_the_held_version_after_its_cancel_or_pause_writes(
    store: TimerStore, status: TimerStatus
) -> None:
    # One command's events: the key cancelled (or paused) and set again, the last one wins.
    t = timer(version=5)
    assert await store.put(t)
    assert await store.settle([change(t, outcome=Outcome.COMMITTED)]) == 1
    held = await store.find(t.owner, t.key)
    assert held is not None
    if status is CANCELLED:
        assert await store.cancel(t.owner, t.key, 5)
    else:
        assert await store.pause(t.owner, t.key, 5)
    again = timer(id="again", version=5)
    assert await store.put(again)
    assert await store.find(t.owner, t.key) == again


def _slot(t: Timer) -> dict[str, Any]:
    return {"slot": t.slot, "slot_due_at": t.slot_due_at, "due_at": t.due_at}


async def test_put_many_is_each_put_in_turn(opener: Opener) -> None:
    """One batch (rows read at once, per partition) writes what its puts one by one do:
    the same row twice, rows of several partitions, rows held before at other versions."""
    a, b, c = ref("a"), ref("b"), ref("c")
    before = [timer(a, version=3, partition=0), timer(c, "x", version=9, partition=2)]
    batch = [
        timer(a, version=2, partition=0),  # older than held: nothing
        timer(b, version=1, partition=1),
        timer(a, version=4, partition=0, due=4_000),
        timer(b, id="again", version=1, partition=1),  # the row just put again: nothing
        timer(b, id="other", version=1, partition=1, due=5_000),  # another timer at it
        timer(a, version=4, partition=0, due=4_000),  # the same timer again: nothing
        timer(c, "x", version=9, partition=2, id="c/x/9"),  # this very timer: nothing
        timer(c, "y", version=1, partition=2),
    ]
    one, many = await opener("one"), await opener("many")
    for store in (one, many):
        for t in before:
            assert await store.put(t)
    written = [t for t in batch if await one.put(t)]
    assert await many.put_many(batch) == written
    assert ids(written) == ["b/k/1", "a/k/4", "other", "c/y/1"]
    for owner, key in ((a, "k"), (b, "k"), (c, "x"), (c, "y")):
        assert await many.find(owner, key) == await one.find(owner, key)
    assert ids(await many.due(set(range(P)), 10_000, 10)) == ids(
        await one.due(set(range(P)), 10_000, 10)
    )


async def test_reschedule_replaces_the_timer_and_its_due_entry(store: TimerStore) -> None:
    assert await store.put(timer(id="old", version=1, due=1_000))
    new = timer(id="new", version=2, due=2_000)
    assert await store.put(new)
    assert await store.find(new.owner, new.key) == new
    assert await store.due({0}, 1_500, 10) == []
    assert await store.due({0}, 2_000, 10) == [new]


@pytest.mark.parametrize("status", [FIRED, CANCELLED])
async def test_a_replayed_older_put_never_revives(store: TimerStore, status: TimerStatus) -> None:
    t = timer(id="a", version=2)
    held = await into(store, t, status)
    for replay in (t, timer(id="b", version=1), t.model_copy(update={"version": 3})):
        assert not await store.put(replay)
    assert await store.find(t.owner, t.key) == held


async def test_a_cancelled_row_takes_the_cancels_version(store: TimerStore) -> None:
    t = timer(id="a", version=1)
    assert await store.put(t)
    assert await store.cancel(t.owner, t.key, 3)
    assert not await store.put(timer(id="b", version=2))
    assert not await store.put(t)
    held = await store.find(t.owner, t.key)
    assert held is not None and (held.status, held.version) == (CANCELLED, 3)
    later = timer(id="c", version=4)
    assert await store.put(later)
    assert await store.find(t.owner, t.key) == later


# --- cancel -----------------------------------------------------------------------------


@pytest.mark.parametrize("status", [PENDING, FIRING, PARKED, PAUSED])
async def test_cancel_cancels_an_active_timer(store: TimerStore, status: TimerStatus) -> None:
    t = timer(version=2, target=ref("target"))
    held = await into(store, t, status)
    assert await store.cancel(t.owner, t.key, 7)
    cancelled = await store.find(t.owner, t.key)
    assert cancelled == held.model_copy(
        update={"status": CANCELLED, "outcome": Outcome.CANCELLED, "version": 7}
    )
    assert await store.due(set(range(P)), 10**12, 10) == []
    assert await store.parked(ref("target")) == []


@pytest.mark.parametrize("status", [FIRED, CANCELLED])
async def test_cancel_leaves_a_finished_timer(store: TimerStore, status: TimerStatus) -> None:
    t = timer()
    held = await into(store, t, status)
    assert not await store.cancel(t.owner, t.key, 9)
    assert await store.find(t.owner, t.key) == held


async def test_cancel_older_than_the_held_version_does_nothing(store: TimerStore) -> None:
    t = timer(version=5)
    assert await store.put(t)
    assert not await store.cancel(t.owner, t.key, 4)
    assert await store.find(t.owner, t.key) == t
    assert await store.cancel(t.owner, t.key, 5)


async def test_cancel_of_an_absent_key_does_nothing(store: TimerStore, sink: Sink) -> None:
    assert not await store.cancel(ref(), "nothing", 1)
    assert await store.find(ref(), "nothing") is None
    assert sink.calls == []


# --- pause and resume ---------------------------------------------------------------------


@pytest.mark.parametrize("status", [PENDING, FIRING])
async def test_a_paused_timer_is_in_no_index_and_never_due(
    store: TimerStore, status: TimerStatus
) -> None:
    t = timer(version=2, due=1_000, target=ref("target"))
    held = await into(store, t, status, due_at=1_500)
    assert await store.pause(t.owner, t.key, 3)
    paused = await store.find(t.owner, t.key)
    # A FIRING row's claim is given up: due at its slot's own time when resumed.
    due_at = held.due_at if status is PENDING else held.slot_due_at
    assert paused == held.model_copy(update={"status": PAUSED, "version": 3, "due_at": due_at})
    assert await store.due(set(range(P)), 10**12, 10) == []
    assert await store.parked(ref("target")) == []
    assert store.status_counts(0) == {PENDING: 0, FIRING: 0, PARKED: 0, PAUSED: 1}
    census = await store.census(0, 10**12)
    assert (census.pending, census.firing) == (0, 0)
    # Retention never sweeps a paused row: it is not finished.
    assert await store.expire(0, 10**12, 0, 10) == 0
    assert await store.timers_of(t.owner) == [paused]


@pytest.mark.parametrize("status", [PAUSED, FIRED, CANCELLED])
async def test_pause_leaves_a_timer_it_cannot_hold(store: TimerStore, status: TimerStatus) -> None:
    t = timer(target=ref("target"))
    held = await into(store, t, status)
    assert not await store.pause(t.owner, t.key, 9)
    assert await store.find(t.owner, t.key) == held


async def test_a_parked_timer_paused_leaves_the_parked_index_and_its_resume_parks_it_again(
    opener: Opener, sink: Sink
) -> None:
    """Before, a pause left a PARKED row as it was (its owner's pause committed all the
    same), so an operator's retry, which reads `parked`, fired the timer it held paused."""
    store = await opener(changelog=sink)
    t = timer(version=2, target=ref("target"))
    held = await into(store, t, PARKED, outcome=Outcome.FAILED, attempts=5)
    assert await store.pause(t.owner, t.key, 3)
    paused = held.model_copy(update={"status": PAUSED, "version": 3, "parked_when_paused": True})
    assert await store.find(t.owner, t.key) == paused
    assert await store.parked(ref("target")) == [], "an operator's retry finds nothing"
    assert await store.due(set(range(P)), 10**12, 10) == []
    assert store.status_counts(0) == {PENDING: 0, FIRING: 0, PARKED: 0, PAUSED: 1}
    census = await store.census(0, 10**12)
    assert (census.parked, census.parked_timers) == (0, ())
    assert await store.expire(0, 10**12, 0, 10) == 0, "retention never sweeps it"
    assert not await store.pause(t.owner, t.key, 4), "paused already"
    # The changelog carries the mark: a restore makes the same row.
    restored = await opener("restored")
    for offset, record in enumerate(sink.records):
        await restored.apply_changelog(record.partition, [(offset, record.key, record.value)])
    assert await restored.find(t.owner, t.key) == paused
    assert await restored.parked(ref("target")) == []
    # Resumed, whenever: PARKED again as it was, for an operator's retry; nothing due.
    for s in (store, restored):
        resumed = await s.resume(t.owner, t.key, 4, 10**12)
        assert resumed == held.model_copy(update={"version": 4})
        assert await s.find(t.owner, t.key) == resumed
        assert await s.parked(ref("target")) == [resumed]
        assert await s.due(set(range(P)), 10**12, 10) == []
        assert s.status_counts(0) == {PENDING: 0, FIRING: 0, PARKED: 1, PAUSED: 0}


async def test_a_parked_timer_paused_and_cancelled_is_cancelled_unmarked(
    store: TimerStore,
) -> None:
    t = timer(version=2, target=ref("target"))
    held = await into(store, t, PARKED, outcome=Outcome.FAILED)
    assert await store.pause(t.owner, t.key, 3)
    assert await store.cancel(t.owner, t.key, 4)
    assert await store.find(t.owner, t.key) == held.model_copy(
        update={"status": CANCELLED, "outcome": Outcome.CANCELLED, "version": 4}
    )
    assert await store.resume(t.owner, t.key, 5, 10**12) is None
    assert await store.parked(ref("target")) == []


async def test_pause_and_resume_of_an_absent_key_do_nothing(store: TimerStore, sink: Sink) -> None:
    assert not await store.pause(ref(), "nothing", 1)
    assert await store.resume(ref(), "nothing", 1, 0) is None
    assert sink.calls == []


async def test_pause_and_resume_older_than_the_held_version_do_nothing(
    store: TimerStore,
) -> None:
    t = timer(version=5)
    assert await store.put(t)
    assert not await store.pause(t.owner, t.key, 4)
    assert await store.pause(t.owner, t.key, 6)
    assert await store.resume(t.owner, t.key, 5, 0) is None
    held = await store.find(t.owner, t.key)
    assert held is not None and held.status is PAUSED
    # a replayed older put never revives it either
    assert not await store.put(t)


@pytest.mark.parametrize("status", [PENDING, FIRING, PARKED, FIRED, CANCELLED])
async def test_resume_leaves_a_timer_that_is_not_paused(
    store: TimerStore, status: TimerStatus
) -> None:
    t = timer(target=ref("target"))
    held = await into(store, t, status)
    assert await store.resume(t.owner, t.key, 9, 10**9) is None
    assert await store.find(t.owner, t.key) == held


async def test_resume_puts_the_timer_back_in_the_due_index_caught_up(store: TimerStore) -> None:
    t = timer(version=1, due=1_000)  # every minute from 1,000
    assert await store.put(t)
    assert await store.pause(t.owner, t.key, 2)
    resumed = await store.resume(t.owner, t.key, 3, 1_000 + 3 * 60_000 + 5)
    # A coalescing rule: the latest slot due, the three before it skipped.
    expected = t.model_copy(
        update={
            "version": 3,
            "slot": 3,
            "slot_due_at": 181_000,
            "due_at": 181_000,
            "skipped": 3,
        }
    )
    assert resumed == expected
    assert await store.find(t.owner, t.key) == expected
    assert await store.due(set(range(P)), 10**12, 10) == [expected]
    assert store.status_counts(0) == {PENDING: 1, FIRING: 0, PARKED: 0, PAUSED: 0}


async def test_a_put_replaces_a_paused_timer(store: TimerStore) -> None:
    t = timer(version=1)
    assert await store.put(t)
    assert await store.pause(t.owner, t.key, 2)
    again = timer(version=3)
    assert await store.put(again)
    assert await store.find(t.owner, t.key) == again
    assert await store.due(set(range(P)), 10**12, 10) == [again]


async def test_cancel_all_cancels_the_owners_active_timers(store: TimerStore) -> None:
    owner, other = ref("o1", tenant="t1"), ref("o1", tenant="t2")
    for status, key in zip(TimerStatus, "abcdef", strict=True):
        await into(store, timer(owner, key), status)
    untouched = timer(other, "a")
    assert await store.put(untouched)
    assert await store.cancel_all(owner, 2) == 4
    statuses = {key: (await store.find(owner, key)) for key in "abcdef"}
    assert {k: t.status for k, t in statuses.items() if t} == {
        "a": CANCELLED,
        "b": CANCELLED,
        "c": FIRED,
        "d": CANCELLED,
        "e": CANCELLED,
        "f": CANCELLED,
    }
    versions = {k: t.version for k, t in statuses.items() if t}
    assert versions == {"a": 2, "b": 2, "c": 1, "d": 1, "e": 2, "f": 2}  # c, d: not again
    assert await store.find(other, "a") == untouched
    assert await store.cancel_all(owner, 2) == 0


async def test_cancel_all_skips_timers_held_at_a_later_version(store: TimerStore) -> None:
    assert await store.put(timer(key="old", version=2))
    newer = timer(key="new", version=5)
    assert await store.put(newer)
    assert await store.cancel_all(ref(), 3) == 1
    assert await store.find(ref(), "new") == newer


async def test_cancel_all_of_an_owner_without_timers_is_zero(store: TimerStore, sink: Sink) -> None:
    assert await store.cancel_all(ref("nobody"), 1) == 0
    assert sink.calls == []


# --- settle -----------------------------------------------------------------------------


async def test_settle_writes_next_while_the_row_is_as_loaded(store: TimerStore) -> None:
    t = timer()
    assert await store.put(t)
    claim = change(t, status=FIRING, due_at=31_000)
    assert await store.settle([claim]) == 1
    assert await store.find(t.owner, t.key) == claim.next


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("id", "another-id"),
        ("status", FIRING),
        ("slot", 3),
        ("slot_due_at", 999),
        ("attempts", 2),
        ("due_at", 1_001),
    ],
)
async def test_settle_does_nothing_unless_each_field_is_as_loaded(
    store: TimerStore, field: str, value: Any
) -> None:
    t = timer()
    assert await store.put(t)
    loaded = t.model_copy(update={field: value})
    assert await store.settle([change(loaded, status=FIRED, outcome=Outcome.COMMITTED)]) == 0
    assert await store.find(t.owner, t.key) == t


async def test_settle_compares_only_those_six_fields(store: TimerStore) -> None:
    t = timer()
    assert await store.put(t)
    loaded = t.model_copy(update={"skipped": 4, "outcome": Outcome.BUSY, "version": 9})
    assert await store.settle([change(loaded, attempts=1, due_at=2_000)]) == 1
    held = await store.find(t.owner, t.key)
    assert held is not None and (held.attempts, held.due_at, held.version) == (1, 2_000, 1)


async def test_settle_writes_the_seeds_fields_of_next(store: TimerStore) -> None:
    t = timer()
    assert await store.put(t)
    fields = {
        "status": PENDING,
        "slot": 4,
        "slot_due_at": 241_000,
        "skipped": 2,
        "due_at": 241_000,
        "attempts": 0,
        "outcome": Outcome.COMMITTED,
    }
    assert await store.settle([change(t, **fields)]) == 1
    assert await store.find(t.owner, t.key) == t.model_copy(update=fields)


async def test_settle_writes_and_clears_the_last_error_of_next(
    store: TimerStore, sink: Sink
) -> None:
    """#22: the error a decision sets is what the row and its changelog record hold; a row
    without one is written without the fields (byte for byte as before they existed)."""
    t = timer()
    assert await store.put(t)
    error = {"error_code": "ERROR", "error_text": "ValueError: out of stock"}
    failed = change(t, status=PARKED, attempts=5, outcome=Outcome.FAILED, **error)
    assert await store.settle([failed]) == 1
    held = await store.find(t.owner, t.key)
    assert held == failed.next and held is not None
    assert (await store.parked(t.target)) == [held]
    written = orjson.loads(sink.records[-1].value or b"{}")
    assert {k: written[k] for k in error} == error
    done = change(held, status=FIRED, outcome=Outcome.COMMITTED, error_code=None, error_text=None)
    assert await store.settle([done]) == 1
    assert await store.find(t.owner, t.key) == done.next
    assert b"error_" not in (sink.records[-1].value or b"error_")


async def test_settle_of_an_absent_row_does_nothing(store: TimerStore, sink: Sink) -> None:
    assert await store.settle([change(timer(), status=FIRING)]) == 0
    assert await store.find(ref(), "k") is None
    assert sink.calls == []
    assert await store.settle([]) == 0


async def test_settle_counts_the_changes_it_wrote(store: TimerStore, sink: Sink) -> None:
    timers = [timer(key=f"k{i}", partition=i % P, owner=ref(f"o{i}")) for i in range(6)]
    for t in timers:
        assert await store.put(t)
    stale = [t.model_copy(update={"attempts": 5}) for t in timers[:2]]
    changes = [change(t, status=FIRING, due_at=50_000) for t in stale + timers[2:]]
    sink.calls.clear()
    assert await store.settle(changes) == 4
    assert len(sink.calls) == 1 and len(sink.calls[0]) == 4
    assert sorted(ids(await store.due(set(range(P)), 1_000, 10))) == ids(timers[:2])


async def test_settle_applies_two_changes_of_one_row_in_order(store: TimerStore) -> None:
    t = timer()
    assert await store.put(t)
    claim = change(t, status=FIRING, due_at=31_000)
    outcome = change(claim.next, status=FIRED, outcome=Outcome.COMMITTED)
    late = change(t, status=FIRING, due_at=99_000)  # loaded before the claim: stale
    assert await store.settle([claim, outcome, late]) == 2
    assert await store.find(t.owner, t.key) == outcome.next


async def test_settle_of_a_change_to_another_row_is_a_value_error(store: TimerStore) -> None:
    t = timer()
    assert await store.put(t)
    good = change(t, status=FIRING)
    for bad in (
        TimerChange(loaded=t, next=t.model_copy(update={"key": "other"})),
        TimerChange(loaded=t, next=t.model_copy(update={"owner": ref("o2")})),
        TimerChange(loaded=t, next=t.model_copy(update={"partition": 1})),
    ):
        with pytest.raises(ValueError, match="keep its row"):
            await store.settle([good, bad])
    assert await store.find(t.owner, t.key) == t


async def test_a_claim_then_a_cancel_makes_the_outcome_fail(store: TimerStore) -> None:
    t = timer()
    assert await store.put(t)
    [loaded] = await store.due({0}, 1_000, 10)
    claim = change(loaded, status=FIRING, due_at=31_000)
    assert await store.settle([claim]) == 1
    assert await store.cancel(t.owner, t.key, 2)
    assert await store.settle([change(claim.next, status=FIRED)]) == 0
    held = await store.find(t.owner, t.key)
    assert held is not None and held.status is CANCELLED


async def test_a_timer_cancelled_after_it_was_loaded_is_never_claimed(store: TimerStore) -> None:
    t = timer()
    assert await store.put(t)
    [loaded] = await store.due({0}, 1_000, 10)
    assert await store.cancel(t.owner, t.key, 1)
    assert await store.settle([change(loaded, status=FIRING, due_at=31_000)]) == 0


async def test_a_reschedule_after_the_load_makes_the_settle_fail(store: TimerStore) -> None:
    t = timer()
    assert await store.put(t)
    [loaded] = await store.due({0}, 1_000, 10)
    new = timer(id="rescheduled", version=2, due=9_000)
    assert await store.put(new)
    assert await store.settle([change(loaded, status=FIRING, due_at=31_000)]) == 0
    assert await store.find(t.owner, t.key) == new


async def test_a_lapsed_claim_is_due_again_and_claimed_anew(store: TimerStore) -> None:
    t = timer(due=1_000)
    assert await store.put(t)
    claim = change(t, status=FIRING, due_at=5_000)
    assert await store.settle([claim]) == 1
    assert await store.due({0}, 4_999, 10) == []
    assert await store.due({0}, 5_000, 10) == [claim.next]
    again = change(claim.next, status=FIRING, due_at=9_000)
    assert await store.settle([again]) == 1
    assert await store.settle([change(claim.next, status=FIRING, due_at=9_500)]) == 0
    held = await store.find(t.owner, t.key)
    assert held == again.next and held.slot_due_at == 1_000


async def test_an_outcome_moves_a_recurring_timer_to_its_next_slot(store: TimerStore) -> None:
    t = timer(due=1_000)
    assert await store.put(t)
    claim = change(t, status=FIRING, due_at=31_000)
    assert await store.settle([claim]) == 1
    moved = change(
        claim.next, status=PENDING, slot=1, slot_due_at=61_000, due_at=61_000,
        outcome=Outcome.COMMITTED,
    )  # fmt: skip
    assert await store.settle([moved]) == 1
    assert await store.due({0}, 60_999, 10) == []
    assert await store.due({0}, 61_000, 10) == [moved.next]


async def test_parking_and_retrying_moves_a_timer_between_indexes(store: TimerStore) -> None:
    target = ref("target")
    t = timer(target=target)
    assert await store.put(t)
    park = change(t, status=PARKED, outcome=Outcome.FAILED, attempts=5)
    assert await store.settle([park]) == 1
    assert await store.due({0}, 10**12, 10) == []
    assert await store.parked(target) == [park.next]
    retry = change(park.next, status=PENDING, attempts=0, due_at=2_000)
    assert await store.settle([retry]) == 1
    assert await store.parked(target) == []
    assert await store.due({0}, 2_000, 10) == [retry.next]


# --- due --------------------------------------------------------------------------------


async def test_due_is_earliest_first_ties_by_id_across_partitions(store: TimerStore) -> None:
    specs = [("c", 2_000, 0), ("b", 1_000, 1), ("a", 2_000, 2), ("d", 1_000, 3), ("e", 500, 1)]
    for i, (timer_id, due, partition) in enumerate(specs):
        assert await store.put(timer(ref(f"o{i}"), id=timer_id, due=due, partition=partition))
    assert ids(await store.due(set(range(P)), 10_000, 10)) == ["e", "b", "d", "a", "c"]


async def test_due_ties_by_id_in_code_point_order(store: TimerStore) -> None:
    names = ["a", "a\x00", "a\x00b", "a\x01", "ab", "b", "é", "z", "~", "\u4e2d", "A"]
    for i, name in enumerate(names):
        assert await store.put(timer(ref(f"o{i}"), id=name, partition=i % P))
    assert ids(await store.due(set(range(P)), 1_000, 100)) == sorted(names)


async def test_due_stops_at_limit_and_until(store: TimerStore) -> None:
    for i in range(10):
        assert await store.put(timer(ref(f"o{i}"), id=f"t{i}", due=100 * i, partition=i % P))
    every = set(range(P))
    assert ids(await store.due(every, 10_000, 3)) == ["t0", "t1", "t2"]
    assert ids(await store.due(every, 400, 100)) == ["t0", "t1", "t2", "t3", "t4"]
    assert ids(await store.due(every, 399, 100)) == ["t0", "t1", "t2", "t3"]
    assert ids(await store.due(every, 400, 1)) == ["t0"]


async def test_due_finds_what_was_written_before_what_it_found(store: TimerStore) -> None:
    late = timer(ref("late"), id="late", due=1_000)
    assert await store.put(late)
    assert await store.due({0}, 500, 10) == []
    assert await store.due({0}, 2_000, 10) == [late]
    early = timer(ref("early"), id="early", due=100)
    assert await store.put(early)
    assert await store.due({0}, 2_000, 10) == [early, late]
    claim = change(early, status=FIRING, due_at=50)  # a claim may move it earlier too
    assert await store.settle([claim]) == 1
    assert await store.due({0}, 2_000, 10) == [claim.next, late]
    x = timer(ref("x"), due=7)
    await store.apply_changelog(0, [(0, row_key(x.owner, x.key), encode(x))])
    assert await store.due({0}, 2_000, 10) == [x, claim.next, late]


async def test_due_reads_only_the_partitions_asked(store: TimerStore) -> None:
    for i in range(8):
        assert await store.put(timer(ref(f"o{i}"), id=f"t{i}", due=i, partition=i % P))
    assert ids(await store.due({1, 3}, 100, 100)) == ["t1", "t3", "t5", "t7"]
    assert ids(await store.due({2}, 100, 100)) == ["t2", "t6"]
    assert await store.due(set(), 100, 100) == []


async def test_finished_and_parked_timers_are_never_due(store: TimerStore) -> None:
    for i, status in enumerate(TimerStatus):
        await into(store, timer(ref(f"o{i}"), id=status.value), status, due_at=1_000)
    assert ids(await store.due(set(range(P)), 10**12, 100)) == ["FIRING", "PENDING"]


async def test_a_firing_timer_is_due_by_its_claim_deadline(store: TimerStore) -> None:
    t = timer(due=1_000)
    assert await store.put(t)
    assert await store.settle([change(t, status=FIRING, due_at=60_000)]) == 1
    assert await store.due({0}, 59_999, 10) == []
    assert len(await store.due({0}, 60_000, 10)) == 1


@pytest.mark.parametrize(
    ("partitions", "until", "limit", "error"),
    [
        ({P}, 0, 1, "partition"),
        ({-1}, 0, 1, "partition"),
        ({0}, 0, 0, "limit"),
        ({0}, 0, -5, "limit"),
    ],
)
async def test_due_rejects_bad_arguments(
    store: TimerStore, partitions: set[int], until: int, limit: int, error: str
) -> None:
    with pytest.raises(ValueError, match=error):
        await store.due(partitions, until, limit)


# --- parked -----------------------------------------------------------------------------


async def test_parked_lists_a_targets_parked_timers_earliest_first(store: TimerStore) -> None:
    target, other = ref("target"), ref("target", tenant="t2")
    specs = [("p3", 3_000, target), ("p1", 1_000, target), ("p0", 1_000, target)]
    specs += [("x", 500, other)]
    for i, (timer_id, due, to) in enumerate(specs):
        t = timer(ref(f"o{i}"), id=timer_id, due=due, target=to, partition=i % P)
        await into(store, t, PARKED)
    await into(store, timer(ref("o9"), id="pending", target=target), PENDING)
    await into(store, timer(ref("o8"), id="fired", target=target), FIRED)
    assert ids(await store.parked(target)) == ["p0", "p1", "p3"]
    assert ids(await store.parked(other)) == ["x"]
    assert await store.parked(ref("nobody")) == []


# --- timers_of and census (read-only, for the operator page) -----------------------------


async def test_timers_of_lists_an_owners_rows_in_every_status_by_key(store: TimerStore) -> None:
    owner = ref("o1")
    statuses = {"a": PENDING, "b": FIRED, "c": PARKED, "d": CANCELLED, "e": FIRING}
    for key, status in reversed(statuses.items()):
        await into(store, timer(owner, key, partition=2), status)
    await into(store, timer(ref("o10"), "a", partition=2), PENDING)  # o1 prefixes o10
    await into(store, timer(ref("o1", tenant="t2"), "a", partition=2), PENDING)
    got = await store.timers_of(owner)
    assert [(t.key, t.status) for t in got] == list(statuses.items())
    assert await store.timers_of(ref("nobody")) == []
    await store.revoke({2})
    assert await store.timers_of(owner) == []  # only the partitions served


async def test_owner_timers_holds_a_bounded_few_live_ones_first(store: TimerStore) -> None:
    """The operator page's read of an owner (F2): however many rows it keeps, at most
    `limit` are held, the live ones before the finished, of at most `scan_limit` read."""
    owner = ref("o1")
    statuses = [FIRED, PENDING, CANCELLED, PARKED, FIRED, PENDING, PAUSED, CANCELLED]
    for i, status in enumerate(statuses):
        await into(store, timer(owner, f"k{i}", partition=2), status)
    got = await store.owner_timers(owner, limit=5, scan_limit=100)
    assert [(t.key, t.status) for t in got.timers] == [
        ("k1", PENDING), ("k3", PARKED), ("k5", PENDING), ("k6", PAUSED), ("k0", FIRED),
    ]  # fmt: skip
    assert (got.total, got.complete, got.cut) == (8, True, True)
    whole = await store.owner_timers(owner, limit=8, scan_limit=8)
    assert (len(whole.timers), whole.total, whole.cut) == (8, 8, False)
    stopped = await store.owner_timers(owner, limit=2, scan_limit=3)
    assert [t.key for t in stopped.timers] == ["k1", "k0"]
    assert (stopped.total, stopped.complete) == (3, False)
    assert (await store.owner_timers(ref("nobody"), limit=1, scan_limit=1)).total == 0
    with pytest.raises(ValueError):
        await store.owner_timers(owner, limit=0, scan_limit=1)


async def test_census_counts_a_partitions_active_timers_and_its_due_times(
    store: TimerStore,
) -> None:
    target = ref("target")
    specs = [
        ("pending-late", 1_000, PENDING),
        ("pending-later", 1_500, PENDING),
        ("firing", 900, FIRING),
        ("pending-next", 5_000, PENDING),
        ("pending-last", 9_000, PENDING),
        ("parked-b", 3_000, PARKED),
        ("parked-a", 2_000, PARKED),
        ("fired", 100, FIRED),
        ("cancelled", 100, CANCELLED),
    ]
    for i, (timer_id, due, status) in enumerate(specs):
        t = timer(ref(f"o{i}"), id=timer_id, due=due, partition=1, target=target)
        await into(store, t, status)
    await into(store, timer(ref("elsewhere"), id="p0", due=10, partition=0), PENDING)
    c = await store.census(1, now=2_000)
    assert (c.partition, c.pending, c.firing, c.parked, c.complete) == (1, 4, 1, 2, True)
    assert (c.oldest_overdue, c.next_due) == (1_000, 5_000)
    assert ids(list(c.parked_timers)) == ["parked-a", "parked-b"]
    assert all(t.status is PARKED for t in c.parked_timers)
    # Nothing overdue before the first due time, nothing next after the last.
    early, late = await store.census(1, now=999), await store.census(1, now=9_000)
    assert (early.oldest_overdue, early.next_due) == (None, 1_000)
    assert (late.oldest_overdue, late.next_due) == (1_000, None)
    assert (await store.census(1, 2_000, parked_limit=1)).parked_timers == c.parked_timers[:1]
    empty = await store.census(3, now=2_000)
    assert (empty.pending, empty.firing, empty.parked, empty.complete) == (0, 0, 0, True)
    assert (empty.oldest_overdue, empty.next_due, empty.parked_timers) == (None, None, ())


async def test_census_lists_parked_timers_by_target_then_due(store: TimerStore) -> None:
    first, second = ref("a-target"), ref("b-target")
    specs = [("x", 5_000, second), ("y", 1_000, second), ("z", 9_000, first), ("w", 100, first)]
    for i, (timer_id, due, to) in enumerate(specs):
        await into(store, timer(ref(f"o{i}"), id=timer_id, due=due, target=to), PARKED)
    c = await store.census(0, now=0)
    assert ids(list(c.parked_timers)) == ["w", "z", "y", "x"]


async def test_census_stops_counting_past_its_limit(store: TimerStore) -> None:
    for i, due in enumerate([100, 200, 300, 5_000, 6_000]):
        await into(store, timer(ref(f"o{i}"), id=f"t{i}", due=due), PENDING)
    for i in range(3):
        await into(store, timer(ref(f"p{i}"), id=f"p{i}", target=ref("x")), PARKED)
    exact = await store.census(0, now=1_000, limit=5)
    assert (exact.pending, exact.parked, exact.complete) == (5, 3, True)
    cut = await store.census(0, now=1_000, limit=2, parked_limit=1)
    assert (cut.pending, cut.parked, cut.complete) == (2, 2, False)
    # The count stopped before `now`: the next due time is still found past it.
    assert (cut.oldest_overdue, cut.next_due) == (100, 5_000)
    assert ids(list(cut.parked_timers)) == ["p0"]


@pytest.mark.parametrize("now", [2**64 - 2, 2**64 - 1, 2**64, 2**70])
async def test_census_at_a_time_past_every_due_key_is_no_error(store: TimerStore, now: int) -> None:
    """A count cut short looks past `now` for the next due time: past the due index's
    largest key (2^64-1) there is none, as in the memory store."""
    for i in range(2):
        await into(store, timer(ref(f"o{i}"), id=f"t{i}", due=100 + i), PENDING)
    cut = await store.census(0, now=now, limit=1)
    assert (cut.pending, cut.complete, cut.oldest_overdue, cut.next_due) == (1, False, 100, None)
    whole = await store.census(0, now=now)
    assert (whole.pending, whole.complete, whole.oldest_overdue) == (2, True, 100)


@pytest.mark.parametrize(
    ("partition", "now", "limit", "parked_limit"),
    [(P, 0, 1, 1), (-1, 0, 1, 1), (0, -1, 1, 1), (0, 0, 0, 1), (0, 0, 1, -1), (0, True, 1, 1)],
)
async def test_census_rejects_bad_arguments(
    store: TimerStore, partition: int, now: int, limit: int, parked_limit: int
) -> None:
    with pytest.raises(ValueError):
        await store.census(partition, now, limit=limit, parked_limit=parked_limit)


async def test_census_of_a_revoked_partition_is_store_closed(store: TimerStore) -> None:
    await store.revoke({1})
    with pytest.raises(StoreClosed, match="partition 1"):
        await store.census(1, 0)


# --- partitions -------------------------------------------------------------------------


async def test_a_timer_outside_the_partitions_is_a_value_error(store: TimerStore) -> None:
    t = timer(partition=P)
    with pytest.raises(ValueError, match="partition"):
        await store.put(t)
    with pytest.raises(ValueError, match="partition"):
        await store.settle([change(t, status=FIRING)])
    with pytest.raises(ValueError, match="partition"):
        await store.apply_changelog(P, [])


async def test_a_revoked_partition_is_kept_but_not_served(store: TimerStore) -> None:
    in0, in1 = timer(ref("a"), partition=0), timer(ref("b"), partition=1)
    assert await store.put(in0)
    assert await store.put(in1)
    await store.revoke({1})
    assert store.assigned == frozenset({0, 2, 3})
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: store.put(timer(ref("c"), partition=1)),
        lambda: store.settle([change(in1, status=FIRING)]),
        lambda: store.due({0, 1}, 10_000, 10),
        lambda: store.apply_changelog(1, []),
    ]
    for call in calls:
        with pytest.raises(StoreClosed, match="partition 1"):
            await call()
    with pytest.raises(StoreClosed, match="partition 1"):
        store.changelog_offset(1)
    assert await store.find(in1.owner, in1.key) is None
    assert await store.due({0}, 10_000, 10) == [in0]
    await store.assign({1})
    assert await store.find(in1.owner, in1.key) == in1
    assert await store.due({0, 1}, 10_000, 10) == [in0, in1]
    with pytest.raises(ValueError, match="partition"):
        await store.assign({P})


async def test_drop_deletes_a_partitions_data_and_offset(store: TimerStore) -> None:
    in0, in1 = timer(ref("a"), partition=0), timer(ref("b"), partition=1)
    assert await store.put(in0)
    assert await store.put(in1)
    await store.apply_changelog(1, [(41, row_key(in1.owner, in1.key), encode(in1))])
    assert store.changelog_offset(1) == 41
    await store.drop(1)
    assert store.changelog_offset(1) is None
    assert await store.find(in1.owner, in1.key) is None
    assert await store.due({0, 1}, 10_000, 10) == [in0]
    await store.revoke({0})
    await store.drop(0)
    await store.assign({0})
    assert await store.find(in0.owner, in0.key) is None


async def test_applied_through_moves_the_offset_on_never_back(store: TimerStore) -> None:
    """A committed transaction's last row offset: a copy closed clean is read on from
    there. Never back (an earlier commit told late), and one partition's alone."""
    t = timer(ref("a"), partition=1)
    assert await store.put(t)
    assert store.changelog_offset(1) is None
    await store.applied_through(1, 12)
    assert store.changelog_offset(1) == 12
    await store.applied_through(1, 9)
    assert store.changelog_offset(1) == 12
    await store.applied_through(1, 30)
    assert (store.changelog_offset(0), store.changelog_offset(1)) == (None, 30)
    await store.revoke({1})
    with pytest.raises(StoreClosed, match="partition 1"):
        await store.applied_through(1, 31)


async def test_applied_through_is_kept_across_a_rocksdb_reopen(tmp_path: Path) -> None:
    url = f"rocksdb://{tmp_path / 'kept'}"
    first = open_timer_store(url, partitions=P)
    await first.applied_through(2, 77)
    await first.close()
    again = open_timer_store(url, partitions=P)
    try:
        assert again.changelog_offset(2) == 77
    finally:
        await again.close()


def not_landed(records: list[ChangelogRecord]) -> dict[bytes, Timer | None]:
    """Per row key, the row before the first of `records` (as a transaction keeps them)."""
    out: dict[bytes, Timer | None] = {}
    for r in records:
        out.setdefault(r.key, r.before)
    return out


async def test_each_record_carries_the_row_it_replaced(store: TimerStore, sink: Sink) -> None:
    t = timer(ref("a"))
    assert await store.put(t)
    assert await store.cancel(t.owner, t.key, t.version)
    put, cancel = sink.records
    assert (put.before, cancel.before) == (None, t)


async def test_roll_back_writes_back_what_the_landed_commits_left(
    opener: Opener, sink: Sink
) -> None:
    """Through a handle with its sink attached: a commit landed, then writes that never
    landed (a cancel of a landed row, a new row, a row put and cancelled). Rolled back to
    the rows they replaced, the partition holds what the landed commit left: rows,
    indexes and counts; it takes no write any more, and a landing told late records
    nothing."""
    store = await opener()
    assert isinstance(store, PartitionedStore)
    handle = store.partition(0)
    handle.attach(sink)
    a, b, c = timer(ref("a"), due=500), timer(ref("b"), due=600), timer(ref("c"), due=700)
    assert await handle.put(a)
    await handle.applied_through(40)
    assert await handle.cancel(a.owner, a.key, a.version)
    assert await handle.put(b)
    assert await handle.put(c)
    assert await handle.cancel(c.owner, c.key, c.version)
    assert store.status_counts(0)[PENDING] == 1
    assert len(sink.records) == 5

    assert await handle.roll_back(not_landed(sink.records[1:])) == 3
    assert await store.find(a.owner, a.key) == a
    assert await store.find(b.owner, b.key) is None
    assert await store.find(c.owner, c.key) is None
    assert await store.due({0}, 10_000, 10) == [a]
    assert store.status_counts(0) == {PENDING: 1, FIRING: 0, PARKED: 0, PAUSED: 0}
    assert len(sink.records) == 5, "a roll back writes no changelog"
    await handle.applied_through(90)  # the failed commit's landing, told late
    assert store.changelog_offset(0) == 40
    with pytest.raises(StoreClosed, match="rolled back"):
        await handle.put(timer(ref("d")))
    with pytest.raises(StoreError, match="rolled back"):
        await handle.roll_back({})
    # A new serving of the partition takes writes again.
    await store.revoke({0})
    await store.assign({0})
    assert await store.put(timer(ref("d")))


async def test_roll_back_of_nothing_not_landed_writes_nothing(opener: Opener, sink: Sink) -> None:
    store = await opener()
    assert isinstance(store, PartitionedStore)
    handle = store.partition(1)
    handle.attach(sink)
    t = timer(ref("a"), partition=1)
    assert await handle.put(t)
    assert await handle.cancel(t.owner, t.key, t.version)
    await handle.applied_through(7)
    assert await handle.roll_back({}) == 0
    assert (await store.find(t.owner, t.key) or t).status is CANCELLED


async def test_a_write_over_partitions_of_their_own_sinks_is_written_apart(
    opener: Opener,
) -> None:
    """Partitions 0 and 1 each with its own sink (their transactions), 1's failing: a
    settle of both writes partition 0 whole (its sink has the row, and so does the store)
    and partition 1 not at all, then says so. Before, neither was written here while 0's
    transaction held its row: committed, a row this copy lacked, past its offset."""
    store = await opener()
    assert isinstance(store, PartitionedStore)
    sinks = {0: Sink(), 1: Sink()}
    for p, sink in sinks.items():
        store.partition(p).attach(sink)
    t0, t1 = timer(ref("a"), partition=0), timer(ref("b"), partition=1)
    assert await store.put(t0) and await store.put(t1)
    sinks[1].failing = True
    fired = {"status": FIRED, "attempts": 1}
    with pytest.raises(StoreError, match="sink"):
        await store.settle([change(t0, **fired), change(t1, **fired)])
    assert [r.key for r in sinks[0].records] == [row_key(t0.owner, t0.key)] * 2
    assert (await store.find(t0.owner, t0.key) or t0).status is FIRED
    assert await store.find(t1.owner, t1.key) == t1
    assert len(sinks[1].records) == 1


# --- the changelog ----------------------------------------------------------------------


def encode(t: Timer) -> bytes:
    return orjson.dumps(t.model_dump(mode="json"))


async def test_each_write_hands_its_rows_to_the_sink(store: TimerStore, sink: Sink) -> None:
    t = timer(partition=2)
    assert await store.put(t)
    assert sink.calls == [[ChangelogRecord(2, row_key(t.owner, t.key), encode(t), None)]]
    assert await store.cancel(t.owner, t.key, 1)
    held = await store.find(t.owner, t.key)
    assert held is not None
    assert sink.calls[-1] == [ChangelogRecord(2, row_key(t.owner, t.key), encode(held), t)]
    assert Timer.model_validate_json(sink.records[-1].value or b"") == held


async def test_one_sink_call_per_operation(store: TimerStore, sink: Sink) -> None:
    for key in "abc":
        assert await store.put(timer(key=key))
    sink.calls.clear()
    assert await store.cancel_all(ref(), 2) == 3
    assert [len(call) for call in sink.calls] == [3]
    assert [r.key for r in sink.calls[0]] == sorted(row_key(ref(), k) for k in "abc")


async def test_a_write_that_does_nothing_sends_nothing(store: TimerStore, sink: Sink) -> None:
    t = timer(version=3)
    assert await store.put(t)
    sink.calls.clear()
    assert not await store.put(t)
    assert not await store.put(timer(id="older", version=2))
    assert not await store.cancel(t.owner, t.key, 2)
    assert await store.settle([change(t.model_copy(update={"slot": 9}))]) == 0
    assert sink.calls == []


async def test_a_failing_sink_writes_nothing(store: TimerStore, sink: Sink) -> None:
    t = timer()
    assert await store.put(t)
    sink.failing = True
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: store.put(timer(id="new", version=2)),
        lambda: store.cancel(t.owner, t.key, 1),
        lambda: store.cancel_all(t.owner, 1),
        lambda: store.settle([change(t, status=FIRING)]),
    ]
    for call in calls:
        with pytest.raises(StoreError, match="sink") as raised:
            await call()
        assert isinstance(raised.value.__cause__, ConnectionError)
    assert await store.find(t.owner, t.key) == t
    assert await store.due({0}, 1_000, 10) == [t]


async def _snapshot(store: TimerStore, keys: list[tuple[AggregateRef, str]]) -> list[Any]:
    every = set(range(P))
    return [
        [await store.find(owner, key) for owner, key in keys],
        *[await store.due(every, until, 1_000) for until in (0, 1_500, 10**12)],
        await store.due({1, 2}, 10**12, 3),
        *[await store.parked(ref(f"target{i}")) for i in range(3)],
    ]


async def test_restoring_the_changelog_yields_the_same_store(opener: Opener, sink: Sink) -> None:
    source = await opener("source", changelog=sink)
    keys = []
    for i in range(24):
        owner, key = ref(f"o{i % 7}"), f"k{i % 5}"
        t = timer(owner, key, id=f"t{i}", version=i, partition=i % 7 % P, due=100 * (i % 9))
        t = t.model_copy(update={"target": ref(f"target{i % 3}")})
        keys.append((owner, key))
        await store_ops(source, t, i)
    await source.cancel_all(ref("o3"), 100)
    quiet = Sink()
    restored = await opener("restored", changelog=quiet)
    offsets: dict[int, int] = {}
    for record in sink.records:
        offset = offsets[record.partition] = offsets.get(record.partition, -1) + 1
        await restored.apply_changelog(record.partition, [(offset, record.key, record.value)])
    assert await _snapshot(restored, keys) == await _snapshot(source, keys)
    assert quiet.calls == []
    for partition in range(P):
        assert restored.changelog_offset(partition) == offsets.get(partition)
        assert source.changelog_offset(partition) is None
    # in one batch per partition, as a restore reads it
    batched = await opener("batched")
    for partition in range(P):
        records = [r for r in sink.records if r.partition == partition]
        await batched.apply_changelog(
            partition, [(i, r.key, r.value) for i, r in enumerate(records)]
        )
    assert await _snapshot(batched, keys) == await _snapshot(source, keys)


async def store_ops(store: TimerStore, t: Timer, i: int) -> None:
    """Some put, then a claim, an outcome, a park, or a cancel, by `i`."""
    if not await store.put(t):
        return
    if i % 4 == 1:
        await store.settle([change(t, status=FIRING, due_at=t.due_at + 50)])
    elif i % 4 == 2:
        await store.settle([change(t, status=PARKED, outcome=Outcome.FAILED)])
    elif i % 4 == 3:
        await store.cancel(t.owner, t.key, t.version)
    elif i % 8 == 4:
        await store.pause(t.owner, t.key, t.version)


async def test_apply_changelog_writes_as_given_without_version_checks(
    store: TimerStore, sink: Sink
) -> None:
    t = timer(version=5, due=1_000)
    assert await store.put(t)
    older = timer(id="older", version=1, due=3_000)
    await store.apply_changelog(0, [(7, row_key(t.owner, t.key), encode(older))])
    assert await store.find(t.owner, t.key) == older
    assert await store.due({0}, 10_000, 10) == [older]
    assert store.changelog_offset(0) == 7
    assert len(sink.calls) == 1  # only the put: a restore sends nothing


async def test_a_tombstone_deletes_the_row_and_its_index(store: TimerStore) -> None:
    t, parked = timer(key="a"), timer(key="b", target=ref("target"))
    assert await store.put(t)
    await into(store, parked, PARKED)
    await store.apply_changelog(
        0, [(1, row_key(t.owner, "a"), None), (2, row_key(t.owner, "b"), None)]
    )
    assert await store.find(t.owner, "a") is None
    assert await store.find(t.owner, "b") is None
    assert await store.due({0}, 10_000, 10) == []
    assert await store.parked(ref("target")) == []
    await store.apply_changelog(0, [(3, row_key(t.owner, "zzz"), None)])
    assert store.changelog_offset(0) == 3


async def test_one_restore_batch_may_rewrite_a_row(store: TimerStore) -> None:
    t = timer(due=1_000)
    key = row_key(t.owner, t.key)
    moved = t.model_copy(update={"status": FIRING, "due_at": 5_000})
    await store.apply_changelog(0, [(0, key, encode(t)), (1, key, encode(moved))])
    assert await store.due({0}, 10_000, 10) == [moved]
    await store.apply_changelog(0, [(2, key, None), (3, key, encode(t))])
    assert await store.due({0}, 10_000, 10) == [t]


@pytest.mark.parametrize(
    "bad",
    [
        "json", "key", "partition", "shape", "status", "missing", "bounds", "extra",
        "deep_body", "deep_rule",
    ],
)  # fmt: skip
async def test_a_bad_changelog_record_is_passed_over_and_returned(
    store: TimerStore, bad: str
) -> None:
    t = timer()
    key, value = row_key(t.owner, t.key), encode(t)
    if bad == "json":
        value = b"{not json"
    elif bad == "key":
        key = row_key(t.owner, "other")
    elif bad == "partition":
        value = encode(t.model_copy(update={"partition": 1}))
    elif bad == "status":
        value = value.replace(b'"PENDING"', b'"SLEEPING"')
    elif bad == "missing":
        value = orjson.dumps({k: v for k, v in orjson.loads(value).items() if k != "due_at"})
    elif bad == "bounds":
        # What an older version let through: a version no 64-bit reader holds.
        value = value.replace(b'"version":1', b'"version":' + str(2**70).encode())
        assert str(2**70).encode() in value
    elif bad == "extra":
        value = orjson.dumps({**orjson.loads(value), "sneaky": 1})
    elif bad in ("deep_body", "deep_rule"):
        # Nested past the decoders' depth (msgspec's is Python's recursion limit: a
        # RecursionError, which must not escape the restore and stall its partition).
        deep = b"[" * 2_000 + b"]" * 2_000
        if bad == "deep_body":
            value = value.replace(b'"body":{', b'"body":{"deep":' + deep + b",")
        else:
            value = value.replace(b'"rule":{', b'"rule":{"deep":' + deep + b",")
        assert deep in value
    else:
        value = b"[1, 2]"
    good, later = timer(key="good"), timer(key="later")
    before = t.model_copy(update={"due_at": 7, "slot_due_at": 7})
    records = [
        (0, row_key(good.owner, good.key), encode(good)),
        (1, key, value),
        (2, row_key(later.owner, later.key), encode(later)),
    ]
    if bad != "key":
        await store.apply_changelog(0, [(0, key, encode(before))])
    [passed] = await store.apply_changelog(0, records)
    assert (passed.offset, passed.key, passed.value) == (1, key, value)
    assert passed.reason
    assert await store.find(good.owner, good.key) == good
    assert await store.find(later.owner, later.key) == later
    if bad != "key":
        # Its key's latest record is no row: the key keeps the older row (its letter comes
        # with that row written again, so every later restore sees it too): another
        # writer's garbage under a live timer's key never deletes the timer.
        assert await store.find(t.owner, t.key) == before
        assert [x.key for x in await store.due({0}, 10**12, 10) if x.key == t.key] == [t.key]
    assert store.changelog_offset(0) == 2


async def test_an_empty_restore_batch_changes_nothing(store: TimerStore) -> None:
    await store.apply_changelog(0, [])
    assert store.changelog_offset(0) is None


# --- closing and reopening ----------------------------------------------------------------


async def test_every_call_after_close_raises_store_closed(store: TimerStore) -> None:
    t = timer()
    assert await store.put(t)
    await store.close()
    await store.close()  # closing again is fine
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: store.put(t),
        lambda: store.cancel(t.owner, t.key, 1),
        lambda: store.cancel_all(t.owner, 1),
        lambda: store.due({0}, 1_000, 1),
        lambda: store.find(t.owner, t.key),
        lambda: store.parked(t.owner),
        lambda: store.timers_of(t.owner),
        lambda: store.census(0, 0),
        lambda: store.settle([change(t, status=FIRING)]),
        lambda: store.apply_changelog(0, []),
        lambda: store.assign({0}),
        lambda: store.revoke({0}),
        lambda: store.drop(0),
    ]
    for call in calls:
        with pytest.raises(StoreClosed):
            await call()
    with pytest.raises(StoreClosed):
        store.changelog_offset(0)
    with pytest.raises(StoreClosed):
        _ = store.assigned


@pytest.mark.parametrize("backend", ["rocksdb"])  # only RocksDB outlives its process
async def test_a_reopened_rocksdb_store_keeps_everything(backend: str, opener: Opener) -> None:
    first = await opener("db")
    keys = []
    for i in range(12):
        t = timer(ref(f"o{i}"), id=f"t{i}", partition=i % P, due=10 * i, target=ref("target0"))
        keys.append((t.owner, t.key))
        await store_ops(first, t, i)
    await first.apply_changelog(3, [(99, row_key(ref("x"), "k"), None)])
    before = await _snapshot(first, keys)
    await first.close()
    again = await opener("db")
    assert await _snapshot(again, keys) == before
    assert again.changelog_offset(3) == 99
    assert again.changelog_offset(0) is None
    await again.close()
    with pytest.raises(ValueError, match="partitions"):
        await opener("db", partitions=P + 1)


@pytest.mark.parametrize(
    "url", ["nope", "memory://x", "rocksdb://", "redis://localhost", "", "memory:/"]
)
def test_open_timer_store_rejects_bad_urls(url: str) -> None:
    with pytest.raises(ValueError, match=r"store|memory|rocksdb"):
        open_timer_store(url, partitions=1)


@pytest.mark.parametrize("partitions", [0, -1])
def test_open_timer_store_needs_partitions(partitions: int) -> None:
    with pytest.raises(ValueError, match="partitions"):
        open_timer_store("memory://", partitions=partitions)


async def test_both_backends_are_timer_stores(tmp_path: Path) -> None:
    memory = open_timer_store("memory://", partitions=2)
    rocks = open_timer_store(f"rocksdb://{tmp_path}/r", partitions=2)
    assert isinstance(memory, TimerStore) and isinstance(rocks, TimerStore)
    assert (memory.partitions, rocks.partitions) == (2, 2)
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["STORE.json", "p0.db", "p1.db"]
    await memory.close()
    await rocks.close()
