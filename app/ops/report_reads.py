"""What a node's status report (`app.ops.node_report.collect_report`) reads of the node:
a partition's state as its `health()` says, and the earliest due timers of partitions
any of which may be let go while it reads."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tables import StoreClosed, Timer, TimerStore
from tables.bounds import MAX_INT64

__all__ = ["due_timers", "partition_state"]


def partition_state(p: int, health: Mapping[str, Any]) -> tuple[str, str] | None:
    """What a node's `health()` says of partition p: (state, why), None if not its."""
    stalled: dict[str, str] = health["stalled"]
    why = stalled.get(str(p), "")
    if p in set(health["restoring"]):
        return ("failed, taken again" if why else "restoring"), why
    if p in set(health["owned"]):
        return ("stalled" if why else "running"), why
    if why:
        return "failed", why
    return None


async def due_timers(store: TimerStore, partitions: set[int], limit: int) -> list[Timer]:
    """The earliest `limit` due timers of `partitions`, read at once; when one of them was
    let go meanwhile (`StoreClosed`), those of the others, each read on its own."""
    try:
        return await store.due(partitions, MAX_INT64, limit)
    except StoreClosed:
        pass
    found: list[Timer] = []
    for p in sorted(partitions):
        try:
            found += await store.due({p}, MAX_INT64, limit)
        except StoreClosed:
            continue  # this one went: its next owner lists them
    return sorted(found, key=lambda t: (t.due_at, t.id))[:limit]
