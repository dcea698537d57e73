"""A timer book's once-timer whose send failed and PARKED is paused and resumed through the
book as its owner's own pause and resume do (`test_pause_parked_node`): a whole node on the
in-memory log, a fake clock.

Before, the book refused the pause (REJECTED, `RULE_ENDED`): its once rule's `at` had
passed, and the book, which keeps no row, cannot tell a FIRED row from a PARKED one. It
now appends the pause and the table, which can, holds a PARKED row (PAUSED, marked
`parked_when_paused`) and leaves a FIRED one as it is; the resume parks it again. A
trigger of a timer paused after its rule's end is still refused as ended: whether its
slot fired is the table's, and a trigger of a fired once-timer would send it again."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fakes import T0, FakeClock, RunningNode, running, wait_until
from pydantic import BaseModel

from app.clients.timer_book import (
    PAUSE_TIMER,
    RESUME_TIMER,
    RULE_ENDED,
    SET_TIMER,
    TRIGGER_TIMER,
    timer_book,
)
from app.errors import BadRecord
from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType, Command, Decision
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import CommandEnvelope, CommandResult, ResultCode, decode, encode
from app.service import Service
from app.timers.runner import RetryPolicy, TimerOptions
from tables import AggregateRef, Timer, TimerStatus
from tables.partitioner import partition_of

P = 2
BOOK = AggregateTopics("shop", "reminders")
OWNER = AggregateRef(context="shop", aggregate="reminders", id="o-1")
SENDS: list[str] = []
IDS = itertools.count()


class Order(BaseModel):
    pass


order = AggregateType("shop", "order", Order)


@order.command("RemindToPay")
def _remind(state: Order, cmd: Command, d: Decision) -> None:
    SENDS.append(cmd.body["note"])
    if cmd.body["fail"]:
        raise RuntimeError("the shop is closed")  # ERROR: a failed attempt
    d.emit("Reminded", {})


SERVICE = Service(aggregates=(timer_book("shop", "reminders"), order))
# One attempt: a failed send parks the timer at once.
OPTIONS = TimerOptions(retry=RetryPolicy(max_attempts=1))


@pytest.fixture(autouse=True)
def _reset() -> None:
    SENDS.clear()


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[tuple[MemoryLog, FakeClock]]:
    log, clock = MemoryLog(), FakeClock(T0)
    async with running(RunningNode(log, tmp_path, "n", SERVICE, P, clock=clock, timers=OPTIONS)):
        yield log, clock


def rows(log: MemoryLog) -> dict[str, Timer]:
    latest: dict[bytes, bytes | None] = {}
    for p in range(P):
        for r in log.records(BOOK.timers_changelog, p):
            assert r.key is not None
            latest[r.key] = r.value
    timers = [Timer.model_validate_json(v) for v in latest.values() if v is not None]
    return {t.key: t for t in timers}


def status(log: MemoryLog, key: str) -> TimerStatus | None:
    row = rows(log).get(key)
    return None if row is None else row.status


def result(log: MemoryLog, request_id: str) -> CommandResult | None:
    topic = ContextTopics("shop").results
    if topic not in log.topic_names():
        return None
    for p in range(log.partitions(topic)):
        for r in log.records(topic, p):
            with contextlib.suppress(BadRecord):
                if (found := decode(CommandResult, r.value)).request_id == request_id:
                    return found
    return None


async def book(log: MemoryLog, clock: FakeClock, type_: str, body: dict[str, Any]) -> CommandResult:
    """The book's answer to `type_` with `body`, sent as a client sends it."""
    cmd = CommandEnvelope(
        request_id=f"{type_}-{next(IDS)}",
        type=type_,
        aggregate=OWNER,
        body=body,
        issued_at=clock.now(),
    )
    p = partition_of(OWNER.id, P)
    await log.publisher().send(BOOK.commands, OWNER.id.encode(), encode(cmd), p)
    await wait_until(lambda: result(log, cmd.request_id) is not None)
    answer = result(log, cmd.request_id)
    assert answer is not None
    return answer


async def ended(log: MemoryLog, clock: FakeClock, key: str, *, fail: bool) -> Timer:
    """The book's once-timer `key`, due in a second, sent: PARKED when its send fails, else
    FIRED."""
    body = {
        "key": key,
        "rule": {"kind": "once", "at": clock.now() + 1_000},
        "target": {"context": "shop", "aggregate": "order", "id": "p-1"},
        "command": {"type": "RemindToPay", "body": {"note": key, "fail": fail}},
    }
    assert (await book(log, clock, SET_TIMER, body)).code is ResultCode.COMMITTED
    await wait_until(lambda: status(log, key) is TimerStatus.PENDING)
    clock.advance(1_000)
    done = TimerStatus.PARKED if fail else TimerStatus.FIRED
    await wait_until(lambda: status(log, key) is done)
    return rows(log)[key]


async def test_a_parked_once_timer_pauses_and_resumes_through_its_book(
    node: tuple[MemoryLog, FakeClock],
) -> None:
    log, clock = node
    parked = await ended(log, clock, "pay", fail=True)
    assert SENDS == ["pay"]

    paused = await book(log, clock, PAUSE_TIMER, {"key": "pay"})
    assert (paused.code, paused.refusal) == (ResultCode.COMMITTED, None), paused
    await wait_until(lambda: status(log, "pay") is TimerStatus.PAUSED)
    assert rows(log)["pay"].parked_when_paused
    again = await book(log, clock, PAUSE_TIMER, {"key": "pay"})
    assert again.code is ResultCode.UNCHANGED, again
    # Whether its slot fired is the table's: a trigger could send a fired one again.
    triggered = await book(log, clock, TRIGGER_TIMER, {"key": "pay"})
    assert (triggered.code, triggered.refusal) == (ResultCode.REJECTED, RULE_ENDED), triggered

    resumed = await book(log, clock, RESUME_TIMER, {"key": "pay"})
    assert resumed.code is ResultCode.COMMITTED, resumed
    await wait_until(lambda: status(log, "pay") is TimerStatus.PARKED)
    row = rows(log)["pay"]
    assert (row.slot, row.attempts, row.due_at) == (parked.slot, parked.attempts, parked.due_at)
    assert not row.parked_when_paused
    assert SENDS == ["pay"], "its pause, trigger or resume sent it"


async def test_a_fired_once_timers_pause_leaves_its_row_and_its_trigger_is_refused(
    node: tuple[MemoryLog, FakeClock],
) -> None:
    """The book cannot tell it from a parked one: it appends the pause, which the table
    passes over; its trigger stays refused, so its command is not sent again."""
    log, clock = node
    fired = await ended(log, clock, "done", fail=False)
    paused = await book(log, clock, PAUSE_TIMER, {"key": "done"})
    assert paused.code is ResultCode.COMMITTED, paused
    triggered = await book(log, clock, TRIGGER_TIMER, {"key": "done"})
    assert (triggered.code, triggered.refusal) == (ResultCode.REJECTED, RULE_ENDED), triggered
    assert rows(log)["done"] == fired
    assert SENDS == ["done"]
