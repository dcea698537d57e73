"""The readers a node's sends and parks depend on (the results reader, the failure ledger's
follower) retry what passes by itself, but a refusal (a Read ACL missing) stops the node,
loudly: retried for ever, every remote send would wait out its timeout and park while
`/healthz` said ready."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
from aiokafka.errors import TopicAuthorizationFailedError
from fakes import RunningNode, wait_until
from test_node_memory import PARTITIONS, SERVICE

from app.errors import KafkaUnavailable, NodeFailed
from app.kafka.memory import MemoryLog
from app.kafka.memory_clients import MemoryFollower
from app.protocol.topics import ContextTopics


@pytest.mark.parametrize(
    "topic", [ContextTopics("mem").results, ContextTopics("mem").ledger], ids=["results", "ledger"]
)
@pytest.mark.parametrize("refusal", [True, False], ids=["refused", "unavailable"])
async def test_a_follower_refused_stops_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, topic: str, refusal: bool
) -> None:
    log = MemoryLog()
    node = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    polled: list[str] = []
    poll = MemoryFollower.poll

    async def denied(self: MemoryFollower, timeout_ms: int = 200) -> list[object]:
        if self.topic == topic:
            polled.append(self.topic)
            cause = TopicAuthorizationFailedError(topic) if refusal else OSError("reset")
            raise KafkaUnavailable(f"reading {topic} failed") from cause
        return await poll(self, timeout_ms)  # type: ignore[return-value]

    try:
        await wait_until(node.runs)
        monkeypatch.setattr(MemoryFollower, "poll", denied)
        if refusal:
            await wait_until(lambda: "failed" in node.node.health(), within=5)
            assert f"reading {topic} failed" in str(node.node.health()["failed"])
        else:
            # Retried (once a second), the node going on.
            await wait_until(lambda: len(polled) >= 2, within=5)
            assert "failed" not in node.node.health()
    finally:
        monkeypatch.undo()
        with contextlib.suppress(NodeFailed):
            await node.stop()


async def test_a_follower_cancelled_from_inside_stops_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancellation leaking out of a client library ends the results reader: the node
    stops loudly (its run raises), not a run that returns and a worker that exits 0."""
    log = MemoryLog()
    node = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    results = ContextTopics("mem").results
    poll = MemoryFollower.poll

    async def cancelled(self: MemoryFollower, timeout_ms: int = 200) -> list[object]:
        if self.topic == results:
            raise asyncio.CancelledError
        return await poll(self, timeout_ms)  # type: ignore[return-value]

    try:
        await wait_until(node.runs)
        monkeypatch.setattr(MemoryFollower, "poll", cancelled)
        assert node.task is not None
        with pytest.raises(NodeFailed, match="the results reader of mem ended cancelled"):
            await asyncio.wait_for(node.task, 5)
    finally:
        monkeypatch.undo()
        with contextlib.suppress(NodeFailed):
            await node.stop()
