"""Any end of the cluster status's publishing or of a follower ends `ClusterStatus.run`
loudly, a cancellation leaked out of a client call included (a `TaskGroup` passed over a
child ended cancelled: the publishing stopped for good, the run went on, and the node went
stale on every page while it said it was ready); the worker's run then stops the node."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka.errors import TopicAuthorizationFailedError
from fakes import PAGE_PARTITIONS, TYPE, FakeNode
from test_cluster_status import _Runs

from app.cli.worker import _run_node
from app.errors import KafkaUnavailable, NodeFailed
from app.kafka.memory import MemoryLog
from app.kafka.memory_clients import MemoryFollower, MemoryPublisher
from app.node.kept import node_topics
from app.ops.cluster_status import ClusterStatus
from app.protocol.topics import ContextTopics, parse_aggregate_type

TOPIC = ContextTopics("shop").nodes


async def _started() -> tuple[MemoryLog, ClusterStatus]:
    log = MemoryLog(node_topics([parse_aggregate_type(TYPE)], PAGE_PARTITIONS))
    status = ClusterStatus(log, log.publisher(), FakeNode(owned=[0]), "n1", interval_ms=200)
    await status.start()
    return log, status


def _leaking_send(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client's send raises a CancelledError nobody asked for (to the status topic)."""
    send = MemoryPublisher.send

    async def leaks(self: MemoryPublisher, topic: str, *args: Any, **kwargs: Any) -> int:
        if topic == TOPIC:
            raise asyncio.CancelledError  # leaked out of the client library
        return await send(self, topic, *args, **kwargs)

    monkeypatch.setattr(MemoryPublisher, "send", leaks)


async def test_a_cancellation_leaked_out_of_a_publish_ends_the_run_loudly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, status = await _started()
    before = status.published
    _leaking_send(monkeypatch)
    try:
        with pytest.raises(RuntimeError, match="publishing the node's status ended cancelled"):
            await asyncio.wait_for(status.run(), 5)
        assert status.published == before
    finally:
        monkeypatch.undo()
        await status.stop()


async def test_a_publishing_ended_by_a_leaked_cancellation_stops_the_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, status = await _started()
    node = _Runs()
    worker = asyncio.create_task(_run_node(node, status))  # type: ignore[arg-type]
    try:
        await asyncio.sleep(0.5)
        assert status.published >= 2  # it ran
        _leaking_send(monkeypatch)
        with pytest.raises(NodeFailed, match=r"publishing the node's status stopped: .*cancelled"):
            await asyncio.wait_for(worker, 5)
        assert node.cancelled
    finally:
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
        monkeypatch.undo()
        await status.stop()


async def _run_ends_when_polls_raise(
    monkeypatch: pytest.MonkeyPatch, raised: Callable[[], BaseException], said: str
) -> None:
    """The status's run, each follower poll raising `raised()`, ends with `said`."""
    _, status = await _started()

    async def poll(self: MemoryFollower, timeout_ms: int = 200) -> list[Any]:
        await asyncio.sleep(0.05)
        raise raised()

    monkeypatch.setattr(MemoryFollower, "poll", poll)
    try:
        with pytest.raises(RuntimeError, match=said):
            await asyncio.wait_for(status.run(), 5)
    finally:
        monkeypatch.undo()
        await status.stop()


async def test_a_cancellation_leaked_out_of_a_follower_ends_the_run_loudly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await _run_ends_when_polls_raise(
        monkeypatch, asyncio.CancelledError, f"following {TOPIC} ended cancelled"
    )


async def test_a_follower_that_returns_or_fails_ends_the_run_loudly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, status = await _started()

    async def returns(self: ClusterStatus, c: object) -> None:
        await asyncio.sleep(0.05)

    monkeypatch.setattr(ClusterStatus, "_follow", returns)
    with pytest.raises(RuntimeError, match=f"following {TOPIC} returned"):
        await asyncio.wait_for(status.run(), 5)

    async def fails(self: ClusterStatus, c: object) -> None:
        raise ValueError("a bug")

    monkeypatch.setattr(ClusterStatus, "_follow", fails)
    with pytest.raises(RuntimeError, match=f"following {TOPIC} failed: ValueError") as raised:
        await asyncio.wait_for(status.run(), 5)
    assert isinstance(raised.value.__cause__, ValueError)
    monkeypatch.undo()
    await status.stop()


async def test_a_run_cancelled_from_outside_stops_its_children_quietly() -> None:
    _, status = await _started()
    before = set(asyncio.all_tasks())
    run = asyncio.create_task(status.run())
    await asyncio.sleep(0.5)
    assert status.published >= 2
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert set(asyncio.all_tasks()) == before  # no child left running
    await status.stop()


async def test_a_cancellation_leaked_out_of_the_tombstones_send_is_no_stop_error(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    log, status = await _started()
    _leaking_send(monkeypatch)
    await status.stop()  # raises nothing, logs
    assert "tombstone in shop.nodes was not written: CancelledError" in caplog.text
    monkeypatch.undo()
    records = [r for r in log.records(TOPIC, 0) if r.key == b"n1"]
    assert records[-1].value is not None  # no tombstone written


async def test_a_follower_refused_its_topic_ends_the_run_loudly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An ACL of the node's own `<ctx>.nodes` taken away: it was retried for ever, a
    warning once, while the pages went stale; a refusal no retry passes ends the run."""

    def refusal() -> BaseException:
        exc = KafkaUnavailable("fetch refused")
        exc.__cause__ = TopicAuthorizationFailedError(TOPIC)
        return exc

    await _run_ends_when_polls_raise(
        monkeypatch, refusal, f"following {TOPIC} failed: KafkaUnavailable"
    )
