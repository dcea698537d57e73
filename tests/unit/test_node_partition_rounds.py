"""Each partition task drives its own timer rounds (#19), on the in-memory log: a
partition whose timer store call hangs holds no other partition's rounds up, so the
other's timer fires meanwhile; once the call returns, its own fires too."""

from __future__ import annotations

import asyncio
from collections.abc import Set
from pathlib import Path

import pytest
from fakes import RunningNode, wait_until
from test_node_lifecycle import COUNTER, PARTITIONS, command, events, log, nodes, now_ms, start

from app.kafka.memory import MemoryLog
from tables import DueRow
from tables.partitioner import partition_of

__all__ = ["log", "nodes"]  # the fixtures, imported for pytest


def owner_in(p: int) -> str:
    return next(f"o{i}" for i in range(50) if partition_of(f"o{i}", PARTITIONS) == p)


async def test_a_partition_whose_store_hangs_holds_no_other_partitions_timers_up(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = await start(nodes, log, tmp_path, "a")
    await wait_until(node.runs)
    kept = node.node.types[COUNTER.type_name]
    entered, release = asyncio.Event(), asyncio.Event()
    due_rows = kept.store.due_rows

    async def hanging(partitions: Set[int], until: int, limit: int) -> list[DueRow]:
        if 0 in partitions:
            entered.set()
            await release.wait()
        return await due_rows(set(partitions), until=until, limit=limit)

    monkeypatch.setattr(kept.store, "due_rows", hanging)
    held, free = owner_in(0), owner_in(1)

    def fired() -> list[str]:
        return sorted(e.aggregate.id for e in events(log, COUNTER, "Fired"))

    try:
        await wait_until(entered.is_set)  # partition 0's round waits on its load
        await command(log, COUNTER, held, "Schedule", at=now_ms() + 300)
        await command(log, COUNTER, free, "Schedule", at=now_ms() + 300)
        await wait_until(lambda: fired() == [free], what=lambda: f"fired: {fired()}")
        assert not release.is_set()
    finally:
        release.set()  # so that the node stops, whatever failed
    await wait_until(lambda: fired() == sorted([held, free]), what=lambda: f"fired: {fired()}")
