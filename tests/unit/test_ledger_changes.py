"""The ledger's changes by another's hand wait one a pair (`LedgerChanges`): a change of a
pair waiting joins it, the oldest pair comes first, and one taken waits anew."""

from __future__ import annotations

import asyncio

from app.timers.ledger_changes import LedgerChanges
from app.timers.ledger_view import LedgerKey
from tables.refs import AggregateRef

A, B = (LedgerKey("tickwheel.timers", AggregateRef(context="s", aggregate="o", id=i)) for i in "ab")


async def test_the_changes_of_a_pair_wait_as_one_the_oldest_first() -> None:
    changes = LedgerChanges()
    for n in range(100):
        changes.put(A, 1.0 + n)  # a burst of another node's records of one target
        changes.put(B, 2.0 + n)
    assert changes.qsize() == 2
    assert await changes.first() == (A, 1.0), "its place and first time kept"
    assert await changes.first() == (A, 1.0), "until taken"
    changes.take(A)
    changes.put(A, 500.0)  # a change read after its look began: looked at again
    assert await changes.first() == (B, 2.0)
    changes.take(B)
    assert await changes.first() == (A, 500.0)
    changes.take(A)
    assert changes.qsize() == 0


async def test_the_first_waits_for_a_change() -> None:
    changes = LedgerChanges()
    waiting = asyncio.create_task(changes.first())
    await asyncio.sleep(0)
    assert not waiting.done()
    changes.put(B, 7.0)
    assert await waiting == (B, 7.0)
    changes.take(B)
    again = asyncio.create_task(changes.first())
    await asyncio.sleep(0)
    assert not again.done(), "nothing waits once taken"
    changes.put(A, 8.0)
    assert await again == (A, 8.0)
