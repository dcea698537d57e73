"""The operators' readers of a timer changelog show what a node's restore of it holds, fed
records another writer put there.

Three readers read the changelog instead of a node's table: the operator page's search of
an owner whose partition another node holds (`search_changelog`), `tickwheel timers list`
(`read_timers`) and `tickwheel timers show` (`read_timer_history`). Each must take a
record as a restore takes it (`tables.keys.restored_row` with the type's owner check): a
record that is no row of its partition's leaves its key's earlier row in place (garbage
after a live timer's row hides no live timer), and a row under another owner's key, of
an owner of another type or one keyed to another partition, is no row (a listing that
showed it would show a timer no node fires, in place of one that fires).
"""

from __future__ import annotations

import asyncio

import pytest
from fakes import T0, TYPE, ref

from app.kafka import TopicSpec
from app.kafka.memory import MemoryLog
from app.ops.changelog_search import search_changelog
from app.protocol.topics import parse_aggregate_type
from app.timers.operator import read_timer_history, read_timers
from app.timers.restore import restore_partition
from tables import AggregateRef, CommandSpec, OnceRule, Timer, open_timer_store
from tables.keys import encode_timer, row_key
from tables.partitioner import partition_of

P = 4
TOPICS = parse_aggregate_type(TYPE)
TOPIC = TOPICS.timers_changelog


def owner_in(partition: int, prefix: str = "o") -> str:
    return next(f"{prefix}{n}" for n in range(1000) if partition_of(f"{prefix}{n}", P) == partition)


def timer(owner: AggregateRef, key: str, partition: int | None = None) -> Timer:
    """`owner`'s timer `key`; in its owner's partition unless told."""
    return Timer(
        id=f"{owner.id}/{key}",
        owner=owner,
        key=key,
        version=1,
        partition=partition_of(owner.id, P) if partition is None else partition,
        rule=OnceRule(at=T0 + 60_000),
        target=owner,
        command=CommandSpec(type="Remind"),
        slot_due_at=T0 + 60_000,
        due_at=T0 + 60_000,
    )


async def changelog(records: list[tuple[int, bytes, bytes | None]]) -> MemoryLog:
    """The type's topics, its changelog holding `(partition, key, value)` records."""
    log = MemoryLog([TopicSpec(TOPIC, P), TopicSpec(TOPICS.events, P)])
    await log.publisher().send_many([(TOPIC, p, key, value) for p, key, value in records])
    return log


async def restored(log: MemoryLog) -> list[tuple[str, str]]:
    """(owner, key) of every timer a node's restores of each partition hold."""
    store = open_timer_store(
        "memory://", partitions=P, owner_type=(TOPICS.context, TOPICS.aggregate)
    )
    held = []
    for p in range(P):
        await restore_partition(store, log.reader(), TOPIC, p, unreadable=[])
        held += [(str(t.owner), t.key) for t in await store.due({p}, T0 + 10**6, 100)]
    await store.close()
    return sorted(held)


async def listed(log: MemoryLog) -> list[tuple[str, str]]:
    return sorted((str(t.owner), t.key) for t in await read_timers(log, TYPE))


async def test_garbage_after_a_live_timers_row_hides_it_from_no_reader() -> None:
    """A restore keeps the timer whose key's last record is garbage (and the node writes
    its row again at the next take): the search of its owner, the listing and `show`
    find it too."""
    owner = ref(owner_in(2))
    live = timer(owner, "k1")
    key = row_key(owner, "k1")
    log = await changelog([(2, key, encode_timer(live)), (2, key, b"garbage")])
    assert await restored(log) == [(str(owner), "k1")]
    found = await search_changelog(log, asyncio.Semaphore(1), 5.0, TYPE, 2, owner, 10)
    assert found.timers == [live]
    assert await listed(log) == [(str(owner), "k1")]
    assert (await read_timer_history(log, owner)).current("k1") == live


async def test_a_row_under_another_owners_key_is_no_row_to_any_reader() -> None:
    """A's valid row written under B's key: a restore passes it over and B's key keeps
    B's row; no reader shows A's row, nor loses B's."""
    a, b = ref(owner_in(1)), ref(owner_in(1, "x"))
    ta, tb = timer(a, "ka"), timer(b, "kb")
    key = row_key(b, "kb")
    log = await changelog([(1, key, encode_timer(tb)), (1, key, encode_timer(ta))])
    assert await restored(log) == [(str(b), "kb")]
    assert await listed(log) == [(str(b), "kb")]
    found = await search_changelog(log, asyncio.Semaphore(1), 5.0, TYPE, 1, b, 10)
    assert found.timers == [tb]
    history = await read_timer_history(log, b)
    assert list(history.versions) == ["kb"]
    assert [v.row for v in history.versions["kb"]] == [tb]


@pytest.mark.parametrize(
    "case",
    ["a row of partition 3 in partition 0", "owner keyed to partition 3", "owner of another type"],
)
async def test_a_row_no_restore_takes_in_its_partition_is_listed_by_no_reader(case: str) -> None:
    """A row whose `partition` field is not the partition it sits in, one of an owner
    keyed to another partition (its field the partition it sits in), one of an owner of
    another type: a restore loads none; `timers list` lists none."""
    if case == "a row of partition 3 in partition 0":
        row = timer(ref(owner_in(3)), "k")
    elif case == "owner keyed to partition 3":
        row = timer(ref(owner_in(3)), "k", partition=0)
    else:
        row = timer(AggregateRef(context="bank", aggregate="account", id=owner_in(0)), "k")
    log = await changelog([(0, row_key(row.owner, row.key), encode_timer(row))])
    assert await restored(log) == []
    assert await listed(log) == []
