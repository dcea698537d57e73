"""A table's `cleanup.policy` or retention changed while the node runs (`kafka-configs
--alter`) was unseen until its next start, which refuses it; a restore meanwhile lost what
the retention deleted. The node reads the policy again every minute and stops on a table
that deletes rows, with the start's own message. A read that fails (the broker away, no
DescribeConfigs ACL, anything a client library raises) is one warning a check and is
tried again: it never stops the node. The same check judges the topics' replication again
(fewer replicas than configured, `min.insync.replicas` 1 on 3 or above them): a finding
that appears is one WARNING, one that clears one INFO, `/healthz` and the
`tickwheel_topic_replication_findings` gauge follow; a failed read clears nothing. On the
in-memory log, its waits on a fake clock."""

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
from app.kafka.records import Replication, TopicConfigs, TopicSpec
from app.kafka.replication import insync_fault, replica_shortfall
from app.kafka.topic_policy import policy_refusal
from app.node.topic_watch import CHECK_INTERVAL_S, ReadReplicas, ReplicationRead, TopicPolicyWatch

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
            "reading the configs of the node's topics failed (read again in 60 s): "
            "the broker is not reachable"
        ] * 3
        caplog.clear()
        log.down, log.describe_refused = False, "Topic authorization failed."  # an ACL
        await ticks.tick()
        await ticks.tick()
        assert refusals == [] and not task.done()
        assert [r.getMessage() for r in caplog.records] == [
            f"cannot read the configs of {TABLE}, {LOG} (read again in 60 s): "
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
        assert caplog.text.count("reading the configs of the node's topics failed") == 2
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


ASKED = Replication(3, 2)


def replicated_log() -> MemoryLog:
    """Three brokers, each topic on 3 with min.insync.replicas 2: nothing to say."""
    log = memory_log()
    log.brokers = 3
    for topic in (TABLE, LOG):
        log.replicas[topic] = 3
        log.configs[topic]["min.insync.replicas"] = "2"
    return log


@contextlib.asynccontextmanager
async def watching_replication(
    log: MemoryLog,
    counts: dict[str, int],
    start: dict[str, list[str]],
    replicas: ReadReplicas | None = None,
) -> AsyncIterator[tuple[Ticks, TopicPolicyWatch]]:
    ticks = Ticks()
    read = ReplicationRead(
        replicas or log.admin().replicas, [TABLE, LOG], ASKED, counts.__setitem__
    )
    watch = TopicPolicyWatch(
        log.admin().topic_configs,
        tables=[TABLE],
        logs=[LOG],
        refused=lambda why: None,
        replication=read,
        sleep=ticks.sleep,
    )
    watch.found_at_start(start)
    task = asyncio.create_task(watch.run())
    try:
        yield ticks, watch
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def said(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name != "asyncio"]


async def test_replication_findings_appear_and_clear_said_once_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log, counts = replicated_log(), dict[str, int]()
    log.replicas[TABLE] = 2
    short = replica_shortfall(TABLE, 2, ASKED)
    assert short is not None
    caplog.set_level(logging.INFO)
    async with watching_replication(log, counts, {TABLE: [short]}) as (ticks, watch):
        assert counts == {TABLE: 1, LOG: 0} and watch.findings == {TABLE: [short]}
        await ticks.tick()
        assert said(caplog) == []  # the start's, said already
        log.configs[LOG]["min.insync.replicas"] = "1"  # lowered while it runs
        await ticks.tick()
        await ticks.tick()
        lowered = insync_fault(LOG, 3, 1)
        assert said(caplog) == [("WARNING", lowered)]  # once, not every check
        assert watch.findings == {TABLE: [short], LOG: [lowered]}
        assert counts == {TABLE: 1, LOG: 1}
        caplog.clear()
        log.replicas[TABLE] = 3  # reassigned to the factor
        log.configs[LOG]["min.insync.replicas"] = "2"
        await ticks.tick()
        await ticks.tick()
        assert said(caplog) == [
            ("INFO", f"no longer so: topic {TABLE} has 2 replica(s), fewer than the 3 "
             "configured (TICKWHEEL_REPLICATION_FACTOR)"),
            ("INFO", f"no longer so: topic {LOG} has min.insync.replicas 1 with 3 replicas"),
        ]  # fmt: skip
        assert watch.findings == {} and counts == {TABLE: 0, LOG: 0}
        caplog.clear()
        log.replicas[LOG] = 1  # reassigned to fewer: 2 above its 1 replica too
        await ticks.tick()
        assert said(caplog) == [
            ("WARNING", replica_shortfall(LOG, 1, ASKED)),
            ("WARNING", insync_fault(LOG, 1, 2)),
        ]
        assert counts == {TABLE: 0, LOG: 2}


async def test_a_failed_read_keeps_the_replication_findings(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log, counts = replicated_log(), dict[str, int]()
    failing: list[Exception] = []

    async def replicas(topics: Sequence[str]) -> tuple[int, dict[str, int]]:
        if failing:
            raise failing[0]
        return await log.admin().replicas(topics)

    log.configs[LOG]["min.insync.replicas"] = "1"
    lowered = insync_fault(LOG, 3, 1)
    assert lowered is not None
    caplog.set_level(logging.INFO)
    async with watching_replication(log, counts, {LOG: [lowered]}, replicas) as (ticks, watch):
        log.configs[LOG]["min.insync.replicas"] = "2"  # fixed, but not read:
        log.down = True  # the broker away
        await ticks.tick()
        log.down, log.describe_refused = False, "Topic authorization failed."  # an ACL
        await ticks.tick()
        log.describe_refused = None
        failing.append(RuntimeError("the replicas not read"))
        await ticks.tick()
        assert said(caplog) == [
            ("WARNING", "reading the configs of the node's topics failed (read again in "
             "60 s): the broker is not reachable"),
            ("WARNING", f"cannot read the configs of {TABLE}, {LOG} (read again in 60 s): "
             "Topic authorization failed."),
            ("WARNING", "reading the replicas of the node's topics failed (read again in "
             "60 s): the replicas not read"),
        ]  # fmt: skip
        assert watch.findings == {LOG: [lowered]} and counts == {TABLE: 0, LOG: 1}
        failing.clear()  # read again: fixed
        await ticks.tick()
        assert watch.findings == {} and counts == {TABLE: 0, LOG: 0}
