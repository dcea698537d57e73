"""The memory log's consumer groups: Kafka's range assignor (partition p of every topic to
one member), eager rebalances, and an expelled member learning at its next poll."""

from __future__ import annotations

import pytest

from app.errors import KafkaUnavailable
from app.kafka.memory import MemoryLog
from app.kafka.memory_group import MemoryGroupMember
from app.kafka.records import TopicSpec

Key = tuple[str, int]


class Calls:
    def __init__(self) -> None:
        self.log: list[tuple[str, frozenset[Key]]] = []

    async def assigned(self, keys: set[Key]) -> None:
        self.log.append(("assigned", frozenset(keys)))

    async def revoked(self, keys: set[Key]) -> None:
        self.log.append(("revoked", frozenset(keys)))


def member(log: MemoryLog, calls: Calls) -> MemoryGroupMember:
    return log.group_member("g", ["a", "b"], on_assigned=calls.assigned, on_revoked=calls.revoked)


@pytest.fixture
def log() -> MemoryLog:
    return MemoryLog([TopicSpec("a", 3), TopicSpec("b", 3)])


async def test_members_share_partitions_by_range_with_co_partitioning(log: MemoryLog) -> None:
    one, two = Calls(), Calls()
    first, second = member(log, one), member(log, two)
    await first.start()
    assert first.assignment() == {(t, p) for t in "ab" for p in range(3)}
    await second.start()
    assert first.assignment() == {("a", 0), ("a", 1), ("b", 0), ("b", 1)}
    assert second.assignment() == {("a", 2), ("b", 2)}
    # Eager: the first member's whole assignment was revoked before the new one came.
    assert [kind for kind, _ in one.log] == ["revoked", "assigned", "revoked", "assigned"]
    assert one.log[2] == ("revoked", frozenset({(t, p) for t in "ab" for p in range(3)}))
    await second.stop()
    assert first.assignment() == {(t, p) for t in "ab" for p in range(3)}


async def test_an_expelled_member_is_not_told_until_it_polls(log: MemoryLog) -> None:
    one, two = Calls(), Calls()
    first, second = member(log, one), member(log, two)
    await first.start()
    await log.groups["g"].expel(first)
    await second.start()
    assert second.assignment() == {(t, p) for t in "ab" for p in range(3)}
    assert first.assignment(), "still thinks it owns its partitions"
    with pytest.raises(KafkaUnavailable):
        await first.commit({("a", 0): 1})
    await first.poll(timeout_ms=1)  # learns: joins again (its revoke names nothing)
    assert one.log[-2] == ("revoked", frozenset())
    assert first.assignment() and second.assignment()
    assert not first.assignment() & second.assignment()
