"""A PARKED timer its owner pauses stays paused through an operator's retry, and its resume
parks it again: a whole node on the in-memory log, a fake clock.

Before, the pause was committed (a timer book answered COMMITTED) but the table paused
only a PENDING or FIRING row: the row stayed PARKED, so an operator's retry fired it and
it ran its rule on while its owner (and the book) held it paused, a second pause answered
UNCHANGED. Now the row is PAUSED, marked as parked (`Timer.parked_when_paused`): a retry
passes over it, its ledger entry no longer names it, and its resume parks it again (named
again), for the operator's retry, which fires it once."""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from fakes import T0, FakeClock, RunningNode, running, wait_until
from pydantic import BaseModel
from test_timer_ops_dedup import ORDERS, OWNER, P, rows, status

from app.errors import BadRecord
from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType, Command, Decision
from app.node import node_watches
from app.node.parked_names import keep_parked_named
from app.protocol.wire import CommandEnvelope, EventEnvelope, TimerAction, decode, encode
from app.service import Service
from app.timers.ledger_view import read_ledger
from app.timers.operator import new_op, op_records
from app.timers.runner import RetryPolicy, TimerOptions
from tables import CommandSpec, OnceRule, Timer, TimerStatus
from tables.partitioner import partition_of


class Order(BaseModel):
    pass


order = AggregateType("shop", "order", Order)
FAILING = [True]
NUDGES: list[str] = []
SENT = itertools.count()


@order.command("Start")
def _start(state: Order, cmd: Command, d: Decision) -> None:
    d.schedule(cmd.body["key"], OnceRule(at=cmd.body["at"]), CommandSpec(type="Nudge"))


@order.command("Pause")
def _pause(state: Order, cmd: Command, d: Decision) -> None:
    d.pause_schedule(cmd.body["key"])


@order.command("Resume")
def _resume(state: Order, cmd: Command, d: Decision) -> None:
    d.resume_schedule(cmd.body["key"])


@order.command("Nudge")
def _nudge(state: Order, cmd: Command, d: Decision) -> None:
    NUDGES.append(cmd.request_id)
    if FAILING[0]:
        raise RuntimeError("the shop is closed")  # ERROR: a failed attempt
    d.emit("Nudged", {})


SERVICE = Service(aggregates=(order,))
# One attempt: a failed send parks the timer at once.
OPTIONS = TimerOptions(retry=RetryPolicy(max_attempts=1))


@pytest.fixture(autouse=True)
def _reset() -> None:
    FAILING[0] = True
    NUDGES.clear()


def nudges(log: MemoryLog, key: str) -> int:
    """How many times the timer under `key` sent its command (any slot)."""
    timer_id = rows(log)[key].id
    return sum(1 for r in NUDGES if r.startswith(f"{timer_id}#"))


def events(log: MemoryLog, type_: str) -> list[EventEnvelope]:
    found = []
    for p in range(P):
        for r in log.records(ORDERS.events, p):
            with contextlib.suppress(BadRecord):
                if (e := decode(EventEnvelope, r.value)).type == type_:
                    found.append(e)
    return found


async def command(log: MemoryLog, type_: str, key: str, now: int, **body: int) -> None:
    cmd = CommandEnvelope(
        request_id=f"{type_}-{key}-{next(SENT)}",
        type=type_,
        aggregate=OWNER,
        body={"key": key, **body},
        issued_at=now,
    )
    p = partition_of(OWNER.id, P)
    await log.publisher().send(ORDERS.commands, OWNER.id.encode(), encode(cmd), p)


async def parked(log: MemoryLog, clock: FakeClock, key: str) -> None:
    """The timer `key` set, due now, fired, failed and PARKED."""
    await command(log, "Start", key, clock.now(), at=clock.now() + 1_000)
    await wait_until(lambda: status(log, key) is TimerStatus.PENDING)
    clock.advance(1_000)
    await wait_until(lambda: status(log, key) is TimerStatus.PARKED)


async def acted(log: MemoryLog, clock: FakeClock, action: str, key: str) -> Timer:
    """`key`'s owner pauses or resumes it: its row once the event is committed (the
    cycle that decides it writes the row in the same transaction)."""
    event = f"wow.Schedule{action}d"
    before = len(events(log, event))
    await command(log, action, key, clock.now())
    await wait_until(lambda: len(events(log, event)) == before + 1)
    return rows(log)[key]


async def retry(log: MemoryLog, clock: FakeClock, request_id: str) -> None:
    """As `tickwheel timers retry` writes it: once to every partition."""
    op = new_op(TimerAction.RETRY, OWNER, now=clock.now(), request_id=request_id)
    await log.publisher().send_many(op_records(ORDERS.timer_ops, op, P))


async def named(log: MemoryLog) -> set[str]:
    """The timers the ledger's entry of OWNER (their target) names."""
    return {n for e in await read_ledger(log, "shop") if e.target == OWNER for n in e.timers}


def names_are(
    log: MemoryLog, clock: FakeClock, expected: set[str]
) -> Callable[[], Awaitable[bool]]:
    """Whether the ledger names `expected`, the clock moved on by a poll interval each time
    asked: the partition's next round writes the ledger (`app.timers.unparked`)."""

    async def check() -> bool:
        clock.advance(OPTIONS.poll_interval_ms)
        return await named(log) == expected

    return check


@pytest.fixture
async def node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[MemoryLog, FakeClock]]:
    # The node's later check of a resolved entry's timers (`NAME_AFTER_S` after it, on the
    # loop's clock) would name a parked timer in the end: out of the test's way, so that
    # only the partition's own round can name it, however slow the machine.
    monkeypatch.setattr(
        node_watches, "keep_parked_named", functools.partial(keep_parked_named, after_s=3600.0)
    )
    log, clock = MemoryLog(), FakeClock(T0)
    async with running(RunningNode(log, tmp_path, "n", SERVICE, P, clock=clock, timers=OPTIONS)):
        yield log, clock


async def test_a_parked_timer_paused_is_not_retried_and_its_resume_parks_it_again(
    node: tuple[MemoryLog, FakeClock],
) -> None:
    log, clock = node
    await parked(log, clock, "remind")
    await parked(log, clock, "control")  # same target, not paused: the retry's witness
    assert (nudges(log, "remind"), nudges(log, "control")) == (1, 1)
    remind = rows(log)["remind"]
    both = {remind.request_id, rows(log)["control"].request_id}
    await wait_until(names_are(log, clock, both), what=lambda: "the parked timers unnamed")

    paused = await acted(log, clock, "Pause", "remind")
    assert paused.status is TimerStatus.PAUSED, "the pause was committed, the row not paused"
    assert paused.parked_when_paused
    await wait_until(
        names_are(log, clock, {rows(log)["control"].request_id}),
        what=lambda: "the paused timer is still named in the ledger",
    )

    await retry(log, clock, "retry-1")
    # The retry was carried out: the control timer sent again (failed, parked again).
    await wait_until(
        lambda: nudges(log, "control") == 2 and status(log, "control") is TimerStatus.PARKED
    )
    assert nudges(log, "remind") == 1, "the retry fired the paused timer"
    assert rows(log)["remind"] == paused

    resumed = await acted(log, clock, "Resume", "remind")
    assert resumed.status is TimerStatus.PARKED, resumed
    assert (resumed.slot, resumed.attempts, resumed.due_at) == (
        remind.slot,
        remind.attempts,
        remind.due_at,
    )
    assert not resumed.parked_when_paused
    assert nudges(log, "remind") == 1, "its resume sent it"
    # Named again by the partition's next round (the node's later check is held off).
    await wait_until(
        names_are(log, clock, both), what=lambda: "the timer parked again is not named again"
    )
    assert status(log, "remind") is TimerStatus.PARKED and nudges(log, "remind") == 1

    FAILING[0] = False
    await retry(log, clock, "retry-2")
    await wait_until(
        lambda: (
            status(log, "remind") is TimerStatus.FIRED
            and status(log, "control") is TimerStatus.FIRED
        )
    )
    assert nudges(log, "remind") == 2, "the operator's retry fires it once"
    assert nudges(log, "control") == 3
