"""The timer table's changelog on the in-memory log: one transaction per commit (rows, the
caller's records and consumer offsets), fencing of a previous owner, and restores from it
(a local copy ahead of the log or behind its first offset is dropped)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast

import pytest

from app.errors import Fenced, KafkaUnavailable
from app.kafka import Record, TopicSpec, TransactionalWriter
from app.kafka.memory import MemoryLog
from app.node.type_transactions import TypeTransactions as TransactionalChangelog
from app.timers.restore import restore_partition
from tables import (
    AggregateRef,
    CommandSpec,
    OnceRule,
    StoreError,
    Timer,
    TimerStore,
    open_timer_store,
)

T0 = 1_800_000_000_000
P = 4
TOPIC = "shop.order.timers"
EVENTS = "shop.order.events"
COMMANDS = "shop.order.commands"
GROUP = "g"


def memory_log() -> MemoryLog:
    return MemoryLog([TopicSpec(t, P) for t in (TOPIC, EVENTS, COMMANDS)])


def timer(n: int, partition: int = 0) -> Timer:
    owner = AggregateRef(context="shop", aggregate="order", id=f"o-{n}")
    return Timer(
        id=f"t-{n}",
        owner=owner,
        key="remind",
        version=1,
        partition=partition,
        rule=OnceRule(at=T0 + n),
        target=owner,
        command=CommandSpec(type="shop.Remind"),
        slot_due_at=T0 + n,
        due_at=T0 + n,
    )


async def node(log: MemoryLog, *partitions: int) -> tuple[TransactionalChangelog, TimerStore]:
    """A node's changelog and store of the type, owning `partitions`."""
    changelog = TransactionalChangelog(log.transactional_writer, TOPIC, GROUP)
    store = open_timer_store("memory://", partitions=P, changelog=changelog)
    for p in partitions:
        await changelog.open(p)
    return changelog, store


async def restored(log: MemoryLog, partition: int = 0) -> list[Timer]:
    store = open_timer_store("memory://", partitions=P)
    await restore_partition(store, log.reader(), TOPIC, partition)
    return sorted(await store.due({partition}, T0 + 10**6, 1_000), key=lambda t: t.id)


async def test_rows_records_and_offsets_commit_in_one_transaction() -> None:
    log = memory_log()
    changelog, store = await node(log, 0)
    await store.put_many([timer(1), timer(2)])
    assert log.records(TOPIC, 0, committed=False) == [], "buffered until the commit"
    written = await changelog.of(0).commit({(COMMANDS, 0): 7}, [(EVENTS, 0, b"o-1", b"event")])
    assert written == [0], "the caller's records' offsets, in their own partition"
    assert [r.offset for r in log.records(TOPIC, 0)] == [0, 1]
    assert log.offsets(TOPIC, 0) == (0, 3) and log.offsets(EVENTS, 0) == (0, 2)
    assert log.committed(GROUP, COMMANDS, 0) == 7
    assert await changelog.of(0).commit() == [], "nothing to commit: no transaction"
    assert log.offsets(TOPIC, 0) == (0, 3)
    assert [t.id for t in await restored(log)] == ["t-1", "t-2"]


async def test_staged_cycles_hear_their_own_records_offsets() -> None:
    log = memory_log()
    changelog, store = await node(log, 0)
    await store.put(timer(1))
    heard: list[list[int]] = []
    changelog.of(0).stage([(EVENTS, 0, b"a", b"1"), (EVENTS, 0, b"a", b"2")], {}, heard.append)
    changelog.of(0).stage([(EVENTS, 0, b"b", b"3")], {(COMMANDS, 0): 3}, heard.append)
    assert changelog.pending() == [0] and changelog.of(0).staged()
    taken = changelog.of(0).take()
    assert taken is not None and changelog.of(0).take() is None
    assert await taken.send() == [0, 0, 1, 2], "the row, then the staged records"
    assert heard == [[0, 1], [2]]
    assert log.committed(GROUP, COMMANDS, 0) == 3


async def test_a_new_owner_fences_the_old_one_whose_commit_then_fails_and_shows_nothing() -> None:
    log = memory_log()
    old, old_store = await node(log, 0)
    await old_store.put(timer(1))
    await old.of(0).commit()
    await old_store.put(timer(2))  # buffered when the new owner takes the partition over
    new, new_store = await node(log, 0)
    with pytest.raises(Fenced):
        await old.of(0).commit({(COMMANDS, 0): 9})
    assert isinstance(old.of(0).broken, Fenced)
    with pytest.raises(Fenced):
        await old.of(0).commit({(COMMANDS, 0): 10})  # broken: nothing more commits through it
    await old.abandon(0)
    assert [t.id for t in await restored(log)] == ["t-1"]
    assert log.committed(GROUP, COMMANDS, 0) is None
    await new_store.put(timer(3))
    await new.of(0).commit()
    await new.abandon(0)
    assert [t.id for t in await restored(log)] == ["t-1", "t-3"]


async def test_a_zombie_fenced_mid_commit_leaves_nothing_a_restore_would_read() -> None:
    """Its rows reached the log, then the new owner started (aborting its transaction)
    before its commit: a read-committed restore never sees them."""
    log = memory_log()
    old, old_store = await node(log, 0)
    new = TransactionalChangelog(log.transactional_writer, TOPIC, GROUP)

    async def take_over(transactional_id: str) -> None:
        log.before_commit = None
        await new.open(0)

    log.before_commit = take_over
    await old_store.put(timer(1))
    with pytest.raises(Fenced):
        await old.of(0).commit({(COMMANDS, 0): 4}, [(EVENTS, 0, b"o-1", b"event")])
    assert [r.key for r in log.records(TOPIC, 0, committed=False)] != []
    assert await restored(log) == []
    assert log.records(EVENTS, 0) == [] and log.committed(GROUP, COMMANDS, 0) is None
    assert new.owns(0) and new.of(0).broken is None


async def test_a_failed_commit_breaks_the_partition_and_commits_nothing() -> None:
    log = memory_log()
    changelog, store = await node(log, 0, 1)
    await store.put(timer(1))
    log.down = True
    with pytest.raises(KafkaUnavailable) as failed:
        await changelog.of(0).commit()
    assert not isinstance(failed.value, Fenced)
    log.down = False
    assert changelog.of(0).broken is not None and changelog.of(1).broken is None
    await log.transactional_writer(f"{GROUP}.{TOPIC}.0").start()  # the next owner
    assert await restored(log) == []


async def test_writes_to_a_partition_not_owned_are_refused() -> None:
    log = memory_log()
    changelog, store = await node(log, 0)
    with pytest.raises(StoreError, match="not owned"):
        await store.put(timer(1, partition=1))
    await changelog.abandon(0)
    assert not changelog.owns(0)
    await changelog.abandon(0)  # abandoning it again does nothing


async def test_a_restore_continues_a_clean_copy_after_its_offset() -> None:
    log = memory_log()
    changelog, store = await node(log, 0)
    await store.put(timer(1))
    await changelog.of(0).commit()
    copy = open_timer_store("memory://", partitions=P)
    assert await restore_partition(copy, log.reader(), TOPIC, 0) == 1
    assert copy.changelog_offset(0) == 0
    await store.put(timer(2))
    await changelog.of(0).commit()
    seen: list[tuple[int, int]] = []
    assert await restore_partition(copy, log.reader(), TOPIC, 0, progress=_to(seen)) == 1
    assert seen[0] == (0, 3) and seen[-1] == (3, 3), "offsets 1..3: a marker, a row, a marker"
    assert copy.changelog_offset(0) == 2
    assert {t.id for t in await copy.due({0}, T0 + 10, 10)} == {"t-1", "t-2"}


async def test_a_copy_ahead_of_the_log_or_not_clean_is_dropped_and_restored_whole() -> None:
    log = memory_log()
    changelog, store = await node(log, 0)
    await store.put(timer(1))
    await changelog.of(0).commit()
    ahead = open_timer_store("memory://", partitions=P)
    stray = timer(9)
    await ahead.put(stray)
    await ahead.apply_changelog(0, [(50, b"stray-row", None)])  # ahead: the log ends at 2
    assert await restore_partition(ahead, log.reader(), TOPIC, 0) == 1
    assert [t.id for t in await ahead.due({0}, T0 + 10, 10)] == ["t-1"]
    unclean = open_timer_store("memory://", partitions=P)
    await restore_partition(unclean, log.reader(), TOPIC, 0)
    await unclean.put(stray)  # a write that never committed
    assert await restore_partition(unclean, log.reader(), TOPIC, 0, clean=False) == 1
    assert [t.id for t in await unclean.due({0}, T0 + 10, 10)] == ["t-1"]


async def test_a_copy_older_than_the_logs_first_offset_is_restored_from_the_log_alone() -> None:
    log = memory_log()
    changelog, store = await node(log, 0)
    await store.put(timer(1))
    await changelog.of(0).commit()
    copy = open_timer_store("memory://", partitions=P)
    await restore_partition(copy, log.reader(), TOPIC, 0)
    await store.put(timer(2))
    await changelog.of(0).commit()
    log.delete_records(TOPIC, 0, 2)  # a rebuild deleted what the copy had read
    assert await restore_partition(copy, log.reader(), TOPIC, 0) == 1
    assert [t.id for t in await copy.due({0}, T0 + 10, 10)] == ["t-2"]


async def test_each_partition_has_its_own_transactional_id() -> None:
    log = memory_log()
    changelog, _ = await node(log, 0, 1)
    assert changelog.owns(0) and changelog.owns(1) and not changelog.owns(2)
    epochs = [log.epoch(f"{GROUP}.{TOPIC}.{p}") for p in range(P)]
    assert epochs == [1, 1, 0, 0]


def _to(seen: list[tuple[int, int]]) -> Callable[[int, int], None]:
    def progress(read: int, to_read: int) -> None:
        seen.append((read, to_read))

    return progress


class _NeverStarting:
    """A transactional producer whose start never returns: the coordinator never gives it
    a producer id (the client library retries that silently, without end)."""

    def __init__(self) -> None:
        self.stopped = False

    async def start(self) -> None:
        await asyncio.Event().wait()

    async def stop(self) -> None:
        self.stopped = True


async def test_a_producer_that_never_starts_fails_the_open_within_its_deadline() -> None:
    """A partition's take that waited for ever on its producer left the partition
    restoring, silently, for good (seen on Kafka 4.1 as an old owner woke): now the open
    fails, so that the take is tried again and the node stops loudly if it never can."""
    writer = _NeverStarting()
    changelog = TransactionalChangelog(lambda tid: cast(TransactionalWriter, writer), TOPIC, GROUP)
    changelog.open_deadline_s = 0.05
    with pytest.raises(KafkaUnavailable, match=rf"{GROUP}\.{TOPIC}\.3: its producer did not start"):
        await changelog.open(3)
    assert writer.stopped
    assert not changelog.owns(3)


@pytest.mark.parametrize("batch", [1, 2, 100])
async def test_a_record_passed_over_is_reported_unless_a_later_record_of_its_key_replaced_it(
    batch: int,
) -> None:
    """Whatever the read's batches: a key whose last record is no row is reported (first
    offset, reason); one a later record replaced, in the same batch or a later one, and a
    good key after it, are not."""
    from tables.keys import encode_timer, row_key

    log = memory_log()
    publisher = log.publisher()
    good, replaced, bad = timer(1), timer(2), timer(3)
    key = {t.id: row_key(t.owner, t.key) for t in (good, replaced, bad)}
    await publisher.send_many(
        [
            (TOPIC, 0, key["t-2"], b"not a row"),  # offset 0, replaced at 3
            (TOPIC, 0, key["t-1"], encode_timer(good)),
            (TOPIC, 0, key["t-3"], encode_timer(bad)),
            (TOPIC, 0, key["t-2"], encode_timer(replaced)),
            (TOPIC, 0, key["t-3"], b"{}"),  # offset 4: its last record, no row
            (TOPIC, 0, key["t-1"], encode_timer(good)),
        ]
    )
    store = open_timer_store("memory://", partitions=P)
    unreadable: list[tuple[Record, str]] = []
    assert (
        await restore_partition(store, log.reader(batch=batch), TOPIC, 0, unreadable=unreadable)
        == 6
    )
    assert [(r.offset, r.key) for r, _ in unreadable] == [(4, key["t-3"])]
    assert "validation error" in unreadable[0][1]
    # t-3 keeps the row its key held before the record that is none (offset 2): another
    # writer's garbage under a live timer's key never deletes the timer.
    assert [t.id for t in await store.due({0}, T0 + 10, 10)] == ["t-1", "t-2", "t-3"]


@pytest.mark.parametrize("batch", [1, 2, 100])
async def test_every_record_passed_over_of_one_key_is_reported(batch: int) -> None:
    """Two records of one key that are no rows, no later record of it after them: both are
    reported (each one's dead letter and count), not the last alone; the key keeps the row
    it held before them."""
    from tables.keys import encode_timer, row_key

    log = memory_log()
    kept = timer(1)
    key = row_key(kept.owner, kept.key)
    await log.publisher().send_many(
        [
            (TOPIC, 0, key, encode_timer(kept)),
            (TOPIC, 0, key, b"garbage"),  # offset 1
            (TOPIC, 0, key, b'{"x": 2}'),  # offset 2
        ]
    )
    store = open_timer_store("memory://", partitions=P)
    unreadable: list[tuple[Record, str]] = []
    await restore_partition(store, log.reader(batch=batch), TOPIC, 0, unreadable=unreadable)
    assert [(r.offset, r.key) for r, _ in unreadable] == [(1, key), (2, key)]
    assert [t.id for t in await store.due({0}, T0 + 10, 10)] == ["t-1"]
