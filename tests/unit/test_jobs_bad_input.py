"""A job instance refuses what no runner of its sends: another writer's malformed schedule
events, a tick of a slot its rule has not reached; and a sharded instance's id is checked
without listing every partition's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
import pytest

from app.commands.processor import CommandProcessor, state_key
from app.jobs import (
    ENABLED,
    TICKED,
    Job,
    JobRun,
    JobScope,
    disable_command,
    enable_command,
    ref_of,
    schedule_aggregate,
)
from app.kafka import OutRecord, Record
from app.model.decide import fold
from app.protocol.wire import CommandEnvelope, EventEnvelope, ResultCode, encode
from tables import IntervalRule
from tables.aggregate_store import MemoryAggregateStore
from tables.partitioner import partition_of

T0 = 1_800_000_000_000
MIN = 60_000
PARTITIONS = 4
runs: list[int] = []


def handler(run: JobRun) -> None:
    runs.append(run.slot)


JOB = Job("nightly", JobScope.SYSTEM, IntervalRule(start=0, every=MIN), handler)
REF = ref_of("ops", JOB)
P = partition_of(REF.id, PARTITIONS)
AGG = schedule_aggregate("ops", [JOB], PARTITIONS)


class Log:
    def __init__(self) -> None:
        self.commits: list[list[OutRecord]] = []
        self.n = 0

    async def __call__(
        self, records: Sequence[OutRecord], offsets: dict[tuple[str, int], int]
    ) -> list[int]:
        self.commits.append(list(records))
        first, self.n = self.n, self.n + len(records)
        return list(range(first, self.n))

    def results(self) -> list[dict[str, Any]]:
        return [orjson.loads(r[3] or b"") for r in self.commits[-1] if r[0] == "ops.results"]


def record(cmd: CommandEnvelope, offset: int) -> Record:
    return Record("ops.schedule.commands", P, offset, REF.id.encode(), encode(cmd), T0)


async def enabled(now: int = T0) -> tuple[CommandProcessor, Log, str]:
    """An instance of JOB enabled at `now`; its processor, log and tick timer's id."""
    log = Log()
    proc = CommandProcessor(
        AGG, P, partitions=PARTITIONS, states=MemoryAggregateStore(), commit=log, now=lambda: now
    )
    await proc.handle([record(enable_command("ops", JOB, now=now, request_id="en-1"), 0)])
    stored = proc._states.stored(state_key(REF))
    assert stored is not None
    return proc, log, stored.state["timer_id"]


@pytest.mark.parametrize(
    ("type_", "body"),
    [(ENABLED, {"job": 5}), (ENABLED, {"job": ["nightly"]}), (TICKED, {"slot": "x"})],
)
async def test_another_writers_malformed_schedule_event_is_not_folded(
    type_: str, body: dict[str, Any]
) -> None:
    proc, log, _ = await enabled()
    before = proc._states.stored(state_key(REF))
    event = EventEnvelope(
        id="foreign/0", type=type_, aggregate=REF, version=9, created_at=T0, body=body
    )
    batch = proc.begin()
    # Raised: the node's follower dead-letters it (stage `follow`), a restore passes it over.
    with pytest.raises(ValueError, match="ScheduleState"):
        proc.follow(batch, event, 5)
    proc.staged(batch)
    proc.committed(batch, [])
    assert proc._states.stored(state_key(REF)) == before
    with pytest.raises(ValueError, match="ScheduleState"):
        fold(AGG, before, [event])

    # The instance goes on.
    await proc.handle([record(disable_command("ops", JOB, now=T0, request_id="dis-1"), 6)])
    assert [r["code"] for r in log.results()] == [ResultCode.COMMITTED]
