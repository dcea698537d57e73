"""A command that re-schedules a key ([`wow.ScheduleCancelled`, `wow.ScheduleSet`] at one
version) appended twice to its aggregate's log (another service's producer retrying the
batch without idempotence: the same events, the same ids): the timer the command set fires
once, live and on a node whose table is rebuilt from the log. Before, the cancel read
again cancelled the set's timer and the set read again did not write it back: it never
fired (`tables.writes.cancel_row`)."""

from __future__ import annotations

from pathlib import Path

from fakes import MIN, T0, FakeClock, RunningNode, running, wait_until
from test_jobs_backfill_memory import CONTEXT, PARTITIONS, REPORTS, SERVICE, TARGET, _types

from app.kafka.memory import MemoryLog
from app.ops.rebuild import rebuild
from app.protocol.wire import (
    SCHEDULE_CANCELLED,
    SCHEDULE_SET,
    EventEnvelope,
    ScheduleCancelled,
    ScheduleSet,
    encode,
)
from tables import AggregateRef, CommandSpec, OnceRule, Outcome, Timer, TimerStatus
from tables.partitioner import partition_of

OWNER = AggregateRef(context=CONTEXT, aggregate="report", id="r-owner")
"""The timers' owner: its log holds these events alone (their target is `TARGET`)."""


def _event(event_id: str, version: int, type_: str, body: dict[str, object]) -> EventEnvelope:
    return EventEnvelope(
        id=event_id, type=type_, aggregate=OWNER, version=version, created_at=T0 - 10, body=body
    )


def _set(event_id: str, version: int, key: str, slot: int, at: int) -> EventEnvelope:
    command = CommandSpec(type="Run", body={"slot": slot})
    body = ScheduleSet(key=key, rule=OnceRule(at=at), target=TARGET, command=command)
    return _event(event_id, version, SCHEDULE_SET, body.model_dump(mode="json"))


def _cancel(event_id: str, version: int, key: str) -> EventEnvelope:
    body = ScheduleCancelled(key=key).model_dump(mode="json")
    return _event(event_id, version, SCHEDULE_CANCELLED, body)


RESCHEDULE = [_cancel("evt-2-cancel", 2, "remind"), _set("evt-2-set", 2, "remind", 7, T0 - 1)]
"""Version 2's command: the timer set at version 1 (slot 6, due in an hour) cancelled,
and one due now (slot 7) set in its place."""
LOG = [
    _set("evt-1", 1, "remind", 6, T0 + 60 * MIN),
    *RESCHEDULE,
    *RESCHEDULE,  # the producer's retry
    _set("evt-3", 3, "marker", 8, T0 - 1),  # after it in the partition: once it fired, so had 7
]


def _slots_ran(log: MemoryLog) -> list[int]:
    return sorted(e.body["slot"] for e in _types(log, REPORTS.events, "Ran"))


async def test_a_reschedule_appended_twice_fires_the_timer_it_set_once(tmp_path: Path) -> None:
    log, clock = MemoryLog(), FakeClock(T0)
    publisher = log.publisher()
    p = partition_of(OWNER.id, PARTITIONS)
    async with running(
        RunningNode(log, tmp_path, "n", SERVICE, PARTITIONS, clock=clock), within=10
    ):
        for event in LOG:
            await publisher.send(REPORTS.events, OWNER.id.encode(), encode(event), p)
        await wait_until(lambda: 8 in _slots_ran(log))
    assert _slots_ran(log) == [7, 8]

    await rebuild(log, "g", [REPORTS])
    # Another data directory: the timer table is built from the replay alone.
    async with running(
        RunningNode(log, tmp_path, "rebuilt", SERVICE, PARTITIONS, clock=clock), within=10
    ) as node:
        store = node.node.types[REPORTS.type_name].store
        rows: dict[str, Timer | None] = {}

        async def both_fired() -> bool:
            for key in ("remind", "marker"):
                rows[key] = await store.find(OWNER, key)
            return all(r is not None and r.outcome is not None for r in rows.values())

        await wait_until(both_fired)
        remind = rows["remind"]
        assert remind is not None
        # Sent again under the request id the target took: answered DUPLICATE.
        assert (remind.id, remind.status, remind.outcome) == (
            "evt-2-set",
            TimerStatus.FIRED,
            Outcome.DUPLICATE,
        )
        assert _slots_ran(log) == [7, 8]
