"""A node's run (`run_parts`, which `Node.run` runs): its timer loops started, its commits,
its poll loop, its failure and its suspension watch run, and beside them the watches of
`node_watches` and a supervisor of each follower its sends depend on; the first of them to
end ends the run (`NodeFailed` unless the node failed first), everything cancelled then
and the partitions' workers stopped. May import `app.errors`, `app.kafka`'s broker_watch,
ports and tls_reload, `app.node`'s commits, kept, node_watches, partition_tasks, polling,
suspension and topic_watch, `app.task_ends` and `app.timers`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from app.errors import NodeFailed
from app.kafka.broker_watch import BrokerWatch
from app.kafka.ports import GroupMember, PublisherClient
from app.kafka.tls_reload import TlsReload
from app.node import polling
from app.node.commits import Commits
from app.node.kept import KeptType
from app.node.node_watches import start_watches, supervisors
from app.node.partition_tasks import PartitionTasks
from app.node.suspension import SuspensionWatch
from app.node.topic_watch import TopicPolicyWatch
from app.task_ends import how_ended
from app.timers.ledger import KafkaFailureLedger
from app.timers.sender import ResultsReader

__all__ = ["NodeRunParts", "run_parts"]


class NodeRunParts(Protocol):
    """What a node's run uses of the node (`Node` is one)."""

    types: dict[str, KeptType]
    commits: Commits
    tasks: PartitionTasks
    topic_watch: TopicPolicyWatch
    producer: PublisherClient
    tls: TlsReload | None
    broker: BrokerWatch

    def fail(self, why: str) -> None: ...


async def run_parts(
    node: NodeRunParts,
    consumer: GroupMember,
    *,
    type_of: Mapping[str, str],
    failure_set: asyncio.Event,
    failure: Callable[[], NodeFailed | None],
    suspension: SuspensionWatch,
    followers: Mapping[str, ResultsReader | KafkaFailureLedger],
    ledgers: Mapping[str, KafkaFailureLedger],
    unwatch: Callable[[], None],
) -> None:
    """Runs `node`'s parts until the first ends: `failure()` when the node failed
    (`failure_set` set), else `NodeFailed` naming the part. `type_of`: each topic read, its
    type's name (the poll loop's routing); `followers`: those its sends and parks depend on,
    by name; `ledgers`: each context's ledger; `unwatch`: ends the node's watch of its
    user code, once its work stopped."""
    for kept in node.types.values():
        kept.loop.start()
    committer = asyncio.create_task(node.commits.run(node.types), name="partition commits")
    reader = asyncio.create_task(
        polling.poll_loop(consumer, node.tasks.running, node.commits, node.fail, type_of),
        name="reader",
    )
    failed = asyncio.create_task(failure_set.wait(), name="failure")
    watch = asyncio.create_task(suspension.run(), name="suspension watch")
    tasks: list[asyncio.Task[Any]] = [committer, reader, failed, watch]
    # The readers the sends and the ledgers depend on: one that ends stops the node.
    following = {what: f.task for what, f in followers.items()}
    watches = start_watches(ledgers, node.types, node.topic_watch, node.producer, node.tls)
    following |= watches
    # Stuck where it ended, it would say the broker is up through an outage, or down
    # for good (and the node never ready).
    following["the broker watch"] = node.broker.task
    tasks += supervisors(following, node.fail)
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        if (failed_with := failure()) is not None:
            raise failed_with  # why it failed (the poll loop returns after `fail`)
        for task in (committer, reader, watch):
            if task.done():
                # Never a quiet end (a cancellation leaking out of a client library
                # included): the worker would exit 0 with its partitions unworked.
                raise NodeFailed(f"{task.get_name()} {how_ended(task)}")
    finally:
        for task in [*tasks, *watches.values()]:
            task.cancel()
        await asyncio.gather(*tasks, *watches.values(), return_exceptions=True)
        # The partitions' workers stop with the loop (their tasks close in `stop`).
        for partition_task in [*node.tasks.tasks.values(), *node.tasks.closing]:
            await partition_task.stop_input()
        # Its work stopped, no user code of the node runs: a node left unstopped (a
        # failed run) holds the process's watch (and its signal) no longer.
        unwatch()
