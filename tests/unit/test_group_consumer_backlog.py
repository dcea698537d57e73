"""`GroupConsumer.backlog`, asked by a partition's cycle with its lock held: it never waits
on a position being reset (aiokafka's `position` would, for as long as that takes)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import IllegalStateError

import app.kafka.group_consumer
from app.errors import KafkaUnavailable
from app.kafka.group_consumer import GroupConsumer


class StubConsumer:
    """aiokafka's consumer as `backlog` uses it: a highwater and a position."""

    def __init__(self, high: int | None, position: Any) -> None:
        self.high = high
        self.position_is = position

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.high

    async def position(self, tp: TopicPartition) -> int:
        if isinstance(self.position_is, BaseException):
            raise self.position_is
        if self.position_is is None:  # being reset: waits until it is
            await asyncio.Event().wait()
        return int(self.position_is)


def member(consumer: StubConsumer) -> GroupConsumer:
    group = GroupConsumer.__new__(GroupConsumer)
    group._consumer = consumer
    return group


async def test_the_records_behind_the_position() -> None:
    assert await member(StubConsumer(high=120, position=100)).backlog("t", 0) == 20
    assert await member(StubConsumer(high=None, position=100)).backlog("t", 0) == 0


async def test_a_position_being_reset_counts_none_and_is_not_waited_for() -> None:
    assert await member(StubConsumer(high=120, position=None)).backlog("t", 0) == 0


async def test_a_partition_no_longer_assigned_counts_none() -> None:
    revoked = StubConsumer(high=120, position=IllegalStateError("not assigned"))
    assert await member(revoked).backlog("t", 0) == 0


class HungGroup:
    """aiokafka's consumer while the group's coordinator is away: its offset commit and
    its read of committed offsets retry for as long as that lasts."""

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition("t", 0)}

    async def commit(self, offsets: object) -> None:
        await asyncio.Event().wait()

    async def committed(self, tp: TopicPartition) -> int:
        await asyncio.Event().wait()
        return 0


async def test_a_group_call_that_never_ends_is_cut_short(monkeypatch: pytest.MonkeyPatch) -> None:
    """The offset commit (it holds every partition's poll loop) and the take's read of
    the committed offsets end as `KafkaUnavailable`: retried, or a take's failed attempt."""
    monkeypatch.setattr(app.kafka.group_consumer, "GROUP_CALL_S", 0.05)
    group = GroupConsumer.__new__(GroupConsumer)
    group._consumer = HungGroup()
    with pytest.raises(KafkaUnavailable, match="no offset commit within"):
        await group.commit({("t", 0): 5})
    with pytest.raises(KafkaUnavailable, match="no committed offsets within"):
        await group.rewind([("t", 0)])
