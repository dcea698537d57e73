"""A set read back under limits lowered since, after its timer fired or parked: the row
its command stored is its doing whatever became of it since.

A command sets its key twice alike (`LaterTwice`): the table keeps the first set's timer
(`tables.writes.rewritten`). The commands topic is lowered, the timer fires, its command
is refused as too large and the timer parks; the node stops before the read-back of the
sets committed, and the next node reads them back: the second set (refused, the held row
not its id) found the row alike, but no longer PENDING, so it was taken for another's
doing: dead-lettered, and its cancel cancelled the parked timer (an operator's retry then
had nothing to retry). `tables.writes.alike` asks what the set wrote, not the row's
status since."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import T0, FakeClock, RunningNode, running, wait_until
from test_node_topic_limits import (
    ONCE,
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
from tables import TimerStatus


@pytest.mark.parametrize("command", ["Later", "LaterTwice"])
async def test_a_set_read_back_after_its_timer_parked_leaves_it_parked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    log, clock = MemoryLog(), FakeClock(T0)
    refusing(log, monkeypatch)
    owner, _ = owners(2)
    at = T0 + 60_000
    async with running(RunningNode(log, tmp_path, "a", SERVICE, P, clock=clock, timers=ONCE)):
        rid = await send(log, owner, command, size=100_000, at=at)
        assert (await answered(log, rid))[rid].code == "COMMITTED"
        await wait_until(lambda: (owner, "k") in timer_keys(log, 0))
    log._max_bytes[T.commands] = 64 * 1024  # an operator lowers it
    async with running(RunningNode(log, tmp_path, "b", SERVICE, P, clock=clock, timers=ONCE)):
        clock.set(at)
        await wait_until(
            lambda: [t.status for t in timers(log, 0)] == [TimerStatus.PARKED], within=15
        )
    # Stopped between the park and the read-back's commit.
    set_at, *_ = offsets = [r.offset for r in log.records(T.events, 0)]
    log.commit_group_offsets("g", {(T.events, 0): set_at})
    async with running(RunningNode(log, tmp_path, "c", SERVICE, P, clock=clock, timers=ONCE)):
        await wait_until(lambda: (log.committed("g", T.events, 0) or 0) > offsets[-1])
        assert letters(log) == []
        assert [t.status for t in timers(log, 0)] == [TimerStatus.PARKED]
