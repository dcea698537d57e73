"""Takes of a partition holding rows its `timers` changelog takes no more (lowered since
they were stored; `app.node.row_limit`), in the ways a review found them to stall it or
leave a trace: a garbage record under such a row's key (the take's rewrite of the row it
held), two such rows refused in turn (a take's deletes undone by a failure before its
commit), and a PARKED one deleted at the take (its name left in the failure ledger)."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
from fakes import T0, FakeClock, RunningNode, running, wait_until
from pydantic import BaseModel
from test_node_topic_limits import (
    SERVICE,
    P,
    T,
    answered,
    letters,
    owners,
    refusing,
    send,
    timer_keys,
    timers,
)

from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType, Command, Decision
from app.protocol.dead_letters import DeadLetter
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import CommandEnvelope, encode
from app.service import Service
from app.timers.ledger import LedgerView
from app.timers.runner import RetryPolicy, TimerOptions
from tables import AggregateRef, CommandSpec, OnceRule, Timer, TimerStatus
from tables.partitioner import partition_of

LOWERED = 16 * 1024


async def _stored(log: MemoryLog, tmp_path: Path, clock: FakeClock, *ids: str) -> None:
    """A 40 KB timer of each owner of `ids`, stored and its set read back."""
    async with running(RunningNode(log, tmp_path, "a", SERVICE, P, clock=clock)):
        for owner in ids:
            rid = await send(log, owner, "Later", size=40_000, at=T0 + 3_600_000)
            assert (await answered(log, rid))[rid].code == "COMMITTED"
        await wait_until(lambda: {(o, "k") for o in ids} <= timer_keys(log, 0))
        await wait_until(lambda: (log.committed("g", T.events, 0) or 0) >= len(ids))


async def test_a_garbage_record_under_a_row_over_the_limit_does_not_stall_the_take(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The take rewrote the row a garbage record's key held (so no later restore meets
    the garbage) straight into its transaction: refused by the broker at every take."""
    log, clock = MemoryLog(), FakeClock(T0)
    refused = refusing(log, monkeypatch)
    big_owner, small_owner = owners(2)
    await _stored(log, tmp_path, clock, big_owner)
    [row] = [r for r in log.records(T.timers_changelog, 0) if r.value is not None]
    log._append([(T.timers_changelog, 0, row.key, b"not a timer row")], None)
    log._max_bytes[T.timers_changelog] = LOWERED  # an operator lowers it
    async with running(RunningNode(log, tmp_path, "b", SERVICE, P, clock=clock)):
        small = await send(log, small_owner, "Grow", size=10)
        assert (await answered(log, small))[small].code == "COMMITTED"
        await wait_until(lambda: len(letters(log)) == 2)  # the garbage's and the row's
        assert sorted(letter.context.stage for letter in letters(log)) == ["restore"] * 2
        assert (big_owner, "k") not in timer_keys(log, 0)
        assert refused == []


@pytest.mark.parametrize("slow", [False, True])
async def test_two_rows_over_the_limit_refused_in_turn_are_both_lettered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slow: bool
) -> None:
    """Both cancelled in one batch: the first take deletes one, its first cycle is refused
    the other before the deletion commits (slow: each commit 300 ms). The take forgot the
    first before its commit, which the failure undid: the two took turns for good."""
    log, clock = MemoryLog(), FakeClock(T0)
    refused = refusing(log, monkeypatch)
    one, two = owners(2)
    await _stored(log, tmp_path, clock, one, two)
    log._max_bytes[T.timers_changelog] = LOWERED
    forgets = [await send(log, one, "Forget"), await send(log, two, "Forget")]
    if slow:

        async def slowly(_: str) -> None:
            await asyncio.sleep(0.3)

        log.before_commit = slowly
    node = RunningNode(log, tmp_path, "b", SERVICE, P, clock=clock)
    async with running(node):
        await wait_until(lambda: len(letters(log)) == 2, within=30)
        await answered(log, *forgets)
        assert [t.status for t in timers(log, 0)] == [TimerStatus.CANCELLED] * 2
        assert refused == []


FAT = AggregateTopics("fat", "order")
FAT_CONTEXT = ContextTopics("fat")
FAT_OWNER = AggregateRef(context="fat", aggregate="order", id="o-1")


class _Order(BaseModel):
    pass


order = AggregateType("fat", "order", _Order)


@order.command("Schedule")
def _schedule(state: _Order, cmd: Command, d: Decision) -> None:
    command = CommandSpec(type="Ship", body={"pad": "y" * int(cmd.body["size"])})
    d.schedule(cmd.body["key"], OnceRule(at=int(cmd.body["at"])), command)


@order.command("Cancel")
def _cancel(state: _Order, cmd: Command, d: Decision) -> None:
    d.cancel_schedule(cmd.body["key"])


@order.command("Ship")
def _ship(state: _Order, cmd: Command, d: Decision) -> None:
    raise ValueError("out of stock")


ORDERS = Service(aggregates=(order,))
PARK_AT_ONCE = TimerOptions(
    retry=RetryPolicy(initial_backoff_ms=10, max_backoff_ms=10, max_attempts=1)
)


def _rows(log: MemoryLog) -> list[Timer]:
    latest: dict[bytes | None, bytes | None] = {}
    for p in range(P):
        for r in log.records(FAT.timers_changelog, p):
            latest[r.key] = r.value
    return [Timer.model_validate_json(v) for v in latest.values() if v is not None]


def _named(log: MemoryLog) -> list[tuple[str, ...]]:
    view = LedgerView()
    for p in range(log.partitions(FAT_CONTEXT.ledger)):
        for record in log.records(FAT_CONTEXT.ledger, p):
            view.apply_record(record)
    return [e.timers for e in view.entries()]


def _parked(log: MemoryLog) -> set[str]:
    return {t.key for t in _rows(log) if t.status is TimerStatus.PARKED}


async def _order(log: MemoryLog, type_: str, **body: object) -> None:
    cmd = CommandEnvelope(
        request_id=uuid.uuid4().hex,
        type=type_,
        aggregate=FAT_OWNER,
        body=body,
        issued_at=int(time.time() * 1000),
    )
    partition = partition_of(FAT_OWNER.id, P)
    await log.publisher().send(FAT.commands, FAT_OWNER.id.encode(), encode(cmd), partition)


async def test_a_parked_row_deleted_at_the_take_leaves_no_name_in_the_ledger(
    tmp_path: Path,
) -> None:
    """Its cancel's row refused, the PARKED row is deleted at the take, before the
    partition fires: the write's note for the ledger was dropped (no firing to take it),
    and the ledger named the deleted timer for good."""
    log, now = MemoryLog(), int(time.time() * 1000)
    async with running(RunningNode(log, tmp_path, "a", ORDERS, P, timers=PARK_AT_ONCE)):
        await _order(log, "Schedule", key="a", size=40_000, at=now)
        await _order(log, "Schedule", key="b", size=10, at=now)
        await wait_until(lambda: _parked(log) == {"a", "b"}, within=15)
        await wait_until(lambda: [len(n) for n in _named(log)] == [2], within=15)
    [b] = [t for t in _rows(log) if t.key == "b"]
    log._max_bytes[FAT.timers_changelog] = LOWERED
    async with running(RunningNode(log, tmp_path, "b", ORDERS, P, timers=PARK_AT_ONCE)):
        await _order(log, "Cancel", key="a")
        dead = FAT_CONTEXT.dead_letters
        await wait_until(lambda: len(log.records(dead, 0)) == 1, within=15)
        [letter] = [DeadLetter.read(r.key, r.value, r.headers) for r in log.records(dead, 0)]
        assert letter.topic == FAT.timers_changelog
        await wait_until(lambda: _parked(log) == {"b"}, within=15)
        await wait_until(lambda: _named(log) == [(b.request_id,)], within=10)
