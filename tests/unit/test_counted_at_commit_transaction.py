"""A partition transaction's counts (`Counts`, staged with a cycle's work) are counted when
the commit that carries them lands, once; a commit that fails, a cycle thrown away
(`discard`) and a close (`abandon`) count none of them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry, Counter

from app.errors import KafkaUnavailable
from app.kafka import OutRecord
from app.node.partition_transaction import Counts, PartitionTransaction


class Writer:
    """Commits land, until `failing`."""

    def __init__(self) -> None:
        self.failing = False
        self.broken = None

    async def commit(
        self, records: Sequence[OutRecord], offsets: dict[tuple[str, int], int], group_id: str
    ) -> list[int]:
        if self.failing:
            raise KafkaUnavailable("the commit failed")
        return list(range(len(records)))


async def test_counts_apply_when_their_transaction_lands_and_never_otherwise() -> None:
    counter = Counter("c", "c", ["k"], registry=CollectorRegistry())
    a, b = counter.labels("a"), counter.labels("b")
    told: list[str] = []
    writer = Writer()
    txn = PartitionTransaction(cast(Any, writer), "t.timers", 0, "g")

    def cycle(n: int) -> Counts:
        counts = Counts()
        counts.add(a, n)
        counts.add(b, 0)  # nothing: no series made by it
        counts.later.append(lambda: told.append(f"round {n}"))
        return counts

    def value(child: Counter) -> float:
        return cast(float, child._value.get())

    txn.stage([("t.events", 0, b"k", b"v")], {}, None, cycle(2))
    txn.discard()  # a cycle cut short: nothing of it counts
    txn.stage([("t.events", 0, b"k", b"v")], {}, None, cycle(3))
    writer.failing = True
    with pytest.raises(KafkaUnavailable):
        await txn.commit()
    assert value(a) == 0 and told == []

    writer.failing = False
    txn.stage([("t.events", 0, b"k", b"v")], {}, None, cycle(4))
    txn.stage([("t.events", 0, b"k", b"w")], {}, None, cycle(5))
    txn.count(b, 7)
    await txn.commit()
    assert (value(a), value(b), told) == (9, 7, ["round 4", "round 5"])
    await txn.commit()  # nothing waits: nothing counted again
    assert (value(a), value(b)) == (9, 7)

    txn.stage([("t.events", 0, b"k", b"v")], {}, None, cycle(1))
    txn.abandon()  # the task's close: what waits never counts
    assert value(a) == 9
