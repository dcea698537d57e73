"""A restore remembers the request id of every event of the log, those it passes over too;
the live follow folds every event of another writer's decision.

An event a restore cannot fold (an applier changed by a deploy raises on it, say) is
still in the log: its request was applied. Forgotten, the same request sent again to the
node that restored the partition was decided afresh, and a second event written for it.
The same for an event of another writer the live follow dead-letters. Kept as passed
over, not folded: the follow still tries such an event when it reads it, and
dead-letters it.

Another writer's decision of several events writes them with one request id: the follow
folded the first and passed the others over as applied, the aggregate missing them."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from fakes import T0, OneBatchLog
from pydantic import BaseModel

import app.commands.folds as folds_module
from app.commands.batch import CommandBatch
from app.commands.processor import CommandProcessor
from app.commands.records import state_key
from app.kafka import OutRecord, Record
from app.model.aggregate import AggregateType, Command, Decision
from app.model.decide import event_id
from app.protocol.wire import CommandEnvelope, EventEnvelope, ResultCode, encode
from tables import AggregateRef
from tables.aggregate_store import MemoryAggregateStore
from tables.partitioner import partition_of

PARTITIONS = 4


class Paid(BaseModel):
    paid: int = 0


orders = AggregateType("shop", "order", Paid)
APPLIER_RAISES = {"now": False}


@orders.command("shop.Pay")
def pay(state: Paid, cmd: Command, d: Decision) -> None:
    d.emit("shop.Paid", {"amount": 100})


@orders.applies("shop.Paid")
def paid(state: Paid, event: Any) -> Paid:
    if APPLIER_RAISES["now"] or event.body.get("bad"):  # as a deploy's changed applier might
        raise KeyError("amount_cents")
    return state.model_copy(update={"paid": state.paid + event.body["amount"]})


ORDER = AggregateRef(context="shop", aggregate="order", id="o-1")
P = partition_of(ORDER.id, PARTITIONS)
EVENTS = "shop.order.events"


class Commits:
    def __init__(self) -> None:
        self.records: list[OutRecord] = []

    async def __call__(self, records: Sequence[OutRecord], offsets: object) -> list[int]:
        start = len(self.records)
        self.records.extend(records)
        return list(range(start, len(self.records)))

    def events(self) -> list[OutRecord]:
        return [r for r in self.records if r[0] == "shop.order.events"]


def theirs(
    i: int, version: int, request_id: str = "pay-9", *, bad: bool = False, on: AggregateRef = ORDER
) -> EventEnvelope:
    """The `i`-th event of another writer's decision `request_id` on the order (`bad`: its
    applier raises on it)."""
    return EventEnvelope(
        id=event_id(on, request_id, i),
        type="shop.Paid",
        aggregate=on,
        version=version,
        created_at=T0,
        body={"amount": 100, "bad": bad},
        request_id=request_id,
    )


def processor(
    commits: Commits,
    store: MemoryAggregateStore | None = None,
    now: Callable[[], int] = lambda: T0,
    window: int = 7 * 24 * 3_600_000,
) -> CommandProcessor:
    return CommandProcessor(
        orders,
        P,
        partitions=PARTITIONS,
        states=store or MemoryAggregateStore(),
        commit=commits,
        now=now,
        request_id_window=window,
    )


def logged(*events: EventEnvelope) -> OneBatchLog:
    """A log of `events`, at offsets 0, 1, ..."""
    return OneBatchLog(
        [
            Record(EVENTS, P, i, e.aggregate.id.encode(), encode(e), T0, ())
            for i, e in enumerate(events)
        ]
    )


def follows(node: CommandProcessor, batch: CommandBatch, at: int, event: EventEnvelope) -> object:
    """What the follow makes of `event` at offset `at`: folded or not, or what it raised
    (the caller dead-letters the record for it)."""
    try:
        return node.follow(batch, event, at)
    except KeyError as exc:
        return exc


async def follow_all(
    node: CommandProcessor, commits: Commits, events: list[tuple[int, EventEnvelope]]
) -> list[bool]:
    batch = node.begin()
    followed = [node.follow(batch, e, offset) for offset, e in events]
    node.staged(batch)
    node.committed(batch, await commits(batch.out, batch.offsets))
    return followed


def paid_of(node: CommandProcessor, ref: AggregateRef = ORDER) -> int:
    stored = node._states.stored(state_key(ref))
    assert stored is not None
    return int(stored.state["paid"])


def command(offset: int, at: int = T0) -> Record:
    """pay-1's command, sent at `at`."""
    pay = CommandEnvelope(request_id="pay-1", type="shop.Pay", aggregate=ORDER, issued_at=at)
    return Record("shop.order.commands", P, offset, ORDER.id.encode(), encode(pay), at, ())


@pytest.fixture(autouse=True)
def applier_as_written() -> Any:
    APPLIER_RAISES["now"] = False
    yield
    APPLIER_RAISES["now"] = False


async def test_a_request_whose_event_a_restore_passes_over_is_a_duplicate_after_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    first = Commits()
    node_a = processor(first)
    assert dict((await node_a.handle([command(0)])).codes) == {ResultCode.COMMITTED: 1}
    log = OneBatchLog(
        [Record(t, P, i, k, v, T0, ()) for i, (t, _, k, v, *_) in enumerate(first.events())]
    )
    APPLIER_RAISES["now"] = True
    again = Commits()
    node_b = processor(again, now=lambda: T0 + 1_000)
    with caplog.at_level(logging.WARNING):
        await node_b.restore(log)
    assert "restore passes over event" in caplog.text
    assert dict((await node_b.handle([command(1)])).codes) == {ResultCode.DUPLICATE: 1}
    assert again.events() == []


async def test_a_request_whose_event_the_live_follow_dead_letters_is_a_duplicate_after() -> None:
    # Another writer's event for request pay-1, which this node's applier raises on: the
    # caller dead-letters it, and the request id counts as applied with the batch.
    commits = Commits()
    node = processor(commits)
    APPLIER_RAISES["now"] = True
    batch = node.begin()
    with pytest.raises(KeyError):  # the applier's own, as raised to the subscription
        node.follow(batch, theirs(0, 1, "pay-1"), 3)
    node.staged(batch)
    node.committed(batch, await commits(batch.out, batch.offsets))
    APPLIER_RAISES["now"] = False
    assert dict((await node.handle([command(4)])).codes) == {ResultCode.DUPLICATE: 1}
    assert commits.events() == []


async def test_an_event_a_restore_passed_over_is_still_tried_by_the_follow() -> None:
    # A retake's restore reads the log to its end, past what the subscription has read:
    # the bad event is passed over there first. Its id kept as applied, the follow took it
    # for this node's own and passed it over too, never dead-lettered.
    log = OneBatchLog(
        [Record("shop.order.events", P, 0, ORDER.id.encode(), encode(theirs(0, 1)), T0, ())]
    )
    APPLIER_RAISES["now"] = True
    commits = Commits()
    node = processor(commits)
    await node.restore(log)
    batch = node.begin()
    with pytest.raises(KeyError):  # the applier's own: the caller dead-letters the record
        node.follow(batch, theirs(0, 1), 0)
    APPLIER_RAISES["now"] = False
    assert dict((await node.handle([command(1)])).codes) == {ResultCode.COMMITTED: 1}, (
        "pay-1 was never applied"
    )
    assert dict((await node.handle([command(2)])).codes) == {ResultCode.DUPLICATE: 1}


async def test_another_writers_decision_of_several_events_is_followed_whole() -> None:
    commits = Commits()
    node = processor(commits)
    events = [(3, theirs(0, 1)), (4, theirs(1, 1)), (6, theirs(2, 1))]
    assert await follow_all(node, commits, events[:2]) == [True, True]
    assert await follow_all(node, commits, events[2:]) == [True], "in the next batch too"
    assert paid_of(node) == 300
    # Read again (a consumer's redelivery): folded once.
    assert await follow_all(node, commits, events) == [False, False, False]
    assert paid_of(node) == 300
    # A decision whose events have a version each, too.
    later = [(7, theirs(0, 2, "pay-8")), (8, theirs(1, 3, "pay-8"))]
    assert await follow_all(node, commits, later) == [True, True]
    assert paid_of(node) == 500


async def test_this_nodes_own_decision_read_back_is_not_folded_again() -> None:
    commits = Commits()
    node = processor(commits)
    assert await follow_all(node, commits, [(0, theirs(0, 1))]) == [True]
    assert dict((await node.handle([command(1)])).codes) == {ResultCode.COMMITTED: 1}
    assert paid_of(node) == 200
    own = [EventEnvelope.model_validate_json(r[3] or b"") for r in commits.events()]
    assert [e.request_id for e in own] == ["pay-1"]
    # Its own event read back, after another writer's followed: passed over.
    assert await follow_all(node, commits, [(2, own[0])]) == [False]
    # A late event of the request followed first, behind the aggregate's version now.
    assert await follow_all(node, commits, [(3, theirs(1, 1))]) == [False]
    assert paid_of(node) == 200


async def test_a_restore_that_folds_part_of_a_request_leaves_the_rest_to_be_dead_lettered() -> None:
    # Its first event folded, the request counts as folded: without the restore's note of
    # the event passed over, the follow took the second for folded too, never dead-lettered.
    log = logged(theirs(0, 1), theirs(1, 1, bad=True))
    node = processor(Commits())
    await node.restore(log)
    batch = node.begin()
    assert follows(node, batch, 0, theirs(0, 1)) is False
    assert isinstance(follows(node, batch, 1, theirs(1, 1, bad=True)), KeyError)
    assert follows(node, batch, 1, theirs(1, 1, bad=True)) is False, "dead-lettered once"
    assert paid_of(node) == 100


async def test_an_event_a_restore_passed_over_before_one_it_folded_is_dead_lettered() -> None:
    # The later event folded, the aggregate's version is past the bad one's: the follow
    # passed it over as behind, never dead-lettered.
    log = logged(theirs(0, 1, "pay-8", bad=True), theirs(0, 2, "pay-9"))
    node = processor(Commits())
    await node.restore(log)
    batch = node.begin()
    assert isinstance(follows(node, batch, 0, theirs(0, 1, "pay-8", bad=True)), KeyError)
    assert follows(node, batch, 1, theirs(0, 2, "pay-9")) is False
    assert paid_of(node) == 100


async def test_a_request_followed_then_decided_here_again_is_not_folded_twice() -> None:
    # pay-1 followed as another writer's, forgotten past the window, then sent here: its own
    # event read back matched the follow's mark (same request id, later offset), folded again.
    clock = [T0]
    commits = Commits()
    node = processor(commits, now=lambda: clock[0], window=1_000)
    assert await follow_all(node, commits, [(0, theirs(0, 1, "pay-1"))]) == [True]
    clock[0] += 5_000
    await follow_all(node, commits, [])  # its commit sweeps pay-1
    assert dict((await node.handle([command(1, clock[0])])).codes) == {ResultCode.COMMITTED: 1}
    own = EventEnvelope.model_validate_json(commits.events()[-1][3] or b"")
    assert await follow_all(node, commits, [(2, own)]) == [False]
    assert paid_of(node) == 200


async def test_past_the_bound_the_oldest_marks_go_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(folds_module, "FOLLOWING_MAX", 2)
    ids = [i for i in (f"o-{n}" for n in range(200)) if partition_of(i, PARTITIONS) == P][:3]
    refs = [AggregateRef(context="shop", aggregate="order", id=i) for i in ids]
    commits = Commits()
    node = processor(commits)
    firsts = [(n, theirs(0, 1, f"r-{n}", on=ref)) for n, ref in enumerate(refs)]
    assert await follow_all(node, commits, firsts) == [True, True, True]
    assert await follow_all(node, commits, []) == []  # another batch staged: the marks kept
    seconds = [(10 + n, theirs(1, 1, f"r-{n}", on=ref)) for n, ref in enumerate(refs)]
    assert await follow_all(node, commits, seconds[1:]) == [True, True]
    assert [paid_of(node, ref) for ref in refs] == [100, 200, 200]
