"""The order a node's parts stop in (`stop_parts`), as `node_start` holds what its start
reads: its partitions closed while it is still the group's member, then its timer loops and
runners, the group consumer, the partitions left and their producers, the followers, the
clients, and the stores last, always; under one deadline. May import `app.kafka`'s ports,
`app.node`'s kept, local_state and partition_tasks, and `app.task_ends`."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol

from app.kafka.ports import GroupMember
from app.node.kept import KeptType
from app.node.local_state import DataDirLock
from app.node.partition_tasks import PartitionTasks
from app.task_ends import stop_part
from tables.aggregate_store import RocksAggregateStore

__all__ = ["Stopping", "stop_parts"]


class Stopping(Protocol):
    """A part of a node stopped by its own `stop` (a follower, a client, a watch)."""

    async def stop(self) -> None: ...


async def stop_parts(
    tasks: PartitionTasks,
    types: Mapping[str, KeptType],
    *,
    deadline_s: float,
    consumer: GroupMember | None,
    followers: Mapping[str, Stopping],
    clients: Mapping[str, Stopping],
    data_lock: DataDirLock,
) -> None:
    """Stops every part of a node, each whatever another's stop raised (a consumer stopped
    while the broker is away re-raises its fetcher's cancellation); the stores of `types`
    are closed last, always, and `data_lock` released then. Its partitions are closed
    (what their transactions hold committed, their copies marked clean) while the node is
    still the group's member, before it leaves: no other node is given them before their
    work here committed (aiokafka's stop leaves the group without revoking), and none is
    taken again here meanwhile. Nothing here waits for a revoke: a static member
    (`group_instance_id`) does not leave at all, its partitions kept for it by the group
    for a session. `followers` and then `clients` are stopped in their order, by what
    each is called."""
    # One deadline for the closes and the timer loops' ends, as for a revoke's: the
    # whole stop fits a container's grace period.
    clock = asyncio.get_running_loop()
    ends_at = clock.time() + deadline_s
    # Each close bounded by the close deadline, its timers' last writes included.
    await stop_part("the partitions", tasks.revoke(tasks.leftover()))
    kept_types = list(types.values())
    # A round in progress may wait on a ledger write (10 s each, queued): cut short
    # past the deadline, as the closes' are (their firings are stopped); every type's
    # at once.
    left = max(ends_at - clock.time(), 1.0)
    loops = asyncio.gather(*(kept.loop.stop(within=left) for kept in kept_types))
    await stop_part("the timer loops", loops)
    # No firing is left (each close stopped its own): a bound all the same.
    firings = asyncio.gather(*(kept.runner.stop_all() for kept in kept_types))
    left = max(ends_at - clock.time(), 1.0)
    await stop_part("the runners", asyncio.wait_for(firings, left))
    if consumer is not None:
        await stop_part("the group consumer", consumer.stop())
    # A take under way as it left (a retake after a failure) is stopped, and closes
    # under way are waited for.
    await stop_part("the partitions", tasks.revoke(tasks.leftover()))
    # Producer stops the closes left past their deadline, each type's at once.
    await stop_part("the partitions' producers", _producers_stopped(types))
    for what, follower in followers.items():
        await stop_part(what, follower.stop())
    for what, client in clients.items():
        await stop_part(what, client.stop())
    try:
        for kept in types.values():
            await stop_part(f"{kept.name} store", kept.store.close())
            if kept.states is not None:
                # Logged as the store's is: a refused close (a RocksDB write that failed
                # before it) left the next types' stores open and unsynced.
                await stop_part(f"{kept.name} states", _closed(kept.states))
    finally:
        data_lock.release()  # the stores closed: another worker may have it now


async def _closed(states: RocksAggregateStore) -> None:
    states.close()


async def _producers_stopped(types: Mapping[str, KeptType]) -> None:
    await asyncio.gather(*(kept.transactions.stopped() for kept in types.values()))
