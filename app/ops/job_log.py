"""The jobs' schedule log as `tickwheel jobs …` and the web edge's `/jobs` routes read and
write it (`app.ops.job_api` makes the commands): send commands to a context's schedule and
wait for their results, and read the instances' states (or one instance's events) from its
event log. On the log's ports (`LogReader`, `Publisher`); a read creates no topic.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from app.errors import BadRecord
from app.jobs import SCHEDULE, Job, ScheduleState, schedule_aggregate
from app.kafka.ports import LogReader, Publisher
from app.model.decide import StoredAggregate, cut_message, fold
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import (
    CommandEnvelope,
    CommandResult,
    EventEnvelope,
    decode,
    decode_event,
    encode,
)
from tables import AggregateRef
from tables.partitioner import partition_of

__all__ = [
    "InstanceState",
    "fold_instances",
    "read_instance_events",
    "read_instances",
    "send_and_wait",
]


async def send_and_wait(
    publisher: Publisher,
    reader: LogReader,
    partitions: int,
    commands: Sequence[CommandEnvelope],
    wait_s: float,
    *,
    poll_s: float = 0.2,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> dict[str, CommandResult]:
    """Sends `commands` (all to one context's schedule) and, for up to `wait_s` seconds,
    waits for their results: those that came, by request id."""
    if not commands:
        return {}
    context = commands[0].aggregate.context
    topics = AggregateTopics(context, SCHEDULE)
    results_topic = ContextTopics(context).results
    # Where each result will be written (`processor`: the request id picks the partition),
    # and how far those partitions reach now: the results come after.
    wanted = {c.request_id: partition_of(c.request_id, partitions) for c in commands}
    start = {p: (await reader.offsets(results_topic, p))[1] for p in set(wanted.values())}
    await publisher.send_many(
        [
            (
                topics.commands,
                partition_of(c.aggregate.id, partitions),
                c.aggregate.id.encode(),
                encode(c),
            )
            for c in commands
        ]
    )
    found: dict[str, CommandResult] = {}
    deadline = clock() + wait_s
    while wait_s > 0 and len(found) < len(wanted):
        for p in sorted(start):
            async for batch in reader.read(results_topic, p, start[p]):
                for r in batch:
                    start[p] = r.offset + 1
                    try:
                        result = decode(CommandResult, r.value)
                    except BadRecord:
                        continue
                    if result.request_id in wanted:
                        found[result.request_id] = result
        if len(found) == len(wanted) or clock() >= deadline:
            break
        await sleep(poll_s)
    return found


@dataclass(frozen=True, slots=True)
class InstanceState:
    """One instance as the schedule log has it."""

    tenant: str
    id: str
    version: int
    state: ScheduleState
    error: str | None = None
    """Why events of the instance could not be folded (passed over, as the workers do)."""

    def as_json(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "id": self.id,
            "version": self.version,
            **self.state.model_dump(),
            **({"error": self.error} if self.error is not None else {}),
        }


def fold_instances(
    context: str, jobs: Iterable[Job], partitions: int, events: Iterable[EventEnvelope]
) -> list[InstanceState]:
    """The instances of `context`'s jobs folded from their events (in log order). An event
    that cannot be folded (another writer's) is passed over, as the workers pass it over
    (dead-lettered), and its instance says so (`InstanceState.error`): one bad instance
    does not hide the others."""
    folding = _Folding(context, jobs, partitions)
    folding.add(events)
    return folding.instances()


class _Folding:
    """`fold_instances` a batch at a time: a whole schedule log is never held, and the
    event loop is given back between batches."""

    def __init__(self, context: str, jobs: Iterable[Job], partitions: int) -> None:
        self._type_name = AggregateTopics(context, SCHEDULE).type_name
        self._agg = schedule_aggregate(context, jobs, partitions)
        self._stored: dict[tuple[str, str], StoredAggregate] = {}
        self._errors: dict[tuple[str, str], list[str]] = {}

    def add(self, events: Iterable[EventEnvelope]) -> None:
        stored, errors = self._stored, self._errors
        for event in events:
            if event.aggregate.type_name != self._type_name:
                continue
            key = (event.aggregate.tenant, event.aggregate.id)
            try:
                stored[key] = fold(self._agg, stored.get(key), [event])
            except Exception as exc:
                why = cut_message(f"{type(exc).__name__}: {exc}")
                errors.setdefault(key, []).append(
                    f"event {event.id} (version {event.version}): {why}"
                )

    def instances(self) -> list[InstanceState]:
        every = {**dict.fromkeys(self._errors, _NEVER), **self._stored}
        return [
            InstanceState(
                t,
                i,
                s.version,
                ScheduleState.model_validate(s.state),
                _passed_over(self._errors.get((t, i), [])),
            )
            for (t, i), s in sorted(every.items())
        ]


_NEVER = StoredAggregate()
"""An instance none of whose events could be folded."""


def _passed_over(errors: list[str]) -> str | None:
    if not errors:
        return None
    more = f" (and {len(errors) - 1} more events passed over)" if len(errors) > 1 else ""
    return f"passed over {errors[0]}{more}"


async def _batches(
    reader: LogReader, topic: str, partitions: Iterable[int]
) -> AsyncIterator[list[EventEnvelope]]:
    """The events of `topic`'s `partitions`, a fetch at a time: each as the workers fold
    it (`decode_event`), none that no version took."""
    for p in partitions:
        async for batch in reader.read(topic, p, 0):
            events = []
            for r in batch:
                try:
                    events.append(decode_event(r.value)[0])
                except BadRecord:
                    continue
            yield events


async def _events(reader: LogReader, topic: str, partitions: Iterable[int]) -> list[EventEnvelope]:
    return [e async for batch in _batches(reader, topic, partitions) for e in batch]


async def read_instances(
    reader: LogReader, context: str, jobs: Iterable[Job], partitions: int, have: int
) -> list[InstanceState]:
    """The instances of `context`'s jobs as their schedule log (of `have` partitions) has
    them now; the caller knows the log is there (a read creates no topic). Folded a fetch
    at a time, between the reads: a node serving it keeps its event loop for its work."""
    folding = _Folding(context, jobs, partitions)
    topic = AggregateTopics(context, SCHEDULE).events
    async for batch in _batches(reader, topic, range(have)):
        folding.add(batch)
        await asyncio.sleep(0)
    return folding.instances()


async def read_instance_events(
    reader: LogReader, ref: AggregateRef, partitions: int
) -> list[EventEnvelope]:
    """The events of the job instance `ref`, in log order, from its partition of its
    context's schedule log; the caller knows the log is there."""
    topic = AggregateTopics(ref.context, SCHEDULE).events
    events = await _events(reader, topic, [partition_of(ref.id, partitions)])
    return [e for e in events if e.aggregate == ref]
