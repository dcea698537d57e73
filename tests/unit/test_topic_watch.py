"""A table's `cleanup.policy` or retention changed while the node runs (`kafka-configs
--alter`) was unseen until its next start, which refuses it; a restore meanwhile lost what
the retention deleted. The node reads the policy again every minute and stops on a table
that deletes rows, with the start's own message. A read that fails (the broker away, no
DescribeConfigs ACL, anything a client library raises) is one warning a check and is
tried again: it never stops the node. On the in-memory log, its waits on a fake clock."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from fakes import RunningNode, wait_until
from test_node_memory import PARTITIONS, SERVICE, TOPICS

from app.errors import NodeFailed
from app.kafka.memory import MemoryLog
from app.kafka.records import TopicConfigs, TopicSpec
from app.kafka.topic_policy import policy_refusal
from app.node.topic_watch import CHECK_INTERVAL_S, TopicPolicyWatch

TABLE, LOG = "ctx.a.timers", "ctx.a.events"
DELETING = {"cleanup.policy": "delete"}
SHORT_RETENTION = {"retention.ms": "604800000"}  # kept compact,delete: deletes after 7 days


class Ticks:
    """The watch's waits on a fake clock: each ends when the test ticks it."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []
        self._waiting = asyncio.Event()
        self._release: asyncio.Future[None] | None = None

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self._release = asyncio.get_running_loop().create_future()
        self._waiting.set()
        await self._release
        self.now += seconds

    async def tick(self) -> None:
        """Ends the wait under way; returns once the check after it is done (the watch
        waits again)."""
        await asyncio.wait_for(self._waiting.wait(), 5)
        self._waiting.clear()
        assert self._release is not None
        self._release.set_result(None)
        await asyncio.wait_for(self._waiting.wait(), 5)


def memory_log() -> MemoryLog:
    return MemoryLog([TopicSpec(TABLE, 2, compacted=True), TopicSpec(LOG, 2, retained=True)])


@contextlib.asynccontextmanager
async def watching(
    log: MemoryLog, refusals: list[str]
) -> AsyncIterator[tuple[Ticks, asyncio.Task[None]]]:
    ticks = Ticks()
    watch = TopicPolicyWatch(
        log.admin().topic_configs,
        tables=[TABLE],
        logs=[LOG],
        refused=refusals.append,
        sleep=ticks.sleep,
    )
    task = asyncio.create_task(watch.run())
    try:
        yield ticks, task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.mark.parametrize("change", [DELETING, SHORT_RETENTION])
async def test_a_table_changed_to_delete_rows_is_refused_with_the_starts_message(
    change: dict[str, str],
) -> None:
    log, refusals = memory_log(), list[str]()
    async with watching(log, refusals) as (ticks, task):
        await ticks.tick()
        assert refusals == []  # as the node made it: compact,delete, nothing retained
        log.configs[TABLE] |= change
        await ticks.tick()
        assert refusals == [policy_refusal(TABLE, log.configs[TABLE])]
        assert (
            "kafka-configs --alter --entity-type topics --entity-name ctx.a.timers" in (refusals[0])
        )
        await ticks.tick()  # said at each check while it lasts
        assert len(refusals) == 2 and not task.done()
    assert ticks.slept[:3] == [CHECK_INTERVAL_S] * 3 and ticks.now == 3 * CHECK_INTERVAL_S


async def test_a_failed_read_is_one_warning_a_check_and_read_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log, refusals = memory_log(), list[str]()
    caplog.set_level(logging.WARNING, logger="app.node.topic_watch")
    async with watching(log, refusals) as (ticks, task):
        log.down = True  # the broker away
        log.configs[TABLE] |= DELETING
        for _ in range(3):
            await ticks.tick()
        assert [r.getMessage() for r in caplog.records] == [
            "reading the cleanup.policy of the node's topics failed (read again in 60 s): "
            "the broker is not reachable"
        ] * 3
        caplog.clear()
        log.down, log.describe_refused = False, "Topic authorization failed."  # an ACL
        await ticks.tick()
        await ticks.tick()
        assert refusals == [] and not task.done()
        assert [r.getMessage() for r in caplog.records] == [
            f"cannot read the cleanup.policy of {TABLE}, {LOG} (read again in 60 s): "
            "Topic authorization failed."
        ] * 2
        log.describe_refused = None  # read again: the table deletes
        await ticks.tick()
        assert refusals == [policy_refusal(TABLE, log.configs[TABLE])]


@pytest.mark.parametrize("raised", [asyncio.CancelledError(), RuntimeError("a bug inside")])
async def test_whatever_a_read_raises_never_ends_the_watch(
    raised: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    async def read(topics: Sequence[str], names: Sequence[str]) -> TopicConfigs:
        raise raised

    ticks, refusals = Ticks(), list[str]()
    watch = TopicPolicyWatch(read, tables=[TABLE], refused=refusals.append, sleep=ticks.sleep)
    task = asyncio.create_task(watch.run())
    try:
        await ticks.tick()
        await ticks.tick()
        assert not task.done() and refusals == []
        assert caplog.text.count("reading the cleanup.policy of the node's topics failed") == 2
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert task.cancelled()  # its own cancellation still ends it


async def test_a_log_that_drops_records_is_warned_about_once_each_change(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log, refusals = memory_log(), list[str]()
    async with watching(log, refusals) as (ticks, _):
        log.configs[LOG] |= SHORT_RETENTION
        await ticks.tick()
        await ticks.tick()
        assert caplog.text.count(f"the log {LOG} has cleanup.policy=delete") == 1
        log.configs[LOG] |= {"retention.ms": "-1"}
        await ticks.tick()
        log.configs[LOG] |= SHORT_RETENTION
        await ticks.tick()
        assert caplog.text.count(f"the log {LOG} has cleanup.policy=delete") == 2
        assert refusals == []  # the aggregates' log is its team's: never refused


async def test_a_running_node_stops_on_its_changelog_changed_to_delete(tmp_path: Path) -> None:
    log = MemoryLog()
    node = RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS)
    ticks = Ticks()
    node.node.topic_watch.sleep = ticks.sleep
    await node.start()
    try:
        await wait_until(node.runs)
        await ticks.tick()
        assert node.task is not None and not node.task.done()
        log.configs[TOPICS.timers_changelog] |= DELETING
        await ticks.tick()
        with pytest.raises(NodeFailed) as failed:
            await asyncio.wait_for(node.task, 5)
        why = policy_refusal(TOPICS.timers_changelog, log.configs[TOPICS.timers_changelog])
        assert str(failed.value) == why
        h = node.node.health()
        assert h["ready"] is False and h["failed"] == why
    finally:
        node.task = None  # its end read: `stop` stops the node alone
        await node.stop()
