"""A `wow.ScheduleSet` written again under another event id at the version it had (another
service's producer that retries by writing the event anew) after its timer sent its
command: the timer table passes it over (`tables.writes.put_row`), so the timer neither
fires again nor is replaced. Before, a set at the held version with a new id was written,
which revived a fired timer (its command applied twice) and took a job instance's tick
timer from under it (the instance's state names the first id: every later tick ran
nothing, for good). A rebuild, which replays both sets before anything fires, keeps the
first timer as well (`tables.writes.rewritten`): it fires under the request id the target
took, answered DUPLICATE."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fakes import MIN, T0, FakeClock, RunningNode, running, wait_until
from test_jobs_backfill_memory import (
    CONTEXT,
    JOB,
    PARTITIONS,
    REPORTS,
    SCHEDULE,
    SERVICE,
    TARGET,
    _send,
    _types,
)

from app.jobs import enable_command
from app.kafka.memory import MemoryLog
from app.ops.rebuild import rebuild
from app.protocol.wire import SCHEDULE_SET, EventEnvelope, ScheduleSet, encode
from tables import CommandSpec, OnceRule, Outcome, Timer
from tables.partitioner import partition_of


async def _write(log: MemoryLog, topic: str, event: EventEnvelope) -> None:
    p = partition_of(event.aggregate.id, PARTITIONS)
    await log.publisher().send(topic, event.aggregate.id.encode(), encode(event), p)


def _set(event_id: str, key: str, slot: int) -> EventEnvelope:
    body = ScheduleSet(
        key=key, rule=OnceRule(at=T0 - 1), command=CommandSpec(type="Run", body={"slot": slot})
    )
    return EventEnvelope(
        id=event_id,
        type=SCHEDULE_SET,
        aggregate=TARGET,
        version=1,
        created_at=T0 - 10,
        body=body.model_dump(mode="json"),
    )


def _slots_ran(log: MemoryLog) -> list[int]:
    return sorted(e.body["slot"] for e in _types(log, REPORTS.events, "Ran"))


async def test_a_fired_timer_set_again_under_a_new_id_at_its_version_fires_no_more(
    tmp_path: Path,
) -> None:
    log, clock = MemoryLog(), FakeClock(T0)
    await _fired_then_set_again(log, tmp_path, clock)
    assert _slots_ran(log) == [7, 8]


async def _fired_then_set_again(log: MemoryLog, tmp_path: Path, clock: FakeClock) -> None:
    """Slot 7 set by `evt-1` and fired on a node, then set again under `evt-1-retry` at its
    version; then a timer after it, due as well, in the same partition, fired: once it has,
    so had the retried one, had it been written."""
    async with running(
        RunningNode(log, tmp_path, "n", SERVICE, PARTITIONS, clock=clock), within=10
    ):
        await _write(log, REPORTS.events, _set("evt-1", "remind", 7))
        await wait_until(lambda: _slots_ran(log) == [7])
        await _write(log, REPORTS.events, _set("evt-1-retry", "remind", 7))
        await _write(log, REPORTS.events, _set("evt-2", "marker", 8))
        await wait_until(lambda: 8 in _slots_ran(log))


async def test_a_rebuild_fires_a_retried_set_under_the_request_id_the_target_took(
    tmp_path: Path,
) -> None:
    """Before, the rebuild's replay wrote the retry over the first set's PENDING timer,
    which then sent `evt-1-retry#0`: the target ran slot 7 again."""
    log, clock = MemoryLog(), FakeClock(T0)
    await _fired_then_set_again(log, tmp_path, clock)
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
                rows[key] = await store.find(TARGET, key)
            return all(r is not None and r.outcome is not None for r in rows.values())

        await wait_until(both_fired)
        remind = rows["remind"]
        assert remind is not None
        assert (remind.id, remind.outcome) == ("evt-1", Outcome.DUPLICATE)
        assert _slots_ran(log) == [7, 8]


async def test_a_job_instance_keeps_running_after_its_tick_timer_is_set_again_under_a_new_id(
    tmp_path: Path,
) -> None:
    log, clock = MemoryLog(), FakeClock(T0 - 30_000)
    async with running(
        RunningNode(log, tmp_path, "n", SERVICE, PARTITIONS, clock=clock), within=10
    ):
        await _send(log, [enable_command(CONTEXT, JOB, now=clock.now())])
        await wait_until(lambda: bool(_types(log, SCHEDULE.events, SCHEDULE_SET)))
        clock.set(T0)
        await wait_until(lambda: len(_types(log, REPORTS.events, "Ran")) == 1)
        (tick,) = _types(log, SCHEDULE.events, SCHEDULE_SET)
        await _write(log, SCHEDULE.events, tick.model_copy(update={"id": tick.id + "-again"}))
        for n in range(1, 4):
            clock.set(T0 + n * MIN + 5)
            await wait_until(_ran_times(log, 1 + n))


def _ran_times(log: MemoryLog, n: int) -> Callable[[], bool]:
    return lambda: len(_types(log, REPORTS.events, "Ran")) == n
