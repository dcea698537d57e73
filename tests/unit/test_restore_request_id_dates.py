"""A restore dates a followed event's request id as the live follow did: at the latest of
its writer's date and its record's (when it was logged, so read). Another writer dating
its events 0 (or a clock behind by more than the window) had its request id kept a window
by the node that followed it live, and forgotten by the restore of the partition's next
take: the same request sent again was applied twice, and the same request appended
again by its writer was folded twice. A hunt.

A command's own date (`issued_at`) dates nothing: the events a node decides carry its
clock's, the time its live path keeps their request id from."""

from __future__ import annotations

from fakes import T0
from test_restore_request_ids import (
    ORDER,
    Commits,
    P,
    follow_all,
    logged,
    paid_of,
    processor,
    theirs,
)

from app.kafka import Record
from app.protocol.wire import CommandEnvelope, EventEnvelope, ResultCode, encode
from tables.aggregate_store import MemoryAggregateStore

RETAKEN = T0 + 1_000
"""A second later: the partition's next take (this node's restart, or another node's)."""


def undated(i: int, version: int, request_id: str) -> EventEnvelope:
    """Another writer's event dated 0, logged at T0 (`logged`)."""
    return theirs(i, version, request_id).model_copy(update={"created_at": 0})


def sent_again(request_id: str, offset: int) -> Record:
    pay = CommandEnvelope(request_id=request_id, type="shop.Pay", aggregate=ORDER, issued_at=T0)
    return Record("shop.order.commands", P, offset, ORDER.id.encode(), encode(pay), T0, ())


async def test_another_writers_undated_request_is_a_duplicate_after_a_retake() -> None:
    event = undated(0, 1, "pay-9")
    commits = Commits()
    live = processor(commits)
    assert await follow_all(live, commits, [(0, event)]) == [True]
    assert dict((await live.handle([sent_again("pay-9", 1)])).codes) == {ResultCode.DUPLICATE: 1}
    again = Commits()
    retaken = processor(again, now=lambda: RETAKEN)
    await retaken.restore(logged(event))
    codes = (await retaken.handle([sent_again("pay-9", 2)])).codes
    assert dict(codes) == {ResultCode.DUPLICATE: 1}
    assert again.events() == [] and paid_of(retaken) == 100


async def test_an_undated_request_appended_again_is_not_folded_after_a_retake() -> None:
    first, other, repeated = undated(0, 1, "pay-9"), theirs(0, 2, "pay-10"), undated(1, 3, "pay-9")
    commits = Commits()
    live = processor(commits)
    assert await follow_all(live, commits, [(0, first), (1, other)]) == [True, True]
    assert await follow_all(live, commits, [(2, repeated)]) == [False]
    assert paid_of(live) == 200
    # A copy restored up to `other`, then on from its offset at the next take: the fold
    # rule asks its store whether pay-9 was folded.
    store = MemoryAggregateStore()
    await processor(Commits(), store, now=lambda: RETAKEN).restore(logged(first, other))
    retaken = processor(Commits(), store, now=lambda: RETAKEN)
    await retaken.restore(logged(first, other, repeated))
    assert paid_of(retaken) == 200
