"""The operators' admin calls on the `Admin` port (`app.kafka.ports`), as the functions
of `app.kafka.admin` and `app.kafka.group_admin` make them on an address: so that the
tools below the CLI (`app.ops`, `app.timers`) run on any `Clients`, Kafka's or the
in-memory log's.

A read-only tool creates no topic: `require_topics` asks which of the topics exist (a
request that creates none) and names every missing one, with why it may be missing.
"""

from __future__ import annotations

from collections.abc import Iterable

from app.errors import KafkaUnavailable, MissingTopic
from app.kafka.ports import Admin

__all__ = [
    "count_differs",
    "delete_records",
    "existing_topics",
    "missing_topics",
    "require_topic",
    "require_topics",
    "reset_group_offsets",
]


async def existing_topics(admin: Admin, names: Iterable[str]) -> dict[str, int]:
    """The partition counts of those of `names` the cluster has; creates none."""
    return await admin.existing_topics(names)


def missing_topics(where: str, topics: dict[str, str], found: Iterable[str]) -> MissingTopic | None:
    """The error naming each topic of `topics` (topic -> why it may be missing) not among
    `found`, at `where`; None when none is missing."""
    have = set(found)
    missing = [t for t in topics if t not in have]
    if not missing:
        return None
    said = "; ".join(f"topic {t} does not exist at {where}: {topics[t]}" for t in missing)
    return MissingTopic(
        f"{said} (nothing was created; is KAFKA_BOOTSTRAP_SERVERS or --bootstrap the cluster's?)"
    )


def count_differs(topic: str, have: int, expected: int) -> KafkaUnavailable:
    """The error of a command that writes to `topic` (or plans what it would write) with
    `expected` partitions where the topic has `have`: an instance's or a target's records
    would go to another partition than the one the workers read them in."""
    return KafkaUnavailable(
        f"topic {topic} has {have} partitions, expected {expected}: "
        "co-partitioned topics must all have the same count"
    )


async def require_topics(admin: Admin, topics: dict[str, str]) -> dict[str, int]:
    """The partition count of each topic of `topics` (topic -> why it may be missing);
    `MissingTopic` naming every one the cluster does not have. Creates nothing."""
    found = await existing_topics(admin, topics)
    error = missing_topics(admin.where(), topics, found)
    if error is not None:
        raise error
    return found


async def require_topic(admin: Admin, topic: str, why: str) -> int:
    """The partition count of `topic`; `MissingTopic` (saying `why` it may be missing) when
    the cluster does not have it. Creates nothing."""
    return (await require_topics(admin, {topic: why}))[topic]


async def delete_records(admin: Admin, topic: str, before: dict[int, int]) -> dict[int, int]:
    """Deletes the records of `topic` before `before[p]` in each partition p given; the
    new first offset per partition."""
    return await admin.delete_records(topic, before)


async def reset_group_offsets(
    admin: Admin, group_id: str, topic: str, partitions: int, offset: int = 0
) -> None:
    """Sets the group's committed offset of every partition of `topic` (the group must have
    no member)."""
    await admin.reset_group_offsets(group_id, topic, partitions, offset)
