"""The cluster refusing the node's new connections mid-run (its SASL credentials rotated,
its certificate expired): connections already open go on, so only a partition taken
afresh meets it, and aiokafka's clients say only "Unable to bootstrap". The take asks
the cluster (`check_access`) and the node stops at once, saying why, instead of trying
the take ten times and stopping on a message that names neither."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fakes import RunningNode, wait_until
from test_commit_failing import BAD, OWNER
from test_node_memory import PARTITIONS, SERVICE, schedule
from test_node_topic_changes import failure_of

from app.errors import KafkaUnavailable
from app.kafka.memory import MemoryLog
from app.kafka.memory_clients import MemoryWriter


async def test_a_take_the_cluster_no_longer_lets_in_stops_the_node_saying_why(
    tmp_path: Path,
) -> None:
    log = MemoryLog()
    node = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(node.runs)
        log.login_refused = "SASL authentication failed for user alice"
        failed: list[str] = []

        async def once(tid: str) -> None:  # p's commit fails once: p is taken afresh
            if tid.endswith(f".{BAD}") and not failed:
                failed.append(tid)
                raise KafkaUnavailable(f"{tid}: the transaction timed out")

        log.before_commit = once
        await schedule(log, OWNER, int(time.time() * 1000) + 3_600_000)
        said = await failure_of(node)
        assert f"partition {BAD} of mem.counter could not be taken" in said
        assert "the cluster refuses this node's connections" in said
        assert "SASL authentication failed for user alice" in said
    finally:
        await node.stop()


async def test_a_take_failing_while_the_cluster_lets_the_node_in_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start that fails for another reason (a coordinator away a moment) while the
    cluster lets the node in is no refusal: the take is tried again, and p runs."""
    log = MemoryLog()
    node = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(node.runs)
        events: list[str] = []
        start = MemoryWriter.start

        async def start_failing_once(writer: MemoryWriter) -> None:
            if writer.transactional_id.endswith(f".{BAD}") and "start failed" not in events:
                events.append("start failed")
                raise KafkaUnavailable("cannot connect: Unable to bootstrap from memory")
            await start(writer)

        async def once(tid: str) -> None:  # p's commit fails once: p is taken afresh
            if tid.endswith(f".{BAD}") and not events:
                events.append("commit failed")
                monkeypatch.setattr(MemoryWriter, "start", start_failing_once)
                raise KafkaUnavailable(f"{tid}: the transaction timed out")

        log.before_commit = once
        await schedule(log, OWNER, int(time.time() * 1000) + 3_600_000)
        await wait_until(lambda: len(events) == 2 and node.runs(), within=10)
        assert "failed" not in node.node.health()
    finally:
        await node.stop()
