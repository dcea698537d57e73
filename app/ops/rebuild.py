"""Rebuilding the timer table from the log: the view is thrown away and replayed.

With every worker of the group stopped: the timers subscription's offsets on the log are
set back to the start and then the table's changelog is emptied (its records deleted up
to now), and the partition count the tables are rebuilt with is recorded (a worker's start
refuses tables built with another: `app.node.partition_count`). The next worker to own a
partition finds its local copy older than the changelog,
drops it, and replays the log into an empty table. Timers that had fired are sent again
under the same request ids and their targets answer DUPLICATE: nothing is applied twice.

A rebuild is planned first (`plan_rebuild`, which reads and changes nothing) and then
carried out as planned (`apply_plan`), so a dry run says exactly what the rebuild does.
The replay is over once the group's committed offset on each partition of the log has
reached that partition's replay end (`replay_progress`, `follow_replay`).

The plan is read and carried out on the cluster's clients (`app.kafka.ports.Clients`):
the CLI's are Kafka's, the tests' a `MemoryLog`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass

from app.errors import ConfigError, GroupBusy, KafkaUnavailable, RebuildIncomplete, TickwheelError
from app.kafka.cluster import delete_records, require_topics, reset_group_offsets
from app.kafka.ports import Clients, LogReader
from app.node.partition_count import write_counts
from app.protocol.topics import AggregateTopics, ContextTopics

__all__ = [
    "GroupBusy",
    "NotTheGroup",
    "PartitionPlan",
    "Progress",
    "RebuildIncomplete",
    "RebuildPlan",
    "Sample",
    "Span",
    "TypePlan",
    "apply_plan",
    "follow_replay",
    "half_way",
    "not_the_group",
    "plan_rebuild",
    "rebuild",
    "replay_progress",
    "replay_span",
]

logger = logging.getLogger(__name__)

Key = tuple[str, int]
"""(topic, partition)."""


@dataclass(frozen=True, slots=True)
class Span:
    """The offsets of one log partition a replay goes through: `start` (the first record
    held) up to `end`, just past the last committed record.

    Not the log's end offset: a transaction's commit marker takes an offset too, and a
    consumer commits the offset after the last record it read, never after the marker.
    """

    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start

    def done(self, committed: int | None) -> int:
        """How much of the span a group that committed `committed` (None: nothing) has read."""
        if committed is None:
            return 0
        return min(max(committed - self.start, 0), self.size)


@dataclass(frozen=True, slots=True)
class PartitionPlan:
    partition: int
    changelog_start: int
    """The changelog partition's first offset held now."""
    changelog_end: int
    """The records before this offset are deleted: all written so far."""
    committed: int | None
    """The group's committed offset on the log partition now (None: none); set to 0."""
    replay: Span
    """What the replay of the log partition reads."""


@dataclass(frozen=True, slots=True)
class TypePlan:
    topics: AggregateTopics
    partitions: tuple[PartitionPlan, ...]


@dataclass(frozen=True, slots=True)
class RebuildPlan:
    group_id: str
    members: int
    """The group's members when planned: a rebuild refuses to run under any."""
    types: tuple[TypePlan, ...]

    def spans(self) -> dict[Key, Span]:
        """The replay's span of every partition of every type's log."""
        return {(t.topics.events, p.partition): p.replay for t in self.types for p in t.partitions}


class NotTheGroup(ConfigError):
    """The rebuild's group is not the one whose workers built the tables (`not_the_group`)."""


def not_the_group(plan: RebuildPlan) -> NotTheGroup | None:
    """Why `plan`'s group is not the one whose workers built the tables it would empty, or
    None: it has a committed offset on some partition of each type's log whose changelog
    holds records (one that holds none loses nothing).

    The changelog's name has no group in it: a rebuild run under another group (the
    operator's shell without the workers' TICKWHEEL_GROUP_ID, a typo) empties the live
    changelog and sets back a group no worker runs in, and the workers' group, its offsets
    kept, replays nothing: the timers are gone. A group that never ran on the log (a new
    one, on purpose) is rebuilt with `new_group` (`apply_plan`; `--new-group`)."""
    strange = [
        t.topics
        for t in plan.types
        if all(p.committed is None for p in t.partitions)
        and any(p.changelog_end > p.changelog_start for p in t.partitions)
    ]
    if not strange:
        return None
    logs = ", ".join(t.events for t in strange)
    changelogs = ", ".join(t.timers_changelog for t in strange)
    return NotTheGroup(
        f"group {plan.group_id!r} has no committed offset on {logs}: it is not the group "
        f"whose workers built {changelogs}, which a rebuild would empty with nothing to "
        "replay it (the workers' group keeps its offsets); set TICKWHEEL_GROUP_ID to the "
        "workers' group, or give --new-group to rebuild for a group that never ran there "
        "(or the workers' own, if it is that group: a group with no member loses its "
        "offsets after the broker's offsets.retention.minutes, 7 days by default)"
    )


async def replay_span(reader: LogReader, topic: str, partition: int) -> Span:
    """The span a replay of `topic[partition]` reads: from its first record held to just
    past its last committed one (read_committed, so aborted records do not count)."""
    begin, end = await reader.offsets(topic, partition)
    # The last record is usually just before the end (one commit marker after it); look
    # further back only when a window holds no committed record.
    window = 64
    while True:
        start = max(begin, end - window)
        last: int | None = None
        async with aclosing(reader.read(topic, partition, start)) as batches:
            async for batch in batches:
                if batch:
                    last = batch[-1].offset
        if last is not None:
            return Span(begin, last + 1)
        if start == begin:
            return Span(begin, begin)
        window *= 16


async def plan_rebuild(
    clients: Clients, group_id: str, types: Sequence[AggregateTopics]
) -> RebuildPlan:
    """What a rebuild of `types` would do now. Reads only: creates no topic, changes no
    offset; `MissingTopic` naming each topic that is not there."""
    wanted: dict[str, str] = {}
    for t in types:
        wanted[t.events] = f"no worker or writer of {t.type_name} has run there"
        wanted[t.timers_changelog] = f"no worker has kept timers of {t.type_name} there"
    admin = clients.admin()
    counts = await require_topics(admin, wanted)
    for t in types:
        if counts[t.events] != counts[t.timers_changelog]:
            raise KafkaUnavailable(
                f"{t.events} has {counts[t.events]} partitions but {t.timers_changelog} "
                f"{counts[t.timers_changelog]}: co-partitioned topics must have the same count"
            )
    members = await admin.group_members(group_id)
    planned = []
    async with clients.reader() as reader:
        for t in types:
            n = counts[t.events]
            changelog = await admin.log_offsets(t.timers_changelog, n)
            committed = await admin.committed_offsets(group_id, ((t.events, p) for p in range(n)))
            parts = [
                PartitionPlan(
                    partition=p,
                    changelog_start=changelog[p][0],
                    changelog_end=changelog[p][1],
                    committed=committed[(t.events, p)],
                    replay=await replay_span(reader, t.events, p),
                )
                for p in range(n)
            ]
            planned.append(TypePlan(t, tuple(parts)))
    return RebuildPlan(group_id, members, tuple(planned))


def half_way(
    plan: RebuildPlan, finished: int, offsets_reset: bool, exc: TickwheelError
) -> RebuildIncomplete:
    """The error of a rebuild of `plan` that failed (`exc`) on its type `finished` (the
    types before it rebuilt), after (`offsets_reset`) or while setting its offsets back."""
    failed = plan.types[finished].topics
    said = [f"the rebuild stopped half-way ({exc})"]
    if finished:
        said.append(f"rebuilt: {', '.join(t.topics.type_name for t in plan.types[:finished])}")
    if offsets_reset:
        said.append(
            f"{failed.type_name}: the group's offsets on {failed.events} were set to 0 but "
            f"its changelog {failed.timers_changelog} was not (or only partly) emptied"
        )
    else:
        said.append(
            f"{failed.type_name}: the group's offsets on {failed.events} were not (or only "
            f"partly) set to 0, its changelog {failed.timers_changelog} is kept"
        )
    if rest := plan.types[finished + 1 :]:
        said.append(f"not begun: {', '.join(t.topics.type_name for t in rest)}")
    return RebuildIncomplete(
        "; ".join(said) + ". Run the same rebuild again, before starting the workers: it "
        "finishes it (nothing is lost meanwhile: a changelog is emptied only once its "
        "log's offsets are set back, so a worker started now replays over its old table)"
    )


async def apply_plan(
    clients: Clients,
    plan: RebuildPlan,
    *,
    new_group: bool = False,
    done: Callable[[TypePlan], None] | None = None,
) -> None:
    """Carries `plan` out, telling `done` of each type rebuilt: `GroupBusy` (and nothing
    changed) while the group has members; `NotTheGroup` (nothing changed) when the group
    has no offset on a type's log, unless `new_group` (`not_the_group`);
    `RebuildIncomplete` saying what it left when a step fails (`half_way`).

    Per type, the offsets are set back before the changelog is emptied: stopped between
    the two (a failure, a kill), the changelog is whole and a worker started then replays
    the log over the table it restores, losing nothing. The other order left a changelog
    empty under offsets kept: a worker dropped its copy (older than the changelog) and
    read on from its offset, every timer set before it gone."""
    if not new_group and (wrong := not_the_group(plan)) is not None:
        raise wrong
    admin = clients.admin()
    members = await admin.group_members(plan.group_id)
    if members or plan.members:
        raise GroupBusy(
            f"group {plan.group_id!r} has {members or plan.members} running worker(s): "
            "stop them, then rebuild"
        )
    for i, t in enumerate(plan.types):
        reset = False
        try:
            await reset_group_offsets(admin, plan.group_id, t.topics.events, len(t.partitions), 0)
            reset = True
            before = {p.partition: p.changelog_end for p in t.partitions}
            await delete_records(admin, t.topics.timers_changelog, before)
        except TickwheelError as exc:
            raise half_way(plan, i, reset, exc) from exc
        logger.info("%s: log offsets reset, changelog emptied", t.topics.type_name)
        if done is not None:
            done(t)
    await _record_counts(clients, plan)


async def _record_counts(clients: Clients, plan: RebuildPlan) -> None:
    """Records the partition count each type's tables are rebuilt with, where a worker's
    start looks for it (`app.node.partition_count`): a start refuses tables built with
    another count than the topics', and the replay builds them with the topics' own. A
    context whose nodes topic no worker made yet has none to write: its start writes it."""
    nodes = {ContextTopics(t.topics.context).nodes for t in plan.types}
    found = await clients.admin().existing_topics(nodes)
    publisher = clients.publisher()
    try:
        await publisher.start()
        for t in plan.types:
            if ContextTopics(t.topics.context).nodes in found:
                await write_counts(
                    publisher, [t.topics], len(t.partitions), int(time.time() * 1000)
                )
    except KafkaUnavailable as exc:
        # After the reset: what was done, and that running it again is safe.
        raise KafkaUnavailable(
            "the changelogs were emptied and the log offsets reset, but the partition "
            f"count was not recorded on {', '.join(sorted(found))} ({exc}): run the same "
            "rebuild again (it empties nothing more) before starting the workers, which "
            "otherwise refuse tables built with another count"
        ) from exc
    finally:
        await publisher.stop()


async def rebuild(
    clients: Clients, group_id: str, types: Sequence[AggregateTopics], *, new_group: bool = False
) -> RebuildPlan:
    """Plans and carries out a rebuild of `types`; the plan it carried out."""
    plan = await plan_rebuild(clients, group_id, types)
    await apply_plan(clients, plan, new_group=new_group)
    return plan


# --- following the replay ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sample:
    """How much was replayed (`done`) at the clock time `at` (seconds)."""

    at: float
    done: int


@dataclass(frozen=True, slots=True)
class Progress:
    done: int
    """Log offsets replayed, over all partitions."""
    total: int
    rate: float | None
    """Offsets a second over the rate window; None until two samples are apart in time."""
    eta: float | None
    """Seconds left at that rate; None while nothing moves."""

    @property
    def complete(self) -> bool:
        return self.done >= self.total


def replay_progress(
    spans: Mapping[Key, Span],
    committed: Mapping[Key, int | None],
    since: Sample | None,
    now: float,
) -> Progress:
    """How far the replay of `spans` is when the group has `committed`, at `now`; the rate
    is measured from the sample `since` (None: no rate yet)."""
    done = sum(span.done(committed.get(key)) for key, span in spans.items())
    total = sum(span.size for span in spans.values())
    rate: float | None = None
    eta: float | None = None
    if since is not None and now > since.at:
        rate = max(done - since.done, 0) / (now - since.at)
    if done >= total:
        eta = 0.0
    elif rate:
        eta = (total - done) / rate
    return Progress(done, total, rate, eta)


Fetch = Callable[[], Awaitable[Mapping[Key, int | None]]]


async def follow_replay(
    fetch: Fetch,
    spans: Mapping[Key, Span],
    report: Callable[[Progress], None],
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    interval: float = 0.5,
    window: float = 10.0,
) -> Progress:
    """Reads the committed offsets (`fetch`) every `interval` seconds and `report`s the
    progress, until the replay is complete; the last progress. The rate is over the last
    `window` seconds. A failed read is logged and read again; cancel to stop following."""
    samples: deque[Sample] = deque()
    while True:
        try:
            committed = await fetch()
        except KafkaUnavailable as exc:
            logger.warning("reading the group's offsets failed, trying again: %s", exc)
            await sleep(interval)
            continue
        now = clock()
        while len(samples) > 1 and samples[1].at <= now - window:
            samples.popleft()
        progress = replay_progress(spans, committed, samples[0] if samples else None, now)
        samples.append(Sample(now, progress.done))
        report(progress)
        if progress.complete:
            return progress
        await sleep(interval)
