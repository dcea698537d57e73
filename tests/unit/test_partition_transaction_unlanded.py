"""A partition's transaction keeps, with each timer row it buffers, the row that write
replaced, until the commit that takes it lands (`PartitionTransaction.unlanded`): what a
failed close rolls the store back to, per key the row before its first write that did
not land. A landed commit tells the store its last row's offset."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import pytest

from app.errors import KafkaUnavailable
from app.kafka import OutRecord, TransactionalWriter
from app.node.partition_transaction import PartitionTransaction
from tables import AggregateRef, CommandSpec, IntervalRule, Timer

OWNER = AggregateRef(context="shop", aggregate="order", id="o1")


def row(key: str, version: int) -> Timer:
    return Timer(
        id=f"{key}-{version}", owner=OWNER, key=key, version=version, partition=0,
        rule=IntervalRule(start=1_000, every=60_000), target=OWNER,
        command=CommandSpec(type="Fire"), slot_due_at=1_000, due_at=1_000,
    )  # fmt: skip


class Writer:
    """Commits land at offsets counted from 100, until `failing`."""

    def __init__(self) -> None:
        self.failing = False
        self.next = 100
        self.broken = None

    async def commit(
        self, records: Sequence[OutRecord], offsets: dict[tuple[str, int], int], group_id: str
    ) -> list[int]:
        if self.failing:
            raise KafkaUnavailable("the commit failed")
        first, self.next = self.next, self.next + len(records) + 1  # and its marker
        return list(range(first, first + len(records)))


async def test_unlanded_holds_the_rows_before_the_first_write_not_landed() -> None:
    writer = Writer()
    txn = PartitionTransaction(cast(TransactionalWriter, writer), "t.timers", 0, "g")
    landed: list[int] = []

    async def rows_landed(offset: int) -> None:
        landed.append(offset)

    txn.rows_landed = rows_landed
    a1, a2, b1 = row("a", 1), row("a", 2), row("b", 1)
    txn.add(b"a", b"a1", None)
    txn.add(b"b", b"b1", None)
    taken = txn.take()
    assert taken is not None
    assert await taken.send() == [100, 101]
    assert landed == [101], "the last row's offset"
    assert txn.unlanded() == {}

    txn.add(b"a", b"a2", a1)  # a's first write not landed: a1 before it
    writer.failing = True
    failed = txn.take()
    assert failed is not None
    with pytest.raises(KafkaUnavailable):
        await failed.send()
    txn.add(b"a", b"a3", a2)  # later: a1 still what the landed commit left
    txn.add(b"b", None, b1)
    txn.add(b"c", b"c1", None)
    assert txn.unlanded() == {b"a": a1, b"b": b1, b"c": None}
    assert landed == [101]
    txn.abandon()  # the close: buffered rows dropped, what they replaced kept
    assert txn.unlanded() == {b"a": a1, b"b": b1, b"c": None}


async def test_a_discard_says_so() -> None:
    txn = PartitionTransaction(cast(Any, Writer()), "t.timers", 0, "g")
    txn.stage([("t.events", 0, b"k", b"v")], {})
    txn.discard()
    assert not txn.discarded, "no row was thrown away"
    txn.add(b"a", b"a1", None)
    txn.discard()
    assert txn.discarded and txn.unlanded() == {}
