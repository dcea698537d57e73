"""Partitions added while a node runs to one of its topics the group does not assign (the
context's failure ledger, results, nodes): its next start refuses the topic, and until
then nothing said it. The node's minute check reads the topics' partition counts after
their configs: one not the node's is one WARNING, and said in `/healthz`'s `topics` while
it lasts. On the in-memory log, the watch's waits on a fake clock."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import replace
from pathlib import Path

import pytest
from fakes import RunningNode, wait_until
from test_node_memory import PARTITIONS, SERVICE, TOPICS
from test_topic_watch import Ticks

from app.errors import NodeFailed
from app.kafka.memory import MemoryLog
from app.protocol.topics import ContextTopics


async def watched(log: MemoryLog, tmp_path: Path) -> tuple[RunningNode, Ticks]:
    """A node on `log`, running, whose minute checks of its topics run at each `tick`."""
    node = RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS)
    ticks = Ticks()
    node.node.topic_watch.sleep = ticks.sleep
    await node.start()
    try:
        await wait_until(node.runs)
    except BaseException:
        await node.stop()
        raise
    return node, ticks


async def test_a_ledger_grown_while_the_node_runs_is_said_once_and_in_healthz(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = ContextTopics(TOPICS.context).ledger
    log = MemoryLog()
    node, ticks = await watched(log, tmp_path)
    try:
        await ticks.tick()
        before = node.node.health().get("topics", {})  # the replication's findings alone
        caplog.set_level(logging.WARNING, logger="app.node.topic_watch")
        await log.add_partitions([ledger], PARTITIONS)
        await ticks.tick()
        await ticks.tick()  # said once, not at every check
        said = [r.getMessage() for r in caplog.records if r.name == "app.node.topic_watch"]
        assert len(said) == 1, said
        [finding] = said
        assert finding.startswith(f"topic {ledger} has 4 partitions, the node's 2: ")
        assert "its next start refuses the topic" in finding
        assert node.node.health()["topics"] == before | {ledger: [*before.get(ledger, ()), finding]}
        assert node.task is not None and not node.task.done()  # it runs on, less safely
    finally:
        await node.stop()


async def test_a_topic_deleted_while_the_node_runs_stops_it_at_the_second_check(
    tmp_path: Path,
) -> None:
    """The dead-letter topic deleted (and not made again): every partition writing a letter
    failed its commit and was taken afresh, for good, while the rest went on. Missing at
    two checks in a row, it stops the node, loudly; its next start makes the topic."""
    letters = ContextTopics(TOPICS.context).dead_letters
    log = MemoryLog()
    node, ticks = await watched(log, tmp_path)
    try:
        await ticks.tick()
        del log._topics[letters]  # kafka-topics --delete
        await ticks.tick()
        assert node.task is not None and not node.task.done()  # once: a listing mid-change
        await ticks.tick()
        await wait_until(lambda: node.task is not None and node.task.done())
        with pytest.raises(NodeFailed, match=f"topic\\(s\\) {letters} of the node's were deleted"):
            await node.task
    finally:
        with contextlib.suppress(NodeFailed):
            await node.stop()


async def test_missing_at_two_checks_not_in_a_row_does_not_stop_the_node(tmp_path: Path) -> None:
    """Missing, listed again, missing: not two checks in a row (a listing that flaps)."""
    letters = ContextTopics(TOPICS.context).dead_letters
    log = MemoryLog()
    names = log.admin().topic_names
    flaps = iter([True, False, True])

    async def listing() -> set[str]:
        listed = await names()
        return listed - {letters} if next(flaps, False) else listed

    node, ticks = await watched(log, tmp_path)
    try:
        counts = node.node.topic_watch.counts
        assert counts is not None
        node.node.topic_watch.counts = replace(counts, listed=listing)
        for _ in range(3):
            await ticks.tick()
        assert node.task is not None and not node.task.done()
    finally:
        await node.stop()
