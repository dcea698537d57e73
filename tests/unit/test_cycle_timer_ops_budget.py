"""A log batch's timer operations count against its cycle's budget (`DECIDE_BUDGET_S`):
one whose store call is long (an owner's deletion reads that owner's live rows) is
carried out before the next record is read, and once the budget is spent the records
after it are the next cycle's (hunt F1: ten deletions in one batch were all carried out
after the last record was read, and held the event loop 11 s in one cycle). The offsets
a cycle commits cover the records whose operations it carried out, no more."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, cast

import pytest

from app.kafka import Record
from app.node import cycle_timers
from app.node.cycle_timers import TimerTableCycles
from app.node.cycle_work import CycleWork
from app.node.kept import KeptType
from app.node.metrics import NodeMetrics
from app.protocol.limits import InputLimits
from app.protocol.wire import AGGREGATE_DELETED, SCHEDULE_SET, EventEnvelope, encode
from tables import AggregateRef, Timer, TimerStatus, open_timer_store
from tables.partition_handle import PartitionHandle
from tables.partitioned import PartitionedStore
from tables.partitioner import partition_of
from tables.tombstones import CancelMark

PARTITIONS = 2
OWNER = AggregateRef(context="life", aggregate="counter", id="o1")
P = partition_of(OWNER.id, PARTITIONS)
NOW = 1_000_000
TOPIC = "life.counter.events"


class Clock:
    """The cycle's clock (`past_deadline`'s): a deletion carried out takes a second."""

    def __init__(self) -> None:
        self.now = 0.0
        self.deletions = 0

    def past(self, deadline: float) -> bool:
        return self.now > deadline


class Cycles(TimerTableCycles):
    def __init__(self) -> None:
        self._partitions = PARTITIONS
        self._metrics = NodeMetrics()
        self.limits = InputLimits()


def record(offset: int, type_: str, version: int, body: dict[str, Any]) -> Record:
    event = EventEnvelope(
        id=uuid.uuid4().hex,
        type=type_,
        aggregate=OWNER,
        version=version,
        created_at=NOW,
        body=body,
    )
    return Record(TOPIC, P, offset, OWNER.id.encode(), encode(event), NOW)


def set_(offset: int, version: int) -> Record:
    body = {"key": f"k{version}", "rule": {"kind": "once", "at": NOW + 60_000}}
    return record(offset, SCHEDULE_SET, version, {**body, "command": {"type": "Fire"}})


def deleted(offset: int, version: int) -> Record:
    return record(offset, AGGREGATE_DELETED, version, {})


@pytest.fixture
async def store() -> AsyncIterator[PartitionedStore]:
    opened = open_timer_store("memory://", partitions=PARTITIONS)
    assert isinstance(opened, PartitionedStore)
    yield opened
    await opened.close()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(cycle_timers, "past_deadline", clock.past)
    cancel_all = PartitionHandle.cancel_all

    async def slow(
        self: PartitionHandle, owner: AggregateRef, version: int, mark: CancelMark | None = None
    ) -> int:
        clock.deletions += 1
        clock.now += 1.0
        return await cancel_all(self, owner, version, mark)

    monkeypatch.setattr(PartitionHandle, "cancel_all", slow)
    return clock


def work(store: PartitionedStore, deadline: float | None) -> CycleWork:
    offered: list[Timer] = []
    kept = SimpleNamespace(
        topics=SimpleNamespace(type_name=OWNER.type_name),
        name=OWNER.type_name,
        agg=None,
        runner=SimpleNamespace(offer=offered.extend),
        loop=SimpleNamespace(wake_partition=lambda p, reload: None),
    )
    w = CycleWork(cast(KeptType, kept), NOW, InputLimits(), None, store=store.partition(P))
    w.deadline = deadline
    return w


async def test_records_after_a_deletion_past_the_budget_are_the_next_cycles(
    store: PartitionedStore, clock: Clock
) -> None:
    records = [set_(0, 1), set_(1, 2), deleted(2, 3), deleted(3, 4), deleted(4, 5), set_(5, 6)]
    w = work(store, deadline=0.5)
    wrote, taken = await Cycles()._subscribe(w.kept, records, w)
    assert wrote
    assert clock.deletions == 1, "deletions carried out past the cycle's budget"
    assert taken == 3  # the two sets and the deletion carried out: the rest is left
    rows = await store.timers_of(OWNER)
    assert {t.key: t.status for t in rows if not t.key.startswith("\x00")} == {
        "k1": TimerStatus.CANCELLED,
        "k2": TimerStatus.CANCELLED,
    }
    # The next cycle, its budget anew, from the first record left.
    clock.now = 0.0
    w = work(store, deadline=0.5)
    wrote, taken = await Cycles()._subscribe(w.kept, records[3:], w)
    assert (taken, clock.deletions) == (1, 2)
    w = work(store, deadline=10.0)
    wrote, taken = await Cycles()._subscribe(w.kept, records[4:], w)
    assert (taken, clock.deletions) == (2, 3)
    k6 = await store.find(OWNER, "k6")
    assert k6 is not None and k6.status is TimerStatus.PENDING


async def test_without_a_deadline_the_whole_batch_is_carried_out(
    store: PartitionedStore, clock: Clock
) -> None:
    records = [set_(0, 1), deleted(1, 2), deleted(2, 3), set_(3, 4)]
    w = work(store, deadline=None)
    _, taken = await Cycles()._subscribe(w.kept, records, w)
    assert (taken, clock.deletions) == (4, 2)
