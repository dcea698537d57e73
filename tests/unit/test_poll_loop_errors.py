"""What the node's consumer loop does with an error of its group: retried while it may
pass (the broker or the group in flux), the node stopped, loudly, when no retry passes it
(an ACL, or a join the group turns down for good): never a node owning nothing for ever
while `/healthz` says ready."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any, cast

import pytest
from aiokafka.errors import (
    CorruptRecordException,
    GroupAuthorizationFailedError,
    InconsistentGroupProtocolError,
    InvalidSessionTimeoutError,
    KafkaConnectionError,
)
from fakes import RunningNode, wait_until
from fakes_poll import NoOffsets
from test_node_memory import PARTITIONS, SERVICE

from app.errors import KafkaUnavailable, NodeFailed
from app.kafka.memory import MemoryLog
from app.kafka.memory_group import MemoryGroupMember
from app.kafka.ports import GroupMember
from app.node import polling
from app.node.polling import poll_loop


class Failing:
    """A group member whose polls raise `cause` (wrapped as the adapter wraps it)."""

    def __init__(self, cause: BaseException) -> None:
        self.cause = cause
        self.polls = 0

    def assignment(self) -> set[tuple[str, int]]:
        return set()

    def pause(self, partitions: Any) -> None:
        pass

    def resume(self, partitions: Any) -> None:
        pass

    async def poll(self, timeout_ms: int = 500) -> dict[tuple[str, int], list[Any]]:
        self.polls += 1
        raise KafkaUnavailable(f"poll failed: {self.cause!r}") from self.cause

    async def commit(self, offsets: dict[tuple[str, int], int]) -> None:
        pass


@pytest.mark.parametrize(
    ("cause", "said"),
    [
        (InvalidSessionTimeoutError(), "turned the node's join down"),
        (InconsistentGroupProtocolError(), "turned the node's join down"),
        (GroupAuthorizationFailedError("g"), "was refused"),
    ],
    ids=["session-timeout", "protocol", "acl"],
)
async def test_an_error_no_retry_passes_stops_the_node(cause: BaseException, said: str) -> None:
    consumer, failed = Failing(cause), list[str]()
    await asyncio.wait_for(
        poll_loop(cast(GroupMember, consumer), {}, NoOffsets(), failed.append, {}), 2
    )
    [why] = failed
    assert said in why and consumer.polls == 1


async def test_the_group_in_flux_is_retried() -> None:
    consumer, failed = Failing(KafkaConnectionError()), list[str]()
    loop = asyncio.create_task(
        poll_loop(cast(GroupMember, consumer), {}, NoOffsets(), failed.append, {})
    )
    await asyncio.sleep(1.2)
    assert not loop.done() and failed == [] and consumer.polls == 2
    loop.cancel()
    await asyncio.gather(loop, return_exceptions=True)


async def test_polls_failing_for_good_stop_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch corrupt on a broker's disk fails every poll that fetches it: past
    `POLL_FAILING_S` of them, none passing, the node stops, loudly, saying why (it read
    nothing, and said it was ready; found by a failure-path hunt)."""
    monkeypatch.setattr(polling, "POLL_RETRY_S", 0.01)
    monkeypatch.setattr(polling, "POLL_FAILING_S", 0.2)
    consumer, failed = Failing(CorruptRecordException("Invalid CRC")), list[str]()
    await asyncio.wait_for(
        poll_loop(cast(GroupMember, consumer), {}, NoOffsets(), failed.append, {}), 5
    )
    [why] = failed
    assert "polls failed for" in why and "Invalid CRC" in why and consumer.polls > 2


async def test_the_nodes_run_ends_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The poll loop returns after telling the node why: its run raises that, not
    'the reader returned' (the worker's last words say what an operator must fix)."""
    log = MemoryLog()
    node = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()

    async def refused(self: MemoryGroupMember, timeout_ms: int = 500) -> None:
        cause = GroupAuthorizationFailedError("g")
        raise KafkaUnavailable(f"poll failed: {cause!r}") from cause

    try:
        await wait_until(node.runs)
        monkeypatch.setattr(MemoryGroupMember, "poll", refused)
        assert node.task is not None
        with pytest.raises(NodeFailed, match="the group consumer was refused"):
            await asyncio.wait_for(node.task, 5)
    finally:
        monkeypatch.undo()
        with contextlib.suppress(NodeFailed):
            await node.stop()
