"""A clean local copy of a timer changelog is read on from its offset only while younger
than the changelog keeps tombstones (`delete.retention.ms`, less a margin): compaction
drops a deleted key's records, then its tombstone, without moving the log's first offset,
so an older copy read on would keep a row the changelog deleted (a timer fired on another
node, due again here). Older, or of no known age, it is restored whole."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fakes import T0, FakeClock, RunningNode, running, wait_until
from hypothesis import given
from hypothesis import strategies as st
from test_node_memory import PARTITIONS, SERVICE, TOPICS, schedule

from app.kafka import LogReader
from app.kafka.memory import MemoryLog
from app.node.copy_age import (
    CHANGELOG_DELETE_RETENTION_MS,
    MAX_MARGIN_MS,
    copy_usable,
    margin_ms,
    tombstones_kept,
)
from app.timers.restore import restore_partition
from tables import AggregateRef, TimerStatus, TimerStore
from tables.keys import row_key
from tables.partitioner import partition_of

DAY = 86_400_000
HOUR = 3_600_000
P = 1
OWNER = next(f"o{i}" for i in range(1, 99) if partition_of(f"o{i}", PARTITIONS) == P)
REF = AggregateRef(context="mem", aggregate="counter", id=OWNER)

times = st.integers(min_value=0, max_value=2**62)
kepts = st.integers(min_value=0, max_value=2**62)


@given(at=times, age=st.integers(min_value=0, max_value=2**60), kept=kepts)
def test_a_copy_is_read_on_from_only_while_younger_than_its_tombstones_less_a_margin(
    at: int, age: int, kept: int
) -> None:
    usable = copy_usable(at, at + age, kept)
    assert usable == (age < kept - margin_ms(kept))
    if usable:
        assert age < kept  # never past what compaction keeps
    assert 0 <= margin_ms(kept) <= min(kept, MAX_MARGIN_MS)


@given(at=times, ahead=st.integers(min_value=1, max_value=2**60), kept=kepts)
def test_a_copy_of_no_known_age_is_never_read_on_from(at: int, ahead: int, kept: int) -> None:
    assert not copy_usable(None, at, kept)
    assert not copy_usable(at + ahead, at, kept)  # marked "later": the clock moved back


@given(at=times, age=st.integers(min_value=0, max_value=2**40), kept=kepts, more=kepts)
def test_a_longer_retention_never_refuses_what_a_shorter_takes(
    at: int, age: int, kept: int, more: int
) -> None:
    if copy_usable(at, at + age, kept):
        assert copy_usable(at, at + age, kept + more)
        assert all(copy_usable(at, at + younger, kept) for younger in (0, age // 2))


def test_the_defaults_read_on_from_a_copy_of_under_23_hours() -> None:
    assert CHANGELOG_DELETE_RETENTION_MS == DAY
    assert copy_usable(T0, T0 + 23 * HOUR - 1, DAY)
    assert not copy_usable(T0, T0 + 23 * HOUR, DAY)
    assert tombstones_kept({"delete.retention.ms": "86400000"}) == DAY
    assert tombstones_kept({}) is None
    assert tombstones_kept({"delete.retention.ms": "-1"}) is None
    assert tombstones_kept({"delete.retention.ms": "soon"}) is None


def test_the_memory_log_compacts_as_a_broker_past_delete_retention() -> None:
    log = MemoryLog()
    log.create_topic("t")
    publisher_records = [(b"a", b"1"), (b"b", b"1"), (b"a", b"2"), (b"b", None), (b"c", b"1")]
    for key, value in publisher_records:
        log._append([("t", 0, key, value)], None)
    log.compact("t", 0)
    assert [(r.offset, r.key, r.value) for r in log.records("t", 0)] == [
        (2, b"a", b"2"),
        (4, b"c", b"1"),
    ]
    assert log.offsets("t", 0) == (0, 5)


# --- on the memory log: a node stopped, another ran its partition meanwhile ----------------


@pytest.fixture
async def log() -> AsyncIterator[MemoryLog]:
    yield MemoryLog()


@pytest.fixture
def takes(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each restore of P's timer table was told its copy is clean (read on)."""
    told: list[bool] = []

    async def restoring(store: TimerStore, reader: LogReader, topic: str, p: int, **kw: Any) -> int:
        if p == P:
            told.append(kw["clean"])
        return await restore_partition(store, reader, topic, p, **kw)

    monkeypatch.setattr("app.node.partition_open.restore_partition", restoring)
    return told


async def stopped_with_a_timer(log: MemoryLog, tmp_path: Path, clock: FakeClock) -> None:
    """Node "a" sets OWNER's timer "k" (due in 10 days, PENDING) and stops: its copy of P
    marked clean at the clock's now."""
    async with running(RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS, clock=clock)):
        await schedule(log, OWNER, T0 + 10 * DAY)
        await wait_until(lambda: len(log.records(TOPICS.timers_changelog, P)) >= 1)
    assert (tmp_path / "a" / TOPICS.type_name / "timers" / f"clean-p{P}").read_text() == (f"{T0}\n")


def deleted_and_compacted(log: MemoryLog) -> None:
    """What another node's run of P left: "k" fired and swept (its tombstone), the group's
    offsets of P past every record, and compaction past `delete.retention.ms` since
    dropped every record of "k"."""
    key = row_key(REF, "k")
    ends = {(t, P): log.offsets(t, P)[1] for t in (TOPICS.events, TOPICS.commands)}
    log.commit_group_offsets("g", ends)
    log._append([(TOPICS.timers_changelog, P, key, None)], None)
    log.compact(TOPICS.timers_changelog, P)
    assert [r for r in log.records(TOPICS.timers_changelog, P) if r.key == key] == []


async def timer_after_restart(log: MemoryLog, tmp_path: Path, clock: FakeClock) -> Any:
    async with running(RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS, clock=clock)) as a:
        return await a.node.types[TOPICS.type_name].store.find(REF, "k")


async def test_a_copy_older_than_the_tombstones_is_restored_whole(
    log: MemoryLog, tmp_path: Path, takes: list[bool]
) -> None:
    clock = FakeClock(T0)
    await stopped_with_a_timer(log, tmp_path, clock)
    deleted_and_compacted(log)
    clock.set(T0 + 2 * DAY)
    # Read on, the copy kept "k" PENDING: a timer fired elsewhere long ago, due again.
    found = await timer_after_restart(log, tmp_path, clock)
    assert takes == [False, False]  # the first: no copy yet
    assert found is None


async def test_a_fresh_copy_is_still_read_on_from(
    log: MemoryLog, tmp_path: Path, takes: list[bool]
) -> None:
    clock = FakeClock(T0)
    await stopped_with_a_timer(log, tmp_path, clock)
    clock.set(T0 + 22 * HOUR)
    timer = await timer_after_restart(log, tmp_path, clock)
    assert timer is not None and timer.status is TimerStatus.PENDING
    assert takes == [False, True], "no needless whole restore"


async def test_the_changelogs_own_delete_retention_is_read(
    log: MemoryLog, tmp_path: Path, takes: list[bool]
) -> None:
    """Set on the topic (a week), it is what the node judges a copy's age by."""
    clock = FakeClock(T0)
    await stopped_with_a_timer(log, tmp_path, clock)
    log.configs[TOPICS.timers_changelog]["delete.retention.ms"] = str(7 * DAY)
    clock.set(T0 + 2 * DAY)
    assert await timer_after_restart(log, tmp_path, clock) is not None
    assert takes == [False, True]


async def test_a_changelog_whose_retention_is_not_read_keeps_copies_an_half_hour(
    log: MemoryLog, tmp_path: Path, takes: list[bool]
) -> None:
    """No DescribeConfigs ACL: an hour's retention assumed, a copy of two hours restored
    whole, one of a few minutes (a rolling restart) read on."""
    clock = FakeClock(T0)
    await stopped_with_a_timer(log, tmp_path, clock)
    log.describe_refused = "Topic authorization failed."
    clock.set(T0 + 2 * HOUR)
    assert await timer_after_restart(log, tmp_path, clock) is not None
    clock.set(T0 + 2 * HOUR + 5 * 60_000)
    assert await timer_after_restart(log, tmp_path, clock) is not None
    assert takes == [False, False, True]


async def test_a_mark_written_by_the_version_before_is_restored_whole_once(
    log: MemoryLog, tmp_path: Path, takes: list[bool]
) -> None:
    clock = FakeClock(T0)
    await stopped_with_a_timer(log, tmp_path, clock)
    (tmp_path / "a" / TOPICS.type_name / "timers" / f"clean-p{P}").write_text("")
    assert await timer_after_restart(log, tmp_path, clock) is not None
    assert await timer_after_restart(log, tmp_path, clock) is not None
    assert takes == [False, False, True]
