"""Property: over any sequence of this node's decisions and other writers' appends, a
fresh copy restoring the log folds the same events as the node that followed it live,
and takes the same request ids as applied (`app.commands.folds`).

Live is modelled as a node keeps up: each decision is taken on the aggregate as the log
before it left it (its follow caught up), and it reads its own events back. Another
writer's events: ahead of, at or behind the aggregate's version; one or several of one
request (one version, or one each); of a request id seen before or none; a user event,
one whose applier raises, one only a lenient read takes (`decode_event`), a delete, an
unknown `wow.` type (refused by the subscription before the follow). Other writers' request
ids are their own: one under the request id of this node's last decision is the case the
log cannot tell (`app.commands.folds`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import orjson
from fakes import T0
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from app.commands.processor import CommandProcessor, state_key
from app.errors import node_fault
from app.kafka import OutRecord, Record
from app.model.aggregate import AggregateType, Command, Decision, Event
from app.protocol.wire import (
    AGGREGATE_DELETED,
    CommandEnvelope,
    EventEnvelope,
    decode_event,
    encode,
    unknown_system_event,
)
from tables import AggregateRef
from tables.aggregate_store import MemoryAggregateStore
from tables.partitioner import partition_of

PARTITIONS = 4
EVENTS = "shop.order.events"
IDS = [i for i in (f"o-{n}" for n in range(100)) if partition_of(i, PARTITIONS) == 0][:2]
REFS = [AggregateRef(context="shop", aggregate="order", id=i) for i in IDS]


class Folded(BaseModel):
    ids: list[str] = []


orders = AggregateType("shop", "order", Folded)


@orders.command("shop.Add")
def add(state: Folded, cmd: Command, d: Decision) -> None:
    for _ in range(int(cmd.body["k"])):
        d.emit("shop.Added", {})


@orders.applies("shop.Added")
def added(state: Folded, e: Event) -> Folded:
    return Folded(ids=[*state.ids, e.id])


@orders.applies("shop.Boom")
def boom(state: Folded, e: Event) -> Folded:
    raise ValueError("this applier raises")


class Log:
    """The events partition both read, and a commit appending to it."""

    def __init__(self) -> None:
        self.values: list[bytes] = []
        self.keys: list[bytes] = []
        self.other = 1_000_000  # offsets of the records of the other topics

    async def commit(self, records: Sequence[OutRecord], offsets: object) -> list[int]:
        written = []
        for r in records:
            if r[0] == EVENTS:
                assert r[2] is not None and r[3] is not None
                self.append(r[2], r[3])
                written.append(len(self.values) - 1)
            else:
                self.other += 1
                written.append(self.other)
        return written

    def append(self, key: bytes, value: bytes) -> None:
        self.keys.append(key)
        self.values.append(value)

    def reader(self, size: int) -> Reader:
        records = zip(self.keys, self.values, strict=True)
        return Reader(
            [Record(EVENTS, 0, i, k, v, T0, ()) for i, (k, v) in enumerate(records)], size
        )


class Reader:
    """The log, in batches of `size` records."""

    def __init__(self, records: list[Record], size: int) -> None:
        self.records, self.size = records, size

    async def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        return 0, len(self.records)

    async def read(
        self, topic: str, partition: int, start: int
    ) -> AsyncGenerator[list[Record], None]:
        rest = [r for r in self.records if r.offset >= start]
        for i in range(0, len(rest), self.size):
            yield rest[i : i + self.size]


def processor(log: Log) -> tuple[CommandProcessor, MemoryAggregateStore]:
    store = MemoryAggregateStore()
    node = CommandProcessor(
        orders, 0, partitions=PARTITIONS, states=store, commit=log.commit, now=lambda: T0
    )
    return node, store


KINDS = ["shop.Added", "shop.Boom", "lax", AGGREGATE_DELETED, "wow.Bogus"]

own = st.tuples(st.just("own"), st.sampled_from([0, 1]), st.integers(1, 3))
theirs = st.tuples(
    st.just("theirs"),
    st.sampled_from([0, 1]),
    st.sampled_from(["w-0", "w-1", "w-2", None]),  # None: each event its own request
    st.integers(-2, 2),  # the version, from the aggregate's
    st.lists(st.sampled_from(KINDS), min_size=1, max_size=3),
    st.booleans(),  # one version for all, or one each
)


def their_event(
    n: int, i: int, ref: AggregateRef, request_id: str | None, kind: str, version: int
) -> bytes:
    event = EventEnvelope(
        id=f"t{n}/{i}",
        type="shop.Added" if kind == "lax" else kind,
        aggregate=ref,
        version=version,
        request_id=request_id,
        created_at=T0,
    )
    if kind != "lax":
        return encode(event)
    dumped = event.model_dump(mode="json")
    dumped["body"] = {"n": 2**63}  # an earlier version took it: a strict read does not
    return orjson.dumps(dumped)


async def follow(node: CommandProcessor, log: Log, start: int) -> None:
    """The log from `start` followed as the subscription follows it, in one batch."""
    batch = node.begin()
    for offset in range(start, len(log.values)):
        event, _ = decode_event(log.values[offset])
        if unknown_system_event(event.type, orders.appliers.keys()) is not None:
            continue  # refused (dead-lettered) before the follow
        try:
            node.follow(batch, event, offset)
        except Exception as exc:  # dead-lettered by the subscription
            assert not node_fault(exc)
    node.staged(batch)
    node.committed(batch, [])


async def live_and_restored(steps: list[tuple[Any, ...]], size: int) -> None:
    log = Log()
    live, live_store = processor(log)
    ids: set[tuple[str, str]] = set()
    for n, step in enumerate(steps):
        ref = REFS[step[1]]
        aid = state_key(ref)
        start = len(log.values)
        if step[0] == "own":
            cmd = CommandEnvelope(
                request_id=f"own-{n}",
                type="shop.Add",
                aggregate=ref,
                issued_at=T0,
                body={"k": step[2]},
                in_process=True,
            )
            await live.handle([], local=[cmd])
            ids.add((aid, cmd.request_id))
        else:
            _, _, request_id, delta, kinds, one_version = step
            stored = live._states.stored(aid)
            version = max(1, (stored.version if stored else 0) + delta)
            for i, kind in enumerate(kinds):
                at = version if one_version else version + i
                log.append(ref.id.encode(), their_event(n, i, ref, request_id, kind, at))
                ids.add((aid, request_id or f"event:t{n}/{i}"))
        await follow(live, log, start)
    fresh, fresh_store = processor(Log())
    await fresh.restore(log.reader(size))
    for ref in REFS:
        aid = state_key(ref)
        assert fresh_store.get(0, aid) == live_store.get(0, aid), aid
    for aid, rid in sorted(ids):
        assert fresh_store.seen(0, aid, rid) == live_store.seen(0, aid, rid), rid
        assert fresh_store.folded(0, aid, rid) == live_store.folded(0, aid, rid), rid


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(own, theirs), max_size=12), st.integers(1, 4))
def test_a_restore_folds_what_the_live_follow_folded(
    steps: list[tuple[Any, ...]], size: int
) -> None:
    asyncio.run(live_and_restored(steps, size))
