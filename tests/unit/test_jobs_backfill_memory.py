"""A backfill over slots a node ran live applies each slot once (issue 22): a whole node on
the in-memory log with a fake clock runs a job's ticks, then the backfill's commands, made
from the instance's log as `tickwheel jobs backfill` makes them, go through the same log."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fakes import MIN, T0, FakeClock, RunningNode, running, wait_until
from pydantic import BaseModel

from app.errors import BadRecord
from app.jobs import (
    BACKFILLED,
    TICKED,
    Job,
    JobRun,
    JobScope,
    backfill_command,
    backfill_slots,
    enable_command,
    ref_of,
    tick_timers,
    trigger_command,
)
from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType, Command, Decision, Event
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import (
    CommandEnvelope,
    CommandResult,
    EventEnvelope,
    ResultCode,
    decode,
    encode,
)
from app.service import Service
from tables import AggregateRef, IntervalRule
from tables.partitioner import partition_of

PARTITIONS = 2
CONTEXT = "mem"
REPORTS = AggregateTopics(CONTEXT, "report")
SCHEDULE = AggregateTopics(CONTEXT, "schedule")
TARGET = AggregateRef(context=CONTEXT, aggregate="report", id="r-1")


class Report(BaseModel):
    runs: int = 0


report = AggregateType(CONTEXT, "report", Report)


@report.command("Run")
def _run(state: Report, cmd: Command, d: Decision) -> None:
    d.emit("Ran", {"slot": cmd.body["slot"]})


@report.applies("Ran")
def _ran(state: Report, e: Event) -> Report:
    return state.model_copy(update={"runs": state.runs + 1})


def _handler(run: JobRun) -> None:
    run.send(TARGET, "Run", {"slot": run.slot})


JOB = Job("hourly", JobScope.SYSTEM, IntervalRule(start=T0, every=MIN), _handler)
SERVICE = Service(aggregates=(report,), jobs={CONTEXT: (JOB,)})
INSTANCE = ref_of(CONTEXT, JOB)


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[tuple[MemoryLog, FakeClock]]:
    log, clock = MemoryLog(), FakeClock(T0 - 30_000)
    async with running(
        RunningNode(log, tmp_path, "n", SERVICE, PARTITIONS, clock=clock), within=10
    ):
        yield log, clock


def _events(log: MemoryLog, topic: str) -> list[EventEnvelope]:
    out = []
    for p in range(PARTITIONS):
        for r in log.records(topic, p):
            with contextlib.suppress(BadRecord):
                out.append(decode(EventEnvelope, r.value))
    return out


def _types(log: MemoryLog, topic: str, type_: str) -> list[EventEnvelope]:
    return [e for e in _events(log, topic) if e.type == type_]


def _results(log: MemoryLog, after: dict[int, int] | None = None) -> list[CommandResult]:
    """The results written after `after` (partition -> records seen)."""
    topic = ContextTopics(CONTEXT).results
    return [
        decode(CommandResult, r.value)
        for p in range(PARTITIONS)
        for r in log.records(topic, p)[(after or {}).get(p, 0) :]
    ]


async def _send(log: MemoryLog, commands: list[CommandEnvelope]) -> None:
    publisher = log.publisher()
    for c in commands:
        p = partition_of(c.aggregate.id, PARTITIONS)
        await publisher.send(SCHEDULE.commands, c.aggregate.id.encode(), encode(c), p)


async def _backfill(log: MemoryLog, start: int, end: int) -> dict[str, ResultCode]:
    """What `tickwheel jobs backfill` sends for the range, and the codes it gets."""
    mine = [e for e in _events(log, SCHEDULE.events) if e.aggregate == INSTANCE]
    commands = [
        backfill_command(INSTANCE, s) for s in backfill_slots(tick_timers(mine), start, end)
    ]
    topic = ContextTopics(CONTEXT).results
    seen = {p: len(log.records(topic, p)) for p in range(PARTITIONS)}
    await _send(log, commands)
    ids = {c.request_id for c in commands}

    def new() -> dict[str, ResultCode]:
        return {r.request_id: r.code for r in _results(log, seen) if r.request_id in ids}

    await wait_until(lambda: len(new()) == len(ids))
    return dict(sorted(new().items()))


async def test_a_backfill_over_live_slots_applies_each_slot_once(
    node: tuple[MemoryLog, FakeClock],
) -> None:
    log, clock = node
    await _send(log, [enable_command(CONTEXT, JOB, now=clock.now())])
    await wait_until(lambda: bool(_types(log, SCHEDULE.events, "wow.ScheduleSet")))
    clock.set(T0)  # slot 0 runs live
    await wait_until(lambda: len(_types(log, SCHEDULE.events, TICKED)) == 1)
    clock.set(T0 + 3 * MIN + 5)  # the node catches up: slot 3 runs, 1 and 2 coalesced away
    await wait_until(lambda: len(_types(log, SCHEDULE.events, TICKED)) == 2)
    ticked = [e.body["slot"] for e in _types(log, SCHEDULE.events, TICKED)]
    assert ticked == [0, 3]

    codes = await _backfill(log, T0, T0 + 3 * MIN)
    (timer,) = {e.body["timer_id"] for e in _types(log, SCHEDULE.events, TICKED)}
    assert codes == {
        f"{timer}#0": ResultCode.DUPLICATE,
        f"{timer}#1": ResultCode.COMMITTED,
        f"{timer}#2": ResultCode.COMMITTED,
        f"{timer}#3": ResultCode.DUPLICATE,
    }
    await wait_until(lambda: len(_types(log, REPORTS.events, "Ran")) == 4)
    # the same backfill again: every slot has run
    again = await _backfill(log, T0, T0 + 3 * MIN)
    assert set(again.values()) == {ResultCode.DUPLICATE}

    # and a trigger, sent twice, runs once more without touching the schedule
    trigger = trigger_command(CONTEXT, JOB, request_id="by-hand", now=clock.now())
    await _send(log, [trigger, trigger])
    await wait_until(lambda: len(_types(log, SCHEDULE.events, "wow.schedule.Triggered")) == 1)
    await wait_until(lambda: len(_types(log, REPORTS.events, "Ran")) == 5)
    clock.set(T0 + 4 * MIN)  # the live schedule goes on at its next slot
    await wait_until(lambda: len(_types(log, SCHEDULE.events, TICKED)) == 3)
    await wait_until(lambda: len(_types(log, REPORTS.events, "Ran")) == 6)

    runs = sorted(e.body["slot"] for e in _types(log, REPORTS.events, "Ran"))
    assert runs == [-1, 0, 1, 2, 3, 4], "each slot once, and the triggered run"
    assert len(_types(log, SCHEDULE.events, BACKFILLED)) == 2


DAY = 24 * 60 * MIN
WINDOW = 2 * DAY


async def test_a_backfill_decided_after_its_slot_left_the_request_id_window_is_refused(
    tmp_path: Path,
) -> None:
    """A backfill's slot must still be in the node's de-duplication window when the node
    decides it, not only when it was sent: a command queued long enough (the CLI and the
    web edge check at sending time only) reached a node that had forgotten the live run's
    request id, and ran the slot a second time."""
    log, clock = MemoryLog(), FakeClock(T0 - 30_000)
    node = RunningNode(
        log, tmp_path, "n", SERVICE, PARTITIONS, clock=clock, request_id_window_ms=WINDOW
    )
    async with running(node, within=10):
        await _send(log, [enable_command(CONTEXT, JOB, now=clock.now())])
        await wait_until(lambda: bool(_types(log, SCHEDULE.events, "wow.ScheduleSet")))
        clock.set(T0)  # slot 0 runs live
        await wait_until(lambda: len(_types(log, REPORTS.events, "Ran")) == 1)
        # The window passes: the next commit (the catch-up tick) forgets slot 0's id.
        clock.set(T0 + WINDOW + 5 * MIN + 5)
        await wait_until(lambda: len(_types(log, REPORTS.events, "Ran")) == 2)
        mine = [e for e in _events(log, SCHEDULE.events) if e.aggregate == INSTANCE]
        (slot0,) = backfill_slots(tick_timers(mine), T0, T0)
        # Sent when it was still in the window (as the CLI checked it), decided now.
        command = backfill_command(INSTANCE, slot0, now=T0 + 10 * MIN)
        topic = ContextTopics(CONTEXT).results
        seen = {p: len(log.records(topic, p)) for p in range(PARTITIONS)}
        await _send(log, [command])

        def answered() -> list[CommandResult]:
            return [r for r in _results(log, seen) if r.request_id == command.request_id]

        await wait_until(lambda: bool(answered()))
        (result,) = answered()
        assert result.code is ResultCode.SCHEDULE_JOB_INVALID, result
        assert "de-duplication window" in result.message
        assert sorted(e.body["slot"] for e in _types(log, REPORTS.events, "Ran"))[0] == 0
        assert len([e for e in _types(log, REPORTS.events, "Ran") if e.body["slot"] == 0]) == 1
        assert not _types(log, SCHEDULE.events, BACKFILLED)
