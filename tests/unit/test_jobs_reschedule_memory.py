"""A reschedule that lands while a slot is due, on a whole node (the in-memory log, a fake
clock): the slot runs once. The reschedule's command is decided in the cycle that the
slot's tick was handed to, before it (a cancel or reschedule must stop what it replaces):
the replaced row took the tick with it, and the slot was lost until a backfill ran it."""

from __future__ import annotations

from pathlib import Path

from fakes import MIN, T0, FakeClock, RunningNode, running, wait_until
from test_jobs_backfill_memory import (
    CONTEXT,
    JOB,
    PARTITIONS,
    REPORTS,
    SCHEDULE,
    SERVICE,
    _backfill,
    _send,
    _types,
)

from app.jobs import RESCHEDULED, TICKED, enable_command, reschedule_command
from app.kafka.memory import MemoryLog
from app.protocol.wire import SCHEDULE_SET, ResultCode


async def test_a_slot_due_when_a_reschedule_lands_runs_once(tmp_path: Path) -> None:
    log, clock = MemoryLog(), FakeClock(T0 - 30_000)
    async with running(
        RunningNode(log, tmp_path, "n", SERVICE, PARTITIONS, clock=clock), within=10
    ):
        await _send(log, [enable_command(CONTEXT, JOB, now=clock.now())])
        await wait_until(lambda: bool(_types(log, SCHEDULE.events, SCHEDULE_SET)))
        clock.set(T0)  # slot 0 runs live
        await wait_until(lambda: len(_types(log, REPORTS.events, "Ran")) == 1)
        (timer,) = {e.body["timer_id"] for e in _types(log, SCHEDULE.events, TICKED)}
        # Slot 1 falls due as the operator's reschedule arrives.
        clock.set(T0 + MIN + 5)
        await _send(log, [reschedule_command(CONTEXT, JOB, {"every": 2 * MIN}, now=clock.now())])
        await wait_until(lambda: bool(_types(log, SCHEDULE.events, RESCHEDULED)))
        await wait_until(
            lambda: len(_types(log, REPORTS.events, "Ran")) == 2,
            what=lambda: f"slot 1 never ran: {_types(log, SCHEDULE.events, TICKED)}",
        )
        ticked = [
            (e.body["timer_id"], e.body["slot"]) for e in _types(log, SCHEDULE.events, TICKED)
        ]
        assert ticked == [(timer, 0), (timer, 1)]
        # A backfill over both: slot 0 ran live (DUPLICATE), slot 1 ran by the reschedule,
        # under another request id than its tick's: not sent again.
        assert await _backfill(log, T0, T0 + MIN) == {f"{timer}#0": ResultCode.DUPLICATE}
        # The new timer ticks on from its own first slot (T0 + 2 min, every 2 min).
        clock.set(T0 + 2 * MIN)
        await wait_until(lambda: len(_types(log, REPORTS.events, "Ran")) == 3)
        runs = sorted(e.body["slot"] for e in _types(log, REPORTS.events, "Ran"))
        assert runs == [0, 1, 1], "slot 0 and 1 of the old rule, slot 1 of the new"
