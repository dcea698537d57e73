"""The topics a node finds are compared at its start with the configured replication: one
with fewer replicas (created while a broker was down, capped to the live ones for good,
or made beforehand) is a WARNING naming it, its count, the configured one and
kafka-reassign-partitions; a `min.insync.replicas` of 1 on 3 replicas or more, or above
the replicas (every write fails), too. `/healthz` says them as `topics`, and a running
node reads them again every minute (its topic watch), saying what appears or clears. On the
in-memory log, whose brokers and replicas a test sets."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from fakes import RunningNode, wait_until
from test_node_memory import PARTITIONS, SERVICE, TOPICS
from test_topic_watch import Ticks

from app.kafka.memory import MemoryLog
from app.kafka.records import Replication, TopicSpec
from app.kafka.replication import check_replication, insync_fault, replica_shortfall

ASKED = Replication(3, 2)
A, B, C = "ctx.a.timers", "ctx.a.events", "ctx.a.commands"


@pytest.mark.parametrize(("replicas", "short"), [(1, True), (2, True), (3, False), (4, False)])
def test_fewer_replicas_than_configured_are_said_with_the_fix(replicas: int, short: bool) -> None:
    why = replica_shortfall(A, replicas, ASKED)
    assert (why is not None) is short
    if why is not None:
        assert f"topic {A} has {replicas} replica(s), fewer than the 3 configured" in why
        assert "kafka-reassign-partitions" in why


@pytest.mark.parametrize(
    ("replicas", "min_insync", "said"),
    [
        (3, 1, "lost with that broker"),
        (5, 1, "lost with that broker"),
        (2, 1, None),  # two replicas: 2 would stop writes while either is down
        (1, 1, None),
        (3, 2, None),
        (3, 3, None),
        (2, 3, "every write to it fails"),
        (1, 2, "every write to it fails"),
    ],
)
def test_min_insync_replicas_of_one_on_three_or_above_the_replicas_is_said(
    replicas: int, min_insync: int, said: str | None
) -> None:
    why = insync_fault(A, replicas, min_insync)
    assert (why is None) is (said is None)
    if why is not None and said is not None:
        assert said in why and f"--entity-name {A} --add-config min.insync.replicas=" in why


def log_of(brokers: int, replicas: dict[str, int], min_insync: str = "2") -> MemoryLog:
    log = MemoryLog([TopicSpec(t, 2) for t in (A, B, C)])
    log.brokers, log.replicas = brokers, replicas
    for t in (A, B, C):  # as a node makes them on that many brokers
        log.configs[t]["min.insync.replicas"] = min_insync
    return log


async def test_each_topic_short_of_replicas_is_warned_about_and_returned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = log_of(3, {A: 2, B: 3, C: 3})
    log.configs[B]["min.insync.replicas"] = "1"  # the broker's default, say
    caplog.set_level(logging.WARNING, logger="app.kafka.replication")
    found = await check_replication(log.admin(), [A, B, C, "ctx.a.missing"], ASKED)
    assert found == {
        A: [replica_shortfall(A, 2, ASKED)],
        B: [insync_fault(B, 3, 1)],
    }
    assert [r.getMessage() for r in caplog.records] == [*found[A], *found[B]]


async def test_min_insync_above_the_replicas_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = log_of(3, {A: 3, B: 3, C: 3})
    log.configs[C]["min.insync.replicas"] = "4"
    found = await check_replication(log.admin(), [A, B, C], ASKED)
    assert list(found) == [C] and "every write to it fails" in found[C][0]
    assert "min.insync.replicas 4, more than its 3 replica(s)" in caplog.text


async def test_on_fewer_brokers_than_configured_the_topics_are_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = log_of(1, {}, "1")  # one broker: every topic made with one replica
    caplog.set_level(logging.WARNING, logger="app.kafka.replication")
    found = await check_replication(log.admin(), [A, B, C], ASKED)
    assert list(found) == [A, B, C]
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith(
        f"3 topic(s) have fewer replicas than the 3 configured (TICKWHEEL_REPLICATION_FACTOR), "
        f"as many as the cluster's 1 live broker(s): {A}, {B}, {C}"
    )
    assert "kafka-reassign-partitions" in line


async def test_a_cluster_that_does_not_answer_is_a_warning_and_nothing_found(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = log_of(3, {A: 1})
    log.down = True
    assert await check_replication(log.admin(), [A], ASKED) == {}
    assert "cannot read the replication of the node's topics" in caplog.text


async def test_the_node_says_a_short_changelog_in_healthz_and_runs(tmp_path: Path) -> None:
    log = MemoryLog()
    log.brokers = 3
    log.replicas[TOPICS.timers_changelog] = 2
    node = RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS)
    await node.start()
    try:
        # Every other topic is made with one replica here (the memory log's); it runs.
        await wait_until(node.runs)
        topics = node.node.health()["topics"]
        assert topics[TOPICS.timers_changelog] == [
            replica_shortfall(TOPICS.timers_changelog, 2, Replication(3, 2))
        ]
    finally:
        await node.stop()


async def test_an_answer_read_wrong_is_a_warning_never_a_failed_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The check only warns: whatever reading the cluster's answer raises (a field a later
    client names otherwise) leaves the start going, said in a WARNING."""

    class Misread:
        async def replicas(self, topics: object) -> tuple[int, dict[str, int]]:
            raise KeyError("brokers")

    with caplog.at_level(logging.WARNING, logger="app.kafka.replication"):
        found = await check_replication(Misread(), [A], ASKED)  # type: ignore[arg-type]
    assert found == {}
    assert "cannot read the replication of the node's topics" in caplog.text


async def test_a_running_node_says_replication_changed_since_its_start(tmp_path: Path) -> None:
    """Read again every minute (the topic watch): `/healthz`'s `topics` and the
    `tickwheel_topic_replication_findings` gauge follow a fix and a lowered setting."""
    log = MemoryLog()
    log.brokers = 3
    log.replicas[TOPICS.timers_changelog] = 2
    node = RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS)
    ticks = Ticks()
    node.node.topic_watch.sleep = ticks.sleep
    changelog = TOPICS.timers_changelog

    def findings(topic: str) -> float | None:
        return node.node.metrics.registry.get_sample_value(
            "tickwheel_topic_replication_findings", {"topic": topic}
        )

    await node.start()
    try:
        await wait_until(node.runs)
        assert node.node.health()["topics"][changelog] == [
            replica_shortfall(changelog, 2, Replication(3, 2))
        ]
        assert findings(changelog) == 1
        for topic, configs in log.configs.items():  # every topic reassigned to 3 brokers
            log.replicas[topic] = 3
            configs["min.insync.replicas"] = "2"
        await ticks.tick()
        assert "topics" not in node.node.health() and findings(changelog) == 0
        log.configs[changelog]["min.insync.replicas"] = "1"  # lowered while it runs
        await ticks.tick()
        assert node.node.health()["topics"] == {changelog: [insync_fault(changelog, 3, 1)]}
        assert findings(changelog) == 1 and findings(TOPICS.events) == 0
    finally:
        await node.stop()
