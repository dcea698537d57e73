"""A restore takes no timer row the live path would never have written to that partition of
that type's table, on both backends.

A row's owner decides where its cancels and deletion go: its own type's table, its own
partition (murmur2 of its id). The live path sets timers only from events of the type
keyed to their partition (`app.node.cycle_timers`), so a changelog row of an owner of
another type, or of one whose id is keyed to another partition, is another writer's, even
when it is well formed, under its own row key, its `partition` field the partition it
sits in. Loaded, it would fire with nothing able to cancel it, and `timers show` of its
owner (which reads the owner's own partition) would not list it. So a restore passes it
over as it passes over a record that is no row: the key keeps what it held before, and
the record is reported once (its dead letter, `restore`), by the memory store, by the
RocksDB store's fast row check and by the pydantic check behind it alike.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fakes import T0
from hypothesis import given, settings
from hypothesis import strategies as st
from test_rowcheck import timers

from app.kafka import Record, TopicSpec
from app.kafka.memory import MemoryLog
from app.protocol.topics import AggregateTopics
from app.timers.restore import restore_partition
from tables import AggregateRef, CommandSpec, OnceRule, Timer, TimerStore, open_timer_store
from tables.keys import encode_timer, restored_row, row_key
from tables.owners import TableOwners
from tables.partitioner import partition_of
from tables.rowcheck import restored_index, restored_index_as_is
from tables.timer import ACTIVE, TimerStatus

P = 4
TOPICS = AggregateTopics("shop", "order")
OWNERS = TableOwners("shop", "order", P)


def id_in(partition: int, prefix: str = "o") -> str:
    """An id murmur2 puts in `partition` of P."""
    return next(f"{prefix}{n}" for n in range(1000) if partition_of(f"{prefix}{n}", P) == partition)


def row(owner: AggregateRef, partition: int, key: str = "k") -> Timer:
    """A due timer of `owner` as a table of `partition` holds it (its `partition` field)."""
    return Timer(
        id=f"{owner.id}/{key}",
        owner=owner,
        key=key,
        version=1,
        partition=partition,
        rule=OnceRule(at=T0),
        target=AggregateRef(context="shop", aggregate="order", id="victim"),
        command=CommandSpec(type="Refund"),
        slot_due_at=T0,
        due_at=T0,
    )


def shop(id: str, **fields: str) -> AggregateRef:
    return AggregateRef(context="shop", aggregate="order", id=id, **fields)


# Each a row of partition 0 (its field) in partition 0, under its own row key: a row the
# live path never writes there.
FOREIGN = {
    "owner of another type": row(AggregateRef(context="bank", aggregate="account", id="a-1"), 0),
    "owner of another aggregate of the context": row(
        AggregateRef(context="shop", aggregate="cart", id=id_in(0)), 0
    ),
    "owner of another context, same aggregate name": row(
        AggregateRef(context="bank", aggregate="order", id=id_in(0)), 0
    ),
    "owner keyed to partition 3": row(shop(id_in(3)), 0),
    "owner keyed to partition 3, another tenant": row(shop(id_in(3), tenant="t1"), 0),
}


@pytest.fixture(params=["memory", "rocksdb"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[TimerStore]:
    """A store of shop.order's timers, as a node opens it (`app.node.opening`)."""
    url = "memory://" if request.param == "memory" else f"rocksdb://{tmp_path / 'timers'}"
    opened = open_timer_store(url, partitions=P, owner_type=(TOPICS.context, TOPICS.aggregate))
    try:
        yield opened
    finally:
        await opened.close()


def record(timer: Timer) -> tuple[str, int, bytes, bytes]:
    return (TOPICS.timers_changelog, 0, row_key(timer.owner, timer.key), encode_timer(timer))


@pytest.mark.parametrize("batch", [1, 100])
async def test_a_restore_passes_over_every_row_of_an_owner_the_partition_never_holds(
    store: TimerStore, batch: int
) -> None:
    """Between two rows of owners of the partition, each foreign row: none is loaded, each
    is reported once with why (its letter's reason), and the partition's own rows are."""
    ours, also = row(shop(id_in(0)), 0), row(shop(id_in(0, "p"), tenant="t1"), 0)
    log = MemoryLog([TopicSpec(TOPICS.timers_changelog, P)])
    await log.publisher().send_many(
        [record(ours), *(record(t) for t in FOREIGN.values()), record(also)]
    )
    unreadable: list[tuple[Record, str]] = []
    await restore_partition(
        store, log.reader(batch=batch), TOPICS.timers_changelog, 0, unreadable=unreadable
    )
    assert sorted(t.id for t in await store.due({0}, T0 + 1, 100)) == sorted([ours.id, also.id])
    assert [r.offset for r, _ in unreadable] == list(range(1, 1 + len(FOREIGN)))
    reasons = [why for _, why in unreadable]
    assert reasons[:3] == [
        "its owner is of type bank.account, not shop.order",
        "its owner is of type shop.cart, not shop.order",
        "its owner is of type bank.order, not shop.order",
    ]
    assert all("belongs in partition 3" in why for why in reasons[3:])
    for timer in FOREIGN.values():
        assert await store.find(timer.owner, timer.key) is None


@pytest.mark.parametrize("name", list(FOREIGN))
def test_the_fast_check_leaves_a_foreign_row_to_pydantic_which_refuses_it(name: str) -> None:
    """The RocksDB restore's fast check (`restored_index_as_is`) takes no foreign row, and
    the pydantic check behind it (`restored_row`, the memory store's) refuses it: one
    verdict whichever check decides."""
    timer = FOREIGN[name]
    key, value = row_key(timer.owner, timer.key), encode_timer(timer)
    assert restored_index_as_is(0, key, value) is not None  # a row of partition 0 otherwise
    assert restored_index_as_is(0, key, value, OWNERS) is None
    with pytest.raises(ValueError, match="its owner"):
        restored_index(0, key, value, OWNERS)
    with pytest.raises(ValueError, match="its owner"):
        restored_row(0, key, value, OWNERS)


@pytest.mark.parametrize("partition", range(P))
def test_a_row_of_an_owner_of_the_partition_takes_the_fast_path(partition: int) -> None:
    """The owner check costs the common row its fast path nothing: taken as it is, with the
    same index entry as without the check; whatever the tenant."""
    for owner in (shop(id_in(partition)), shop(id_in(partition, "t"), tenant="x")):
        timer = row(owner, partition)
        key, value = row_key(owner, "k"), encode_timer(timer)
        index: Any = restored_index_as_is(partition, key, value, OWNERS)
        assert index is not None and index == restored_index_as_is(partition, key, value)
        assert restored_row(partition, key, value, OWNERS) == timer


@settings(max_examples=300)
@given(timers, st.booleans(), st.booleans(), st.integers(1, 5))
def test_the_fast_check_and_pydantic_give_one_owner_verdict(
    timer: Timer, own_type: bool, keyed: bool, partitions: int
) -> None:
    """Generated rows (any names, ids, tenants) checked against a table of their owner's
    type or another, of 1 to 5 partitions, in the partition their `partition` field says
    (their owner's, or any): both checks take the row exactly when its owner is of the
    table's type and, unless the row is finished (never fires again), keyed to that
    partition."""
    if keyed:
        timer = timer.model_copy(update={"partition": partition_of(timer.owner.id, partitions)})
    context, aggregate = (timer.owner.context, timer.owner.aggregate) if own_type else ("x", "y")
    owners = TableOwners(context, aggregate, partitions)
    partition = timer.partition
    key, value = row_key(timer.owner, timer.key), encode_timer(timer)
    own = (timer.owner.context, timer.owner.aggregate) == (context, aggregate)
    keyed_here = partition_of(timer.owner.id, partitions) == partition
    takes = own and (keyed_here or timer.status not in ACTIVE)
    assert (restored_index_as_is(partition, key, value, owners) is not None) is takes
    try:
        restored_row(partition, key, value, owners)
    except ValueError:
        assert not takes
    else:
        assert takes


@pytest.mark.parametrize("status", [TimerStatus.FIRED, TimerStatus.CANCELLED])
def test_a_finished_row_of_an_owner_keyed_elsewhere_is_taken_unhashed(status: TimerStatus) -> None:
    """A finished row never fires again (its sweep deletes it): its owner's id is not
    hashed, which would cost a restore as much again a row. One of another type is still
    refused."""
    timer = FOREIGN["owner keyed to partition 3"].model_copy(update={"status": status})
    key, value = row_key(timer.owner, timer.key), encode_timer(timer)
    assert restored_index_as_is(0, key, value, OWNERS) is not None
    assert restored_row(0, key, value, OWNERS) == timer
    other = FOREIGN["owner of another type"].model_copy(update={"status": status})
    key, value = row_key(other.owner, other.key), encode_timer(other)
    assert restored_index_as_is(0, key, value, OWNERS) is None
    with pytest.raises(ValueError, match="its owner is of type"):
        restored_row(0, key, value, OWNERS)
