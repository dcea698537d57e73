"""The search of an owner whose partition lives on another node: its timers read from that
partition of the timer table's changelog, one such read at a time per node.

No node talks to another over HTTP, so a search of an owner elsewhere reads the owner's
rows from the changelog instead (`ClusterStatus.changelog_timers`). It is apart from
`cluster_status` because it has nothing to do with the status reports published and
followed there: it only shares that module's clients, and the limit on how many whole
changelog partitions a node reads at once (`CHANGELOG_READS`, `CHANGELOG_WAIT_S`), which
is its own.
"""

from __future__ import annotations

import asyncio
import heapq
from contextlib import aclosing, suppress
from typing import Final

from app.errors import TickwheelError
from app.kafka.ports import Clients
from app.protocol.topics import parse_aggregate_type
from tables import AggregateRef, Timer
from tables.keys import owner_prefix, restored_row
from tables.owner_pick import OwnerTimers
from tables.timer import ACTIVE
from tables.tombstones import is_deletion_mark

__all__ = [
    "CHANGELOG_READS",
    "CHANGELOG_WAIT_S",
    "ChangelogBusy",
    "search_changelog",
]

CHANGELOG_READS: Final = 1
CHANGELOG_WAIT_S: Final = 5.0
"""A search of an owner elsewhere reads a whole changelog partition: one such read at a
time per node, and a search that waits longer than this for it is answered busy (503)."""


class ChangelogBusy(TickwheelError):
    """Another search is reading a changelog on this node: try again shortly."""


async def search_changelog(
    clients: Clients,
    reads: asyncio.Semaphore,
    wait_s: float,
    type_name: str,
    partition: int,
    owner: AggregateRef,
    limit: int,
) -> OwnerTimers:
    """Up to `limit` of `owner`'s timers as the changelog of its partition has them, live
    ones first, once one of `reads` is free (`ChangelogBusy` after `wait_s`): see
    `ClusterStatus.changelog_timers`."""
    try:
        async with asyncio.timeout(wait_s):
            await reads.acquire()
    except TimeoutError:
        raise ChangelogBusy(
            f"another search is reading a changelog on this node (waited "
            f"{wait_s:g} s): try again shortly"
        ) from None
    try:
        return await _read_changelog(clients, type_name, partition, owner, limit)
    finally:
        reads.release()


_LIVE, _FINISHED, _MARK = 0, 1, 2
"""How a held row ranks for the view: live ones are shown first; a deletion mark never."""


def _rank(timer: Timer) -> int:
    # An owner's deletion mark is no timer (`tables.tombstones`).
    if is_deletion_mark(timer):
        return _MARK
    return _LIVE if timer.status in ACTIVE else _FINISHED


async def _read_changelog(
    clients: Clients, type_name: str, partition: int, owner: AggregateRef, limit: int
) -> OwnerTimers:
    topic = parse_aggregate_type(type_name).timers_changelog
    prefix = owner_prefix(owner)
    # Each key's last row held as its record's bytes and rank, not decoded: an owner may
    # keep tens of thousands of rows, and a decoded Timer takes many times its record.
    rows: dict[bytes, tuple[int, bytes]] = {}
    reader = clients.reader()
    await reader.start()
    try:
        async with aclosing(reader.read(topic, partition, 0)) as batches:
            async for batch in batches:
                for r in batch:
                    if r.key is None or not r.key.startswith(prefix):
                        continue
                    if r.value is None:
                        rows.pop(r.key, None)
                        continue
                    # As a restore takes it (`restored_row`): a record that is no row of
                    # the partition's under its key leaves the key's earlier row (the
                    # node writes that row again after it). The key being one of
                    # `owner`'s, a row taken is `owner`'s, of the type and partition the
                    # caller keyed it to: the restore's owner check holds.
                    with suppress(ValueError):  # a restore letters it
                        rank = _rank(restored_row(partition, r.key, r.value))
                        rows[r.key] = (rank, r.value)
    finally:
        await reader.stop()
    shown = heapq.nsmallest(
        limit, ((rank, key) for key, (rank, _) in rows.items() if rank != _MARK)
    )
    timers = [restored_row(partition, key, rows[key][1]) for _, key in shown]
    total = sum(1 for rank, _ in rows.values() if rank != _MARK)
    return OwnerTimers(timers, total)
