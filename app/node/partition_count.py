"""The partition count each aggregate type's tables were built with, kept beside its topics,
so that a node refuses to run a type whose topics were given another count since.

An aggregate's partition is murmur2 of its id modulo the count. Partitions added to every
topic, and `TICKWHEEL_PARTITIONS` raised with them, move most aggregates to another
partition while their events, timer rows and states stay where the old count put them;
every topic has the count the node is told, so its check of the topics passes. Run so, a
moved aggregate's timers would fire from its old partition, which its cancels no longer
reach, its new events would make a second timer beside them, and its state would start
afresh in the new one.

The count is a record per type on its context's `<context>.nodes` topic (one partition,
compacted, the cluster's status), under the reserved key `tickwheel.partitions/<type>`:
no node's key (a node's id ends in its pid), skipped by the status readers
(`app.ops.status_view`). A node's start writes it for each type it runs that has none
(its first start, an older version's topics, or a rebuild) and refuses a type whose record
holds another count (`check_built_with`); `tickwheel rebuild` writes the count it rebuilt
the tables with (`app.ops.rebuild`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from contextlib import aclosing
from typing import Final

import orjson

from app.errors import ConfigError
from app.kafka.ports import LogReader, Publisher
from app.protocol.topics import AggregateTopics, ContextTopics

__all__ = [
    "KEY_PREFIX",
    "built_with",
    "check_built_with",
    "count_key",
    "decode_count",
    "encode_count",
    "keep_partition_count",
    "read_counts",
    "write_counts",
]

logger = logging.getLogger(__name__)

KEY_PREFIX: Final = b"tickwheel.partitions/"
"""The keys of `<context>.nodes` that hold a type's partition count (the type's name
follows); no node report is under one."""


def count_key(type_name: str) -> bytes:
    return KEY_PREFIX + type_name.encode()


def encode_count(partitions: int, at: int) -> bytes:
    return orjson.dumps({"partitions": partitions, "at": at})


def decode_count(value: bytes) -> int | None:
    """The count a record holds; None when it holds none (another producer's bytes)."""
    try:
        held = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    n = held.get("partitions") if isinstance(held, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else None


def built_with(records: Iterable[tuple[bytes | None, bytes | None]]) -> dict[str, int | None]:
    """Each type's count as the records of a `<context>.nodes` topic (key, value), in
    their order, leave it: the newest record of its key; None when that record holds no
    count. A type whose newest record is a tombstone, or that has none, is not in it."""
    held: dict[str, int | None] = {}
    for key, value in records:
        if key is None or not key.startswith(KEY_PREFIX):
            continue
        name = key[len(KEY_PREFIX) :].decode(errors="replace")
        if value is None:
            held.pop(name, None)
        else:
            held[name] = decode_count(value)
    return held


def check_built_with(
    held: Mapping[str, int | None], types: Sequence[AggregateTopics], partitions: int
) -> list[AggregateTopics]:
    """The types whose count is to be written (none held, or one that is no count);
    `ConfigError` naming every type whose tables were built with another count than
    `partitions`, the old and new counts, and what to do."""
    unmarked, changed = [], []
    for t in types:
        n = held.get(t.type_name)
        if n is None:
            unmarked.append(t)
        elif n != partitions:
            changed.append((t, n))
    if changed:
        said = "; ".join(
            f"{t.type_name}'s tables were built with {n} partitions" for t, n in changed
        )
        names = " ".join(f"--type {t.type_name}" for t, _ in changed)
        raise ConfigError(
            f"{said}, and the topics now have {partitions} (TICKWHEEL_PARTITIONS): "
            "partitions were added to them. An aggregate's partition is murmur2 of "
            "its id over the count, so most aggregates now belong to another partition "
            "than the one their events, timers and states are in, and the node will not "
            "run them so. Stop every worker and rebuild the timer tables from the log "
            f'(`tickwheel rebuild {names}`, docs/operations.md "Rebuilding a timer '
            'table"), which records the new count; the events written before the change '
            "stay in their old partitions and are dead-lettered by the replay, so the "
            "aggregates that moved lose their earlier timers and state (docs/operations.md "
            '"Scaling")'
        )
    return unmarked


async def read_counts(reader: LogReader, context: str) -> dict[str, int | None]:
    """`built_with` of `context`'s `<context>.nodes` as the broker holds it now."""
    topic = ContextTopics(context).nodes
    begin, _ = await reader.offsets(topic, 0)
    records: list[tuple[bytes | None, bytes | None]] = []
    async with aclosing(reader.read(topic, 0, begin)) as batches:
        async for batch in batches:
            records += ((r.key, r.value) for r in batch if r.key and r.key.startswith(KEY_PREFIX))
    return built_with(records)


async def write_counts(
    publisher: Publisher, types: Sequence[AggregateTopics], partitions: int, at: int
) -> None:
    """Records `partitions` as the count the tables of `types` are built with."""
    await publisher.send_many(
        [
            (
                ContextTopics(t.context).nodes,
                0,
                count_key(t.type_name),
                encode_count(partitions, at),
            )
            for t in types
        ]
    )


async def keep_partition_count(
    reader: LogReader,
    publisher: Publisher,
    types: Sequence[AggregateTopics],
    partitions: int,
    now: int,
) -> None:
    """At a node's start, before any table is opened: `ConfigError` when a type's tables
    were built with another count than `partitions` (`check_built_with`), and the count
    written for the types that have none."""
    held: dict[str, int | None] = {}
    for ctx in sorted({t.context for t in types}):
        held |= await read_counts(reader, ctx)
    for name in sorted(t.type_name for t in types if t.type_name in held):
        if held[name] is None:
            logger.warning(
                "the partition count of %s on its context's nodes topic is unreadable: "
                "written again as %d",
                name,
                partitions,
            )
    unmarked = check_built_with(held, types, partitions)
    if unmarked:
        await write_counts(publisher, unmarked, partitions, now)
        logger.info(
            "the tables of %s are built with %d partitions (recorded on the nodes topic)",
            ", ".join(t.type_name for t in unmarked),
            partitions,
        )
