"""What the jobs' log reads cost the node (`app.ops.job_log`, the `/jobs` routes): a
backfill decodes only its instances' own events and reads each schedule-log partition once
for all its instances (a `?state=true` list's fold: `test_job_state_folds`); and
`send_and_wait` waits no longer than it was told, whatever its reader does."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from fakes import MIN, T0, FakeClock, WebNode, wait_until, web_node
from pydantic import BaseModel

import app.ops.job_api
import app.ops.job_log
import app.ops.job_routes
from app.jobs import TICKED, Job, JobRun, JobScope, trigger_command
from app.jobs.backfill import backfill_slots
from app.kafka.memory import MemoryLog
from app.kafka.records import Record
from app.model.aggregate import AggregateType, Command, Decision, Event
from app.ops.job_log import InstanceEvents, read_instance_events, send_and_wait
from app.protocol.limits import InputLimits
from app.protocol.topics import AggregateTopics
from app.protocol.wire import (
    CommandEnvelope,
    CommandResult,
    EventEnvelope,
    ResultCode,
    decode,
    decode_event,
    encode,
)
from app.service import Service
from tables import AggregateRef, IntervalRule
from tables.partitioner import partition_of

P = 2
LIMITS = InputLimits()
CONTEXT = "ops"
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


PER_TENANT = Job("per-tenant", JobScope.TENANT, IntervalRule(start=T0, every=MIN), _handler)
SERVICE = Service(aggregates=(report,), jobs={CONTEXT: (PER_TENANT,)})


def _instance(id_: str, tenant: str = "default") -> AggregateRef:
    return AggregateRef(context=CONTEXT, aggregate="schedule", tenant=tenant, id=id_)


def _event(ref: AggregateRef, n: int) -> EventEnvelope:
    return EventEnvelope(
        id=f"{ref.tenant}/{ref.id}/{n}",
        type="Something",
        aggregate=ref,
        version=n + 1,
        created_at=T0 + n,
    )


async def _write(log: MemoryLog, events: list[EventEnvelope]) -> None:
    publisher = log.publisher()
    for e in events:
        await publisher.send(
            SCHEDULE.events, e.aggregate.id.encode(), encode(e), partition_of(e.aggregate.id, P)
        )


@pytest.fixture
def decoded(monkeypatch: pytest.MonkeyPatch) -> list[EventEnvelope]:
    """The events `job_log` decodes, as it decodes them."""
    out: list[EventEnvelope] = []

    def counting(data: bytes | None, max_bytes: int) -> tuple[EventEnvelope, str | None]:
        got = decode_event(data, max_bytes)
        out.append(got[0])
        return got

    monkeypatch.setattr(app.ops.job_log, "decode_event", counting)
    return out


def _ids_in(partition: int, count: int) -> Iterator[str]:
    ids = (f"other-{i}" for i in range(10 * count + 100))
    return (i for i in ids if partition_of(i, P) == partition)


async def test_an_instances_events_are_the_only_ones_of_its_partition_decoded(
    decoded: list[EventEnvelope],
) -> None:
    log = MemoryLog()
    log.create_topic(SCHEDULE.events, P)
    mine = _instance("per-tenant", tenant="acme")
    where = partition_of(mine.id, P)
    others = [_instance(i) for i, _ in zip(_ids_in(where, 500), range(500), strict=False)]
    # the other instances' ticks fill the partition, interleaved with the instance's own
    events = [_event(o, n) for n in range(5) for o in others]
    events[::100] = [_event(mine, n) for n in range(len(events[::100]))]
    # another tenant's instance of the same job: the same key, so decoded, and left out
    neighbour = _instance("per-tenant", tenant="globex")
    events += [_event(neighbour, 0), _event(mine, 99)]
    await _write(log, events)
    own = [e for e in events if e.aggregate == mine]

    got = await read_instance_events(log.reader(), mine, P, LIMITS)
    assert [e.id for e in got] == [e.id for e in own]
    # decoded: the instance's own events and the neighbour's (it shares the key), not the
    # 2,500 others' (all decoded, before)
    assert [e.id for e in decoded] == [e.id for e in events if e.aggregate.id == mine.id]
    assert len(decoded) == len(own) + 1


class CountingReads:
    """Counts a reader's reads of the schedule log's partitions."""

    def __init__(self) -> None:
        self.reads: list[int] = []

    def wrap(self, reader: Any) -> Any:
        read = reader.read

        def counted(topic: str, partition: int, start: int) -> AsyncGenerator[list[Record], None]:
            if topic == SCHEDULE.events:
                self.reads.append(partition)
            result: AsyncGenerator[list[Record], None] = read(topic, partition, start)
            return result

        reader.read = counted
        return reader


async def test_instance_events_reads_a_partition_once_for_its_instances() -> None:
    log = MemoryLog()
    log.create_topic(SCHEDULE.events, P)
    tenants = [_instance("per-tenant", tenant=t) for t in ("a", "b", "c")]
    (other_id, *_) = _ids_in(1 - partition_of("per-tenant", P), 1)
    other = _instance(other_id)
    await _write(log, [_event(r, n) for n in range(3) for r in [*tenants, other]])
    counting = CountingReads()
    reader = counting.wrap(log.reader())
    events_of = InstanceEvents(reader, [*tenants, other], P, LIMITS)
    for ref in [tenants[0], other, tenants[2], tenants[1]]:  # in any order
        got = await events_of(ref)
        assert got == await read_instance_events(log.reader(), ref, P, LIMITS)
    assert sorted(counting.reads) == [0, 1]
    # an instance asked for again (none is, in a plan) is read again, on its own
    assert len(await events_of(tenants[0])) == 3
    assert len(counting.reads) == 3


class Edge(WebNode):
    async def act(self, action: str, body: Any) -> Any:
        status, answer = await self.call("POST", f"/jobs/{CONTEXT}/per-tenant/{action}", body)
        assert status == 200, answer
        return answer


@pytest.fixture
async def edge(tmp_path: Path) -> AsyncIterator[Edge]:
    async with web_node(SERVICE, tmp_path, FakeClock(T0 - 30_000), Edge, partitions=P) as e:
        yield e


def _ticked(log: MemoryLog) -> list[EventEnvelope]:
    p = partition_of(PER_TENANT.name, P)
    out = [decode(EventEnvelope, r.value) for r in log.records(SCHEDULE.events, p)]
    return [e for e in out if e.type == TICKED]


async def test_a_backfill_of_instances_in_one_partition_reads_it_once(
    edge: Edge, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenants = ["a", "b", "c"]  # a TENANT job's instances: one id, one partition
    await edge.act("enable", {"tenants": tenants})
    edge.clock.set(T0 + 2 * MIN + 5)
    await wait_until(lambda: len(_ticked(edge.log)) == len(tenants))
    timers = {e.aggregate.tenant: e.body["timer_id"] for e in _ticked(edge.log)}

    counting = CountingReads()
    made = edge.node.clients.reader
    monkeypatch.setattr(edge.node.clients, "reader", lambda: counting.wrap(made()))
    past = {"from": T0, "until": T0 + 2 * MIN, "tenants": tenants}
    dry = await edge.act("backfill", {**past, "dry_run": True})
    assert counting.reads == [partition_of(PER_TENANT.name, P)]  # once, not once a tenant
    assert [(o["instance"]["tenant"], o["slot"], o["request_id"]) for o in dry["outcomes"]] == [
        (t, n, f"{timers[t]}#{n}") for t in tenants for n in range(3)
    ]


# --- send_and_wait -------------------------------------------------------------------------


class HangingReader:
    """A reader whose requests wait for ever (a partition's leader gone), after `given`
    results if any."""

    def __init__(self, *, offsets_hang: bool, given: Sequence[CommandResult] = ()) -> None:
        self._offsets_hang = offsets_hang
        self._given = list(given)

    async def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        if self._offsets_hang:
            await asyncio.Event().wait()
        return 0, 0

    async def read(
        self, topic: str, partition: int, start: int
    ) -> AsyncGenerator[list[Record], None]:
        if self._given:
            got, self._given = self._given, []
            yield [
                Record(topic, partition, start + i, None, encode(r), 0) for i, r in enumerate(got)
            ]
        await asyncio.Event().wait()
        yield []  # pragma: no cover


def _commands() -> list[CommandEnvelope]:
    return [
        trigger_command(CONTEXT, PER_TENANT, tenant=t, request_id=f"run-{t}") for t in ("a", "b")
    ]


def _result(command: CommandEnvelope) -> CommandResult:
    return CommandResult(
        request_id=command.request_id,
        code=ResultCode.COMMITTED,
        aggregate=command.aggregate,
        decided_at=T0,
    )


@pytest.mark.parametrize("offsets_hang", [True, False])
async def test_send_and_wait_waits_no_longer_than_told_when_its_reader_hangs(
    offsets_hang: bool,
) -> None:
    log = MemoryLog()
    log.create_topic(SCHEDULE.commands, P)
    commands = _commands()
    reader = HangingReader(offsets_hang=offsets_hang, given=[_result(commands[0])])
    began = time.monotonic()
    found = await asyncio.wait_for(send_and_wait(log.publisher(), reader, P, commands, 0.3), 10)
    assert time.monotonic() - began < 2
    # sent all the same; a result read before the deadline is kept
    assert sum(len(log.records(SCHEDULE.commands, p)) for p in range(P)) == 2
    assert found == ({} if offsets_hang else {"run-a": _result(commands[0])})


async def test_a_backfills_plan_steps_its_slots_off_the_event_loop(
    edge: Edge, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A per-second rule over a long range steps ~200,000 slots an instance, seconds of
    CPU: on the loop, the node's rounds, cycles and heartbeats would wait that long."""
    stepping = threading.Event()
    stepped = backfill_slots

    def slow(*args: Any, **kwargs: Any) -> Any:
        stepping.set()
        time.sleep(0.5)  # as a long range's stepping holds its thread
        return stepped(*args, **kwargs)

    monkeypatch.setattr(app.ops.job_api, "backfill_slots", slow)
    turns = 0

    async def ticking() -> None:
        nonlocal turns
        while True:
            await asyncio.sleep(0.01)
            if stepping.is_set():
                turns += 1

    ticker = asyncio.create_task(ticking())
    try:
        status, _ = await edge.call(
            "POST",
            f"/jobs/{CONTEXT}/per-tenant/backfill",
            {"from": T0 - 90_000, "until": T0 - 40_000, "tenants": ["a"], "dry_run": True},
        )
    finally:
        ticker.cancel()
    assert status == 200 and stepping.is_set()
    assert turns >= 10, f"the loop turned {turns} times in the plan's 0.5 s"
