"""aiokafka's fetcher task ending (a bug of its own) leaves `getmany` returning nothing,
for good: the node's consumers raise instead, so that the node stops loudly rather than
read nothing while it says it is ready."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from app.kafka.consumers import fetching
from app.kafka.group_consumer import GroupConsumer
from app.kafka.partition_reader import PartitionReader


async def _ended() -> None:
    raise ValueError("a bug in the fetcher")


async def test_a_consumer_whose_fetcher_ended_raises_at_its_poll() -> None:
    task = asyncio.create_task(_ended())
    await asyncio.gather(task, return_exceptions=True)
    dead: Any = SimpleNamespace(_fetcher=SimpleNamespace(error_future=task))
    with pytest.raises(RuntimeError, match=r"fetcher stopped .*a bug in the fetcher"):
        fetching(dead)
    group = GroupConsumer.__new__(GroupConsumer)
    group._consumer = dead
    with pytest.raises(RuntimeError, match="fetcher stopped"):
        await group.poll()
    reader = PartitionReader.__new__(PartitionReader)
    reader._consumer = dead
    with pytest.raises(RuntimeError, match="fetcher stopped"):
        await reader.poll()


async def test_a_consumer_fetching_or_not_started_is_passed() -> None:
    running = asyncio.create_task(asyncio.Event().wait())
    try:
        fetching(SimpleNamespace(_fetcher=SimpleNamespace(error_future=running)))
        fetching(SimpleNamespace(_fetcher=None))
    finally:
        running.cancel()
