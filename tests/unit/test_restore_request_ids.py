"""A restore remembers the request id of every event of the log, those it passes over too.

An event a restore cannot fold (an applier changed by a deploy raises on it, say) is
still in the log: its request was applied. Forgotten, the same request sent again to the
node that restored the partition was decided afresh, and a second event written for it."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from fakes import T0
from pydantic import BaseModel

from app.commands.processor import CommandProcessor
from app.kafka import OutRecord, Record
from app.model.aggregate import AggregateType, Command, Decision
from app.protocol.wire import CommandEnvelope, ResultCode, encode
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
    if APPLIER_RAISES["now"]:  # as a deploy's changed applier might
        raise KeyError("amount_cents")
    return state.model_copy(update={"paid": state.paid + event.body["amount"]})


ORDER = AggregateRef(context="shop", aggregate="order", id="o-1")
P = partition_of(ORDER.id, PARTITIONS)


class Commits:
    def __init__(self) -> None:
        self.records: list[OutRecord] = []

    async def __call__(self, records: Sequence[OutRecord], offsets: object) -> list[int]:
        start = len(self.records)
        self.records.extend(records)
        return list(range(start, len(self.records)))

    def events(self) -> list[OutRecord]:
        return [r for r in self.records if r[0] == "shop.order.events"]


class Log:
    def __init__(self, records: list[Record]) -> None:
        self.records = records

    async def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        return 0, len(self.records)

    async def read(self, topic: str, partition: int, start: int) -> AsyncIterator[list[Record]]:
        yield [r for r in self.records if r.offset >= start]


def processor(commits: Commits, now: int) -> CommandProcessor:
    """A processor of P, with an empty state store: a node that has just taken P."""
    return CommandProcessor(
        orders,
        P,
        partitions=PARTITIONS,
        states=MemoryAggregateStore(),
        commit=commits,
        now=lambda: now,
    )


def command(offset: int) -> Record:
    pay = CommandEnvelope(request_id="pay-1", type="shop.Pay", aggregate=ORDER, issued_at=T0)
    return Record("shop.order.commands", P, offset, ORDER.id.encode(), encode(pay), T0, ())


@pytest.fixture(autouse=True)
def applier_as_written() -> Any:
    APPLIER_RAISES["now"] = False
    yield
    APPLIER_RAISES["now"] = False


async def test_a_request_whose_event_a_restore_passes_over_is_a_duplicate_after_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    first = Commits()
    node_a = processor(first, T0)
    assert dict((await node_a.handle([command(0)])).codes) == {ResultCode.COMMITTED: 1}
    log = Log([Record(t, P, i, k, v, T0, ()) for i, (t, _, k, v, *_) in enumerate(first.events())])
    APPLIER_RAISES["now"] = True
    again = Commits()
    node_b = processor(again, T0 + 1_000)
    with caplog.at_level(logging.WARNING):
        await node_b.restore(log)
    assert "restore passes over event" in caplog.text
    assert dict((await node_b.handle([command(1)])).codes) == {ResultCode.DUPLICATE: 1}
    assert again.events() == []
