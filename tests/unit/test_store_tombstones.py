"""A cancel or an owner's deletion read before the older set it supersedes (a producer whose
retries reorder its sends, or who writes out of order) leaves a row that passes the set
over (`tables.tombstones`): the timer never fires. Run against both backends, through the
subscription as a node applies a log batch."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from fakes import RecordingSink

from app.protocol.wire import EventEnvelope, decode_event
from app.timers.subscription import MARK_AHEAD_MS, apply_all, timer_op
from tables import AggregateRef, Outcome, TimerStatus, TimerStore
from tables import open_timer_store as open_store
from tables.bounds import MAX_INSTANT
from tables.copies import change_of, copied
from tables.keys import encode_timer, restored_row, row_key
from tables.tombstones import (
    DELETED_KEY,
    UNSET,
    CancelMark,
    deletion_mark,
    is_deletion_mark,
    tombstone,
)
from tables.writes import cancel_row

OWNER = {"context": "shop", "aggregate": "order", "id": "o"}
AT = 5_000  # every set's due time
MADE = 1_000  # every event's own time
DAY = 86_400_000
CANCELLED = TimerStatus.CANCELLED


def ev(type_: str, version: int, body: dict[str, Any], id: str | None = None) -> EventEnvelope:
    raw = orjson.dumps(
        {
            "id": id or f"{type_}-{version}",
            "type": type_,
            "aggregate": OWNER,
            "version": version,
            "created_at": MADE,
            "body": body,
        }
    )
    return decode_event(raw)[0]


def set_(version: int, key: str = "k", id: str | None = None) -> EventEnvelope:
    body = {"key": key, "rule": {"kind": "once", "at": AT}, "command": {"type": "C"}}
    return ev("wow.ScheduleSet", version, body, id)


def cancel(version: int, key: str = "k") -> EventEnvelope:
    return ev("wow.ScheduleCancelled", version, {"key": key})


def deleted(version: int) -> EventEnvelope:
    return ev("wow.AggregateDeleted", version, {})


REF = set_(1).aggregate


@pytest.fixture(params=["memory", "rocksdb"])
async def opened(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    stores: list[TimerStore] = []

    async def open_(name: str = "a") -> tuple[TimerStore, RecordingSink]:
        url = "memory://" if request.param == "memory" else f"rocksdb://{tmp_path / name}"
        sink = RecordingSink()
        store = open_store(url, partitions=1, changelog=sink)
        await store.assign({0})
        stores.append(store)
        return store, sink

    yield open_
    for store in stores:
        await store.close()


async def read(store: TimerStore, *events: EventEnvelope) -> int:
    """Applies `events` in order, as one log batch; how many changed anything."""
    ops = [op for e in events if (op := timer_op(e, 0)) is not None]
    changed, _ = await apply_all(store, ops)
    return changed


async def due(store: TimerStore) -> list[str]:
    return [t.id for t in await store.due({0}, AT + DAY, 10)]


async def test_a_cancel_read_before_its_older_set_leaves_a_tombstone_the_set_meets(
    opened: Any,
) -> None:
    store, _ = await opened()
    await read(store, cancel(5), set_(3))
    assert await due(store) == []
    row = await store.find(REF, "k")
    assert row is not None
    assert (row.status, row.outcome, row.version, row.id) == (
        TimerStatus.CANCELLED,
        Outcome.CANCELLED,
        5,
        "wow.ScheduleCancelled-5",
    )
    assert (row.command.type, row.target, row.due_at) == (UNSET, REF, MADE)
    # Read again (a replay), nothing changes; a later set is a new timer.
    assert await read(store, cancel(5), set_(3)) == 0
    await read(store, set_(6))
    assert await due(store) == ["wow.ScheduleSet-6"]


async def test_a_set_at_the_cancels_own_version_is_written(opened: Any) -> None:
    """One command's events share its version: cancelled and set again, the set wins."""
    store, _ = await opened()
    await read(store, cancel(4), set_(4))
    assert await due(store) == ["wow.ScheduleSet-4"]


async def test_a_reschedule_appended_twice_keeps_the_timer_it_set(opened: Any) -> None:
    """One command's [cancel, set] of a key, appended again by a producer's retry: the
    cancel read again is passed over (the row notes its id), so the set's timer stays,
    in one batch or two, on a restored copy and on a store rebuilt from the log alike.
    Before, it cancelled the set's timer, and the set read again did not write it back."""
    store, sink = await opened()
    await read(store, set_(3))
    await read(store, cancel(4), set_(4), cancel(4), set_(4))
    assert await due(store) == ["wow.ScheduleSet-4"]
    assert await read(store, cancel(4)) == 0  # a later batch: the cancel alone again
    assert await read(store, cancel(4), set_(4)) == 0
    assert await due(store) == ["wow.ScheduleSet-4"]
    row = await store.find(REF, "k")
    assert row is not None and row.cancel_id == "wow.ScheduleCancelled-4"
    # A copy restored from the changelog holds the row, and passes the cancel over too.
    copy, _ = await opened("b")
    records = [(i, r.key, r.value) for i, r in enumerate(sink.records)]
    assert await copy.apply_changelog(0, records) == []
    assert await copy.find(REF, "k") == row
    assert await read(copy, cancel(4)) == 0
    # Rebuilt from the log: the same row (no row before the cancel: its tombstone).
    for before in ([set_(3)], []):
        rebuilt, _ = await opened(f"rebuilt-{len(before)}")
        await read(rebuilt, *before, cancel(4), set_(4), cancel(4), set_(4))
        assert await due(rebuilt) == ["wow.ScheduleSet-4"]
    # A later command's cancel cancels it.
    assert await read(store, cancel(5)) == 1
    assert await due(store) == []


async def test_a_cancelled_row_takes_a_later_cancels_version(opened: Any) -> None:
    """Set at 1 and cancelled at 2, then a cancel at 5 read before a set at 3: the row
    takes version 5, and the set at 3 is passed over."""
    store, _ = await opened()
    await read(store, set_(1), cancel(2), cancel(5), set_(3))
    assert await due(store) == []
    row = await store.find(REF, "k")
    assert row is not None and (row.version, row.id) == (5, "wow.ScheduleSet-1")


async def test_a_fired_row_takes_a_later_cancels_version(opened: Any) -> None:
    """Set at 1 and fired; set again at 3 and cancelled at 5, the cancel read first: the
    row is CANCELLED at 5 (it fired, left as it was it passed the set at 3 through), and
    finished when the cancel was read, not when it fired (the sweep counts from then)."""
    store, _ = await opened()
    await read(store, set_(1))
    [t] = await store.due({0}, AT + DAY, 10)
    done = copied(t, {"status": TimerStatus.FIRED, "outcome": Outcome.COMMITTED})
    assert await store.settle([change_of(t, done)]) == 1
    await read(store, cancel(5), set_(3))
    assert await due(store) == []
    row = await store.find(REF, "k")
    assert row is not None
    assert (row.status, row.version, row.due_at) == (TimerStatus.CANCELLED, 5, AT)
    # A set of the cancel's own command after it (its version) is a new timer.
    await read(store, set_(5, id="again"))
    assert await due(store) == ["again"]


async def test_a_row_a_later_cancel_moves_is_kept_from_when_it_was_read(opened: Any) -> None:
    """Cancelled long ago, its row about to be swept; a cancel at 5 read now moves it to 5:
    kept `finished_retention` from now, as a fresh tombstone, so the set at 3 read after
    still meets it."""
    store, _ = await opened()
    retention, now = 7 * DAY, AT + 7 * DAY
    await read(store, set_(1), cancel(2))
    op = timer_op(cancel(5), 0, now=now)
    assert op is not None
    await apply_all(store, [op])
    assert await store.expire(0, now + 1, retention, 10) == 0
    row = await store.find(REF, "k")
    assert row is not None and (row.version, row.due_at) == (5, now)


@pytest.mark.parametrize("state", ["pending", "paused", "parked"])
@pytest.mark.parametrize("by", ["cancel", "deletion"])
async def test_a_timer_cancelled_long_after_it_was_due_is_kept_from_when_it_was_read(
    opened: Any, state: str, by: str
) -> None:
    """Set at 1 (due at AT), overdue, paused or parked for weeks, then cancelled (at 6)
    read before a set at 4: its row is finished when the cancel was read, not at its old
    due time, or the next sweep deletes it at once and the set at 4 writes the timer
    again (an interval rule catching up to now would fire it). A cancel without its read
    mark leaves the due time as it was (no time to count from)."""
    store, sink = await opened()
    retention, now = 7 * DAY, AT + 30 * DAY
    await read(store, set_(1))
    if state == "paused":
        await read(store, ev("wow.SchedulePaused", 2, {"key": "k"}))
    elif state == "parked":
        [t] = await store.due({0}, AT, 10)
        parked = copied(t, {"status": TimerStatus.PARKED, "outcome": Outcome.FAILED})
        assert await store.settle([change_of(t, parked)]) == 1
    op = timer_op(cancel(6) if by == "cancel" else deleted(6), 0, now=now)
    assert op is not None
    await apply_all(store, [op])
    row = await store.find(REF, "k")
    assert row is not None and (row.status, row.version, row.due_at) == (CANCELLED, 6, now)
    assert sink.records[-1 if by == "cancel" else -2].value == encode_timer(row)
    assert await store.expire(0, now + retention - 1, retention, 10) == 0
    await read(store, set_(4))
    assert await due(store) == []
    # Kept `retention` from the cancel's read, as a tombstone is.
    assert await store.expire(0, now + retention, retention, 10) >= 1
    assert await store.find(REF, "k") is None


async def test_a_cancel_without_its_read_mark_keeps_the_due_time(opened: Any) -> None:
    store, _ = await opened()
    await read(store, set_(1), set_(1, "other"))
    assert await store.cancel(REF, "k", 2)
    assert await store.cancel_all(REF, 2) == 1
    assert [(t.status, t.due_at) for t in await store.timers_of(REF)] == [(CANCELLED, AT)] * 2


async def test_a_deletion_read_before_an_older_set_passes_it_over(opened: Any) -> None:
    store, _ = await opened()
    await read(store, set_(2, "held"), deleted(9), set_(4, "new"), set_(9, "same"))
    assert await due(store) == []
    assert await store.find(REF, "new") is None
    held = await store.find(REF, "held")
    assert held is not None and (held.status, held.version) == (TimerStatus.CANCELLED, 9)
    # A later version (the aggregate kept on, or recovered) sets its timers again.
    await read(store, set_(10, "new"))
    assert await due(store) == ["wow.ScheduleSet-10"]
    marks = [t for t in await store.timers_of(REF) if is_deletion_mark(t)]
    assert [(t.key, t.version, t.status) for t in marks] == [
        (DELETED_KEY, 9, TimerStatus.CANCELLED)
    ]


async def test_a_deletion_of_an_owner_without_timers_is_a_change(opened: Any) -> None:
    """Its mark is a row its cycle must commit with its offset (`apply` counts it)."""
    store, sink = await opened()
    assert await read(store, deleted(3)) == 1
    assert [r.key for r in sink.records] == [row_key(REF, DELETED_KEY)]
    await read(store, set_(2), set_(2, "other", "x"))
    assert await due(store) == []
    await read(store, deleted(1))  # an older one moves nothing
    await read(store, set_(3, "late"))
    assert await due(store) == []


async def test_a_cancel_of_the_deletion_marks_key_moves_nothing(opened: Any) -> None:
    """A `wow.ScheduleCancelled` may name any key: one naming the mark's neither cancels
    it again nor moves its version."""
    store, _ = await opened()
    await read(store, deleted(3), cancel(20, DELETED_KEY), set_(15))
    assert await due(store) == ["wow.ScheduleSet-15"]


async def test_tombstones_and_marks_restore_and_are_swept_with_finished_rows(
    opened: Any,
) -> None:
    store, sink = await opened()
    await read(store, cancel(5), deleted(9))
    records = [(i, r.key, r.value) for i, r in enumerate(sink.records)]
    assert len(records) == 2
    # Restored from its changelog, a copy passes the older sets over as well.
    copy, _ = await opened("b")
    assert await copy.apply_changelog(0, records) == []
    await read(copy, set_(3), set_(4, "other"))
    assert await due(copy) == []
    # Finished at the cancel's own time: deleted `retention` after it, by tombstones.
    retention = 7 * DAY
    assert await store.expire(0, MADE + retention - 1, retention, 10) == 0
    assert await store.expire(0, MADE + retention, retention, 10) == 2
    assert [r.value for r in sink.records[2:]] == [None, None]
    assert await store.timers_of(REF) == []


async def test_a_cancel_without_its_read_mark_leaves_nothing(opened: Any) -> None:
    """The store's own `cancel` of a key it holds no row of, as before (no partition or
    event to stamp a row with)."""
    store, sink = await opened()
    assert not await store.cancel(REF, "k", 5)
    assert await store.cancel_all(REF, 5) == 0
    assert sink.records == []
    await read(store, set_(3))
    assert await due(store) == ["wow.ScheduleSet-3"]


def test_a_stand_in_row_reads_as_any_row() -> None:
    """A row an older node reads (and a restore, `tables.keys.restored_row`): a Timer."""
    ref = AggregateRef(**OWNER)
    for row in (
        tombstone(None, ref, "k", 5, CancelMark(0, "c5", MADE)),
        deletion_mark(None, ref, 9, CancelMark(0, "d9", MADE)),
    ):
        assert row is not None
        assert restored_row(0, row_key(ref, row.key), encode_timer(row)) == row


@pytest.mark.parametrize("status", ["PENDING", "FIRING", "PAUSED", "PARKED"])
@pytest.mark.parametrize("read_at", [AT - 1, AT, AT + 1, AT + 30 * DAY, None])
def test_a_cancelled_row_is_finished_no_earlier_than_its_cancel_was_read(
    status: str, read_at: int | None
) -> None:
    """`cancel_row`'s due time, from which `finished_at` counts the row's retention: the
    later of its own and the cancel's read time (its own without one); the rest as before."""
    ref = AggregateRef(**OWNER)
    row = tombstone(None, ref, "k", 1, CancelMark(0, "t", AT))
    assert row is not None
    held = copied(row, {"status": TimerStatus(status), "outcome": None})
    cancelled = cancel_row(held, 2, read_at)
    assert cancelled is not None
    assert cancelled.due_at == (AT if read_at is None else max(AT, read_at))
    assert cancelled.model_copy(update={"due_at": AT}) == cancel_row(held, 2)


async def test_a_mark_dated_far_ahead_is_kept_from_the_nodes_time_not_its_own(
    opened: Any,
) -> None:
    """A cancel of a key never set leaves a tombstone, finished at the event's own time
    when that is later than the node's: a writer's clock a few seconds ahead. One dated in
    the year 9999 (another writer's, a fuzzer's) is finished at most `MARK_AHEAD_MS` past
    the node's time, so the retention sweep removes it as it removes the others; else a
    stream of such cancels grew the table and its changelog for good."""
    store, _ = await opened()
    now = 1_800_000_000_000
    events = [
        cancel(1, key="near").model_copy(update={"created_at": now + 5_000}),
        cancel(1, key="far").model_copy(update={"created_at": MAX_INSTANT}),
    ]
    ops = [op for e in events if (op := timer_op(e, 0, now=now)) is not None]
    await apply_all(store, ops)
    near, far = [await store.find(REF, k) for k in ("near", "far")]
    assert near is not None and near.status is CANCELLED and near.due_at == now + 5_000
    assert far is not None and far.due_at == now + MARK_AHEAD_MS
    assert await store.expire(0, now + MARK_AHEAD_MS + 7 * DAY, 7 * DAY, 10) == 2
    assert [await store.find(REF, k) for k in ("near", "far")] == [None, None]
