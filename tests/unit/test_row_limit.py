"""A row its changelog takes no more (`app.node.row_limit`): the partition's sink refuses a
write holding one, none of it joining the transaction, and notes its key; the next take
deletes the row through `PartitionHandle.drop` (a tombstone to the sink, then locally, on
both backends) and letters it whole. The node's whole course, on the in-memory log:
`test_node_topic_limits`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.errors import RecordTooLarge
from app.kafka.catalog import TopicCatalog
from app.node.row_limit import RowLimit
from app.protocol.dead_letters import DeadLetter, Stage
from tables import (
    DEFAULT_TENANT,
    AggregateRef,
    CommandSpec,
    OnceRule,
    StoreClosed,
    Timer,
    TimerStatus,
    open_timer_store,
)
from tables.keys import encode_timer, row_key
from tables.partitioned import PartitionedStore
from tables.store import ChangelogRecord

TOPIC = "shop.order.timers"


def _timer(owner: str, pad: int = 0) -> Timer:
    ref = AggregateRef(context="shop", aggregate="order", tenant=DEFAULT_TENANT, id=owner)
    return Timer(
        id=f"{owner}/k/1",
        owner=ref,
        key="k",
        version=1,
        partition=0,
        rule=OnceRule(at=1_000),
        target=ref,
        command=CommandSpec(type="Remind", body={"pad": "x" * pad}),
        slot_due_at=1_000,
        due_at=1_000,
    )


@pytest.fixture(params=["memory", "rocksdb"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[PartitionedStore]:
    url = "memory://" if request.param == "memory" else f"rocksdb://{tmp_path / 's'}"
    opened = open_timer_store(url, partitions=2)
    assert isinstance(opened, PartitionedStore)
    await opened.assign({0, 1})
    yield opened
    await opened.close()


def test_a_write_with_a_row_over_the_limit_is_refused_whole_and_its_key_noted() -> None:
    limit = RowLimit(TOPIC, {TOPIC: 1_000})
    small, big = b"small", b"big"
    fits = [ChangelogRecord(0, small, b"x" * 900), ChangelogRecord(0, big, None)]
    limit.check(0, fits)  # a tombstone is never over
    with pytest.raises(RecordTooLarge, match=r"shop.order.timers\[0\]: a timer row of 1004"):
        limit.check(0, [ChangelogRecord(0, small, b"x"), ChangelogRecord(0, big, b"x" * 1001)])
    assert limit.noted(0) == {big} and limit.noted(1) == set()


async def test_drop_deletes_a_row_through_the_sink_then_locally(store: PartitionedStore) -> None:
    sunk: list[ChangelogRecord] = []

    async def sink(records: list[ChangelogRecord]) -> None:
        sunk.extend(records)

    handle = store.partition(0)
    handle.attach(sink)
    kept, dropped = _timer("a"), _timer("b")
    assert await handle.put(kept) and await handle.put(dropped)
    row = row_key(dropped.owner, dropped.key)
    sunk.clear()
    held = await handle.drop(row)
    assert held is not None and held.id == dropped.id
    assert sunk == [ChangelogRecord(0, row, None, held)]
    assert await handle.find(dropped.owner, "k") is None
    assert [t.id for t in await handle.due(10_000, 10)] == [kept.id]
    assert handle.status_counts()[TimerStatus.PENDING] == 1
    assert await handle.drop(row) is None and len(sunk) == 1  # none held: nothing written
    await store.revoke({0})
    with pytest.raises(StoreClosed):
        await handle.drop(row)


async def test_the_take_letters_and_deletes_a_noted_row_still_over(
    store: PartitionedStore,
) -> None:
    """Noted rows: one still over (deleted, lettered whole), one set again smaller since
    (kept), one gone since (nothing)."""
    handle = store.partition(0)
    big, small = _timer("big", pad=3_000), _timer("small")
    assert await handle.put(big) and await handle.put(small)
    rows = [row_key(t.owner, t.key) for t in (big, small, _timer("gone"))]
    limit = RowLimit(TOPIC, {TOPIC: 10_000})  # 8 KiB of it room to grow: fits ~1.8 KB rows
    with pytest.raises(RecordTooLarge):
        limit.check(0, [ChangelogRecord(0, r, b"x" * 10_001) for r in rows])
    [letter], deleted = await limit.letter_noted(handle, now=5_000, limit=1_000_000)
    assert deleted == [rows[0]] and limit.noted(0) == {rows[0]}  # until its commit lands
    limit.landed(0, deleted)
    assert limit.noted(0) == set()
    assert await handle.find(big.owner, "k") is None
    assert await handle.find(small.owner, "k") == small
    assert len(letter) == 5
    topic, _, key, value, headers = letter
    read = DeadLetter.read(key, value, headers)
    assert topic == "shop.dead-letters" and read.topic == TOPIC and read.key == rows[0]
    assert read.value == encode_timer(big) and read.context.stage is Stage.RESTORE
    assert f"timer {big.id}" in read.context.exception_message


async def test_a_limit_raised_since_the_last_read_deletes_nothing(store: PartitionedStore) -> None:
    """The take reads the limit again before it deletes: raised since the sink refused
    the row (the catalog's last read up to 30 s old), the row is kept."""
    handle = store.partition(0)
    big = _timer("big", pad=3_000)
    assert await handle.put(big)
    row = row_key(big.owner, big.key)
    limits = {TOPIC: 65_536}

    async def read_limits(topics: list[str]) -> dict[str, int | None]:
        return {t: limits[t] for t in topics}

    async def no_topics() -> set[str]:
        return set()

    catalog = TopicCatalog(no_topics, lambda: 0, read_limits=read_limits)
    kept = {TOPIC: 10_000}  # what the node's start read
    catalog.keep_current(kept, [TOPIC])
    limit = RowLimit(TOPIC, kept, catalog)
    with pytest.raises(RecordTooLarge):
        limit.check(0, [ChangelogRecord(0, row, b"x" * 10_001)])
    assert await limit.letter_noted(handle, now=5_000, limit=1_000_000) == ([], [])
    assert await handle.find(big.owner, "k") == big and kept == {TOPIC: 65_536 - 512}
    await catalog.stop()
