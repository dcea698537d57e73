"""Partitions added to every topic, and `TICKWHEEL_PARTITIONS` raised with them: a node's
start refuses to run the tables built with the old count (`app.node.partition_count`),
naming both counts and the rebuild; a rebuild records the new count, and the next start
runs. The count is a record of `<context>.nodes`, which the status readers skip."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import RunningNode, running
from test_node_memory import SERVICE, TOPICS

from app.errors import ConfigError
from app.kafka.memory import MemoryLog
from app.node import node_topics
from app.node.partition_count import (
    KEY_PREFIX,
    built_with,
    check_built_with,
    encode_count,
    keep_partition_count,
)
from app.ops.rebuild import rebuild
from app.ops.status_view import StatusView
from app.protocol.topics import AggregateTopics, ContextTopics

NODES = ContextTopics(TOPICS.context).nodes
KEY = KEY_PREFIX + TOPICS.type_name.encode()
OTHER = AggregateTopics(TOPICS.context, "other")


def test_the_newest_record_of_a_types_key_holds_its_count() -> None:
    other = KEY_PREFIX + OTHER.type_name.encode()
    records = [
        (b"node-a (pid 1)", b"{}"),
        (KEY, encode_count(2, 1)),
        (other, encode_count(2, 1)),
        (KEY, encode_count(4, 2)),
        (other, None),  # a tombstone: none held
        (KEY_PREFIX + b"shop.x", b"not json"),
        (None, b"keyless"),
    ]
    assert built_with(records) == {TOPICS.type_name: 4, "shop.x": None}


def test_a_type_built_with_another_count_is_refused_naming_both_and_the_rebuild() -> None:
    held = {TOPICS.type_name: 2, OTHER.type_name: 4}
    assert check_built_with({TOPICS.type_name: 2}, [TOPICS], 2) == []
    with pytest.raises(ConfigError) as refused:
        check_built_with(held, [TOPICS, OTHER], 4)
    said = str(refused.value)
    assert f"{TOPICS.type_name}'s tables were built with 2 partitions" in said
    assert "the topics now have 4 (TICKWHEEL_PARTITIONS)" in said
    assert f"tickwheel rebuild --type {TOPICS.type_name}`" in said
    assert "Rebuilding a timer table" in said and OTHER.type_name not in said


def test_a_type_with_no_count_or_an_unreadable_one_is_to_be_written() -> None:
    held: dict[str, int | None] = {OTHER.type_name: None}
    assert check_built_with(held, [TOPICS, OTHER], 3) == [TOPICS, OTHER]


async def test_a_start_writes_the_count_once_and_refuses_another() -> None:
    log = MemoryLog()
    log.ensure_topics(node_topics([TOPICS], 2))
    for _ in range(2):
        await keep_partition_count(log.reader(), log.publisher(), [TOPICS], 2, 5)
    assert [(r.key, r.value) for r in log.records(NODES, 0)] == [(KEY, encode_count(2, 5))]
    with pytest.raises(ConfigError, match="built with 2 partitions"):
        await keep_partition_count(log.reader(), log.publisher(), [TOPICS], 4, 6)
    assert len(log.records(NODES, 0)) == 1, "a refusal writes nothing"


def test_the_status_view_skips_a_count_without_calling_it_bad() -> None:
    view = StatusView("g", 2, lambda: 0)
    assert not view.apply(NODES, KEY, 0, encode_count(2, 0))
    assert view.bad == 0 and view.silent(10**15) == []


def partitioned(partitions: int) -> list[str]:
    """The node's topics that have the partition count (not the one-partition ones)."""
    return [s.name for s in node_topics([TOPICS], partitions) if s.partitions == partitions]


async def test_a_node_refuses_tables_built_with_fewer_partitions_until_a_rebuild(
    tmp_path: Path,
) -> None:
    log = MemoryLog()
    async with running(RunningNode(log, tmp_path, "a", SERVICE, 2)):
        pass
    # Every partitioned topic given two more, and the count raised with them; a node on a
    # fresh disk (its old copies, which say 2 partitions, are not there to refuse).
    await log.add_partitions(partitioned(2), 2)
    refused = RunningNode(log, tmp_path, "b", SERVICE, 4)
    with pytest.raises(ConfigError) as error:
        await refused.start()
    await refused.stop()
    assert f"{TOPICS.type_name}'s tables were built with 2 partitions" in str(error.value)
    assert "now have 4" in str(error.value)
    assert not refused.node.types, "no table opened"
    # The rebuild the error names records the new count: the next start runs.
    await rebuild(log, "g", [TOPICS])
    async with running(RunningNode(log, tmp_path, "c", SERVICE, 4)):
        pass
