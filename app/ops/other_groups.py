"""A worker's start refused while nodes of another group own partitions of its types.

A node's transactional ids carry its group (`<group>.<changelog>.<p>`), so a node of
another group (`TICKWHEEL_GROUP_ID` changed in a rolling deploy, a typo in one pod's
settings) fences none of the running group's producers, nor they its: both groups own
every partition of the type, both write its changelog, and every timer fires twice.

Every node reports what it owns to `<context>.nodes` every few seconds
(`app.ops.cluster_status`). Before a worker joins its group, it reads those topics (read
only: one not there is no node) and refuses to start (`OtherGroupRunning`) when a report
not stale (`node_report.stale`: its node stopped without its tombstone) nor dated ahead
(`from_the_future`: a clock far ahead, or another producer's) of a node of
another group names a partition of a type the worker keeps. Reports of types it does not
keep do not count: two services of one context may each run in a group of their own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Iterable, Sequence
from contextlib import aclosing
from typing import TYPE_CHECKING

from app.errors import ConfigError
from app.kafka.ports import Clients, ReaderClient
from app.node.partition_count import KEY_PREFIX
from app.ops.node_report import NodeReport, decode_report, from_the_future, stale
from app.protocol.topics import AggregateTopics, ContextTopics
from app.task_ends import cancelled_here

if TYPE_CHECKING:
    from app.node import Node

__all__ = ["OtherGroupRunning", "check_other_groups", "refuse_other_groups", "running_elsewhere"]


class OtherGroupRunning(ConfigError):
    """A node of another group owns partitions of a type this worker would keep."""


def running_elsewhere(
    reports: Iterable[NodeReport], group: str, types: Collection[str], now: int
) -> tuple[NodeReport, list[str]] | None:
    """The newest report not stale of a node of another group than `group` owning a
    partition of one of `types`, with those types; None when there is none."""
    found = [
        (r, sorted({p.type for p in r.partitions} & set(types)))
        for r in reports
        if r.group != group and not stale(r, now) and not from_the_future(r, now)
    ]
    found = [(r, kept) for r, kept in found if kept]
    return max(found, key=lambda f: (f[0].at, f[0].node), default=None)


async def refuse_other_groups(node: Node) -> None:
    """`check_other_groups` for `node`, before its start."""
    s = node.settings
    await check_other_groups(node.clients, node.topics, s.group_id, node.clock.now())


async def check_other_groups(
    clients: Clients, topics: Sequence[AggregateTopics], group: str, now: int
) -> None:
    """Raises `OtherGroupRunning` when `running_elsewhere` finds a node in the
    `<context>.nodes` topics of `topics`' contexts, each read whole (the newest record of
    each key)."""
    admin = clients.admin()
    # Wrong credentials or an untrusted certificate: one error, as the node's start says it.
    await admin.check_access()
    names = sorted({ContextTopics(t.context).nodes for t in topics})
    there = [name for name in names if name in await admin.existing_topics(names)]
    newest: dict[tuple[str, bytes], NodeReport | None] = {}
    if not there:
        return  # no node reported on these contexts yet (and no reader made for nothing)
    reader = clients.reader()
    await reader.start()
    try:
        for name in there:
            async with aclosing(reader.read(name, 0, 0)) as batches:
                async for batch in batches:
                    for r in batch:
                        if r.key is None or r.key.startswith(KEY_PREFIX):
                            continue
                        try:
                            newest[(name, r.key)] = decode_report(r.key, r.value)
                        except ValueError:
                            continue  # another producer's record: no node's report
    finally:
        await _stopped(reader)
    reports = [r for r in newest.values() if r is not None]
    found = running_elsewhere(reports, group, [t.type_name for t in topics], now)
    if found is None:
        return
    report, kept = found
    raise OtherGroupRunning(
        f"node {report.node} of group {report.group!r} owns partitions of {', '.join(kept)} "
        f"(its report {max(now - report.at, 0) // 1000} s old): a node of group {group!r} "
        "would own them too, and every timer would fire twice (the groups fence none of "
        f"each other's producers). Set TICKWHEEL_GROUP_ID to {report.group!r}, or stop "
        "that group's workers first (a group that never ran on these topics reads them "
        "from their start: see `tickwheel rebuild --new-group`)"
    )


async def _stopped(reader: ReaderClient) -> None:
    """Stops `reader`; a cancellation aiokafka's consumer leaks out of a stop soon after
    its start (its coordinator's task cancelled and awaited) is not this task's."""
    try:
        await reader.stop()
    except asyncio.CancelledError:
        if cancelled_here():
            raise
