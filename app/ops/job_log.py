"""The jobs' schedule log as `tickwheel jobs …` and the web edge's `/jobs` routes read and
write it (`app.ops.job_api` makes the commands): send commands to a context's schedule and
wait for their results, and read the instances' states (or one instance's events) from its
event log. On the log's ports (`LogReader`, `Publisher`); a read creates no topic.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Collection, Iterable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from app.commands.records import misrouted
from app.errors import BadRecord
from app.jobs import SCHEDULE, Job, ScheduleState, schedule_aggregate
from app.kafka.ports import LogReader, Publisher
from app.model.decide import StoredAggregate, cut_message, fold
from app.ops.deadline import by
from app.protocol.limits import InputLimits
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
    "InstanceEvents",
    "InstanceState",
    "fold_instances",
    "read_events_of",
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
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> dict[str, CommandResult]:
    """Sends `commands` (all to one context's schedule) and, for up to `wait_s` seconds,
    waits for their results: those that came, by request id.

    `wait_s` bounds the reads as a whole (as `timer_api.submit`'s): each of a `Reader`'s
    requests may wait far longer (40 s) for a partition's leader that is gone. The send is
    not bounded by it: cut short, it would be as ambiguous as a send that failed."""
    if not commands:
        return {}
    context = commands[0].aggregate.context
    topics = AggregateTopics(context, SCHEDULE)
    results_topic = ContextTopics(context).results
    # A result is the answer of the command of its request id and aggregate: another
    # caller's request under the same id (a trigger of another job, at the same moment)
    # is answered under it too, by its own aggregate.
    wanted = {c.request_id: c.aggregate for c in commands}
    deadline = asyncio.get_running_loop().time() + wait_s
    # Where each result will be written (`processor`: the request id picks the partition),
    # and how far those partitions reach now: the results come after. Not known in time,
    # the commands are sent all the same (a `--wait 0` sends and waits not), and no
    # result is looked for.
    ends = _ends(reader, results_topic, {partition_of(r, partitions) for r in wanted})
    start = await by(deadline, ends)
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
    if start is not None and wait_s > 0:
        # `found` is filled as they come: the results read before the deadline are kept.
        await by(deadline, _results(reader, results_topic, start, wanted, found, poll_s, sleep))
    return found


async def _ends(reader: LogReader, topic: str, partitions: Iterable[int]) -> dict[int, int]:
    return {p: (await reader.offsets(topic, p))[1] for p in sorted(partitions)}


async def _results(
    reader: LogReader,
    topic: str,
    start: dict[int, int],
    wanted: dict[str, AggregateRef],
    found: dict[str, CommandResult],
    poll_s: float,
    sleep: Callable[[float], Awaitable[None]],
) -> None:
    """Reads `topic`'s partitions from `start` into `found` until every request id of
    `wanted` has its result, the one its aggregate wrote (waited for: the caller bounds
    it)."""
    while True:
        for p in sorted(start):
            async with aclosing(reader.read(topic, p, start[p])) as batches:
                async for batch in batches:
                    for r in batch:
                        start[p] = r.offset + 1
                        try:
                            result = decode(CommandResult, r.value)
                        except BadRecord:
                            continue
                        if wanted.get(result.request_id) == result.aggregate:
                            found[result.request_id] = result
        if len(found) == len(wanted):
            return
        await sleep(poll_s)


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
    reader: LogReader,
    topic: str,
    read: Iterable[int],
    partitions: int,
    keys: Collection[bytes | None] | None,
    limits: InputLimits,
) -> AsyncGenerator[list[EventEnvelope], None]:
    """The events of `topic`'s partitions `read` (of `partitions`), a fetch at a time:
    those the workers fold, each as they fold it (as a restore folds it,
    `app.commands.restore`): none over the size bounds, none that no version took, none
    keyed otherwise than by its aggregate's id or out of its partition (`misrouted`: the
    workers dead-letter it, and a forged `Disabled` would have shown a running instance
    disabled). `keys`: only records keyed by one of them are decoded (decoding is the
    cost; None: all)."""
    for p in read:
        async with aclosing(reader.read(topic, p, 0)) as batches:
            async for batch in batches:
                events = []
                for r in batch:
                    if keys is not None and r.key not in keys:
                        continue
                    try:
                        limits.check(r.key, r.value)
                        event = decode_event(r.value, limits.max_record_bytes)[0]
                    except BadRecord:
                        continue
                    if misrouted(r, event.aggregate, partitions) is None:
                        events.append(event)
                yield events


async def read_instances(
    reader: LogReader,
    context: str,
    jobs: Iterable[Job],
    partitions: int,
    have: int,
    limits: InputLimits,
) -> list[InstanceState]:
    """The instances of `context`'s jobs as their schedule log (of `have` partitions) has
    them now; the caller knows the log is there (a read creates no topic). Folded a fetch
    at a time, between the reads: a node serving it keeps its event loop for its work.
    `limits`: the records' size bounds the workers hold them to."""
    folding = _Folding(context, jobs, partitions)
    topic = AggregateTopics(context, SCHEDULE).events
    async with aclosing(_batches(reader, topic, range(have), partitions, None, limits)) as batches:
        async for batch in batches:
            folding.add(batch)
            await asyncio.sleep(0)
    return folding.instances()


async def read_instance_events(
    reader: LogReader, ref: AggregateRef, partitions: int, limits: InputLimits
) -> list[EventEnvelope]:
    """The events of the job instance `ref`, in log order, from its partition of its
    context's schedule log (held to the workers' `limits`); the caller knows the log is
    there."""
    return (await read_events_of(reader, [ref], partitions, limits))[ref]


async def read_events_of(
    reader: LogReader, refs: Iterable[AggregateRef], partitions: int, limits: InputLimits
) -> dict[AggregateRef, list[EventEnvelope]]:
    """The events of each job instance of `refs`, in log order; the caller knows their
    logs are there. The schedule log is kept for good and grows by a tick at a time: each
    partition is read once for all of its instances, a fetch at a time, and only their
    own events are decoded and held."""
    where: dict[tuple[str, int], dict[AggregateRef, list[EventEnvelope]]] = {}
    for ref in refs:
        where.setdefault(_log_of(ref, partitions), {})[ref] = []
    for (topic, p), found in where.items():
        # An instance's records are keyed by its id; one keyed otherwise is not folded by
        # the workers either (`misrouted`). Most of a partition is other instances' ticks.
        keys = {ref.id.encode() for ref in found}
        async with aclosing(_batches(reader, topic, [p], partitions, keys, limits)) as batches:
            async for batch in batches:
                for event in batch:
                    if (mine := found.get(event.aggregate)) is not None:
                        mine.append(event)
                await asyncio.sleep(0)  # a node serving it keeps its event loop for its work
    return {ref: events for found in where.values() for ref, events in found.items()}


def _log_of(ref: AggregateRef, partitions: int) -> tuple[str, int]:
    """The schedule log's topic and partition of the job instance `ref`."""
    return AggregateTopics(ref.context, SCHEDULE).events, partition_of(ref.id, partitions)


class InstanceEvents:
    """`plan_backfill`'s `events_of` over the instances `refs`: the first ask of one reads
    its partition once for all of `refs` there (`read_events_of`), and each instance's
    events are handed out once and let go, not kept for the whole plan."""

    def __init__(
        self,
        reader: LogReader,
        refs: Iterable[AggregateRef],
        partitions: int,
        limits: InputLimits,
    ) -> None:
        self._reader = reader
        self._partitions = partitions
        self._limits = limits
        self._unread: dict[tuple[str, int], list[AggregateRef]] = {}
        for ref in refs:
            self._unread.setdefault(_log_of(ref, partitions), []).append(ref)
        self._read: dict[AggregateRef, list[EventEnvelope]] = {}

    async def __call__(self, ref: AggregateRef) -> list[EventEnvelope]:
        if ref not in self._read:
            # An instance not among `refs`, or asked for again, is read on its own.
            together = [ref, *self._unread.pop(_log_of(ref, self._partitions), [])]
            self._read.update(
                await read_events_of(self._reader, together, self._partitions, self._limits)
            )
        return self._read.pop(ref)
