"""A partition whose commits fail for good: a refusal stops the node loudly, anything else
retakes it with a growing wait and makes `/healthz` say so, never a quiet hot loop of
retakes (a commit's failure reads no records, so a cycle's staging is no sign it passed).
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import pytest
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)
from fakes import RunningNode, wait_until
from test_node_memory import PARTITIONS, SERVICE, schedule
from test_node_topic_changes import failure_of

from app.errors import KafkaUnavailable
from app.kafka.memory import MemoryLog
from app.node.failing import A_COMMIT, A_CYCLE, ITS_WORKER, FailingPartitions, refused_for_good
from app.node.health import FAILING_IN_A_ROW
from tables.partitioner import partition_of

BAD = 0
OWNER = next(f"o{i}" for i in range(1, 99) if partition_of(f"o{i}", PARTITIONS) == BAD)


def test_a_commit_failing_again_counts_up_through_the_cycles_between() -> None:
    failing = FailingPartitions()
    for n in range(1, 4):
        assert failing.failed(0, {}, "a commit: no", A_COMMIT).failures == n
        assert not failing.read(0, {"t": 7})  # a cycle staged: the commit may fail still
    failing.worked(0, "the timer rounds of x")  # another work's: not this one
    assert failing.report()["0"]["failures"] == 3
    failing.worked(0, A_COMMIT)  # a commit landed
    assert failing.report() == {}
    assert failing.failed(0, {}, "a commit: no", A_COMMIT).failures == 1


def test_failures_of_other_work_in_a_row_count_up_too() -> None:
    """A commit failing, then a timer round, then a commit: the partition keeps failing,
    its retakes wait longer; a commit landing forgets only a commit's failure."""
    failing = FailingPartitions()
    failing.failed(0, {}, "a commit: no", A_COMMIT)
    rounds = "the timer rounds of x"
    assert failing.failed(0, {}, "the timer rounds of x: no", rounds).failures == 2
    failing.worked(0, A_COMMIT)
    assert failing.report()["0"]["failures"] == 2
    failing.worked(0, rounds)
    assert failing.report() == {}


def test_a_cycles_failure_reading_nothing_is_passed_by_a_cycle_staged() -> None:
    for what in (A_CYCLE, ITS_WORKER):
        failing = FailingPartitions()
        failing.failed(0, {}, "x", what)
        assert not failing.read(0, {})  # nothing held: nothing released
        assert failing.report() == {}


def test_a_hold_released_by_a_cycle_is_back_when_a_failure_comes_before_its_commit() -> None:
    """The cycle that read past where p failed released p's hold once it staged; its
    commit then failed, so it never counted (p is read again from its committed offsets):
    p is held again where it was, until a cycle reads past that again (found by a
    lifecycle hunt: the retake fired p's timers before the commands at the failed offsets,
    a cancel among them maybe, were decided again)."""
    failing = FailingPartitions()
    failing.failed(0, {"t": 5}, "a cycle: no")
    assert failing.held(0)
    assert failing.read(0, {"t": 6}, carried_by=3)  # staged, carried by the 3rd commit
    assert not failing.held(0)
    failing.committed(0, 2)  # an earlier commit (in flight while it staged) landed
    failing.failed(0, {}, "a commit: no", A_COMMIT)
    assert failing.held(0) and failing.report()["0"]["at"] == {"t": 5}
    assert not failing.read(0, {"t": 4}, carried_by=1)
    assert failing.read(0, {"t": 5}, carried_by=1)
    failing.committed(0, 1)  # the commit that carries it landed: the hold is gone for good
    failing.failed(0, {}, "a commit: no", A_COMMIT)
    assert not failing.held(0)


def test_a_retake_drops_what_a_hold_waits_for_below_the_committed_offsets() -> None:
    failing = FailingPartitions()
    failing.failed(0, {"t.events": 5, "t.commands": 9}, "a cycle: no")
    failing.rewound(0, {"t.events": 6, "t.commands": 3})  # events read and committed past 5
    assert failing.held(0) and failing.report()["0"]["at"] == {"t.commands": 9}
    failing.rewound(0, {"t.commands": 10})
    assert not failing.held(0) and failing.report() == {}


def fail_commits_of_bad(log: MemoryLog, error: BaseException | None = None) -> list[float]:
    """Every commit of partition BAD's transactions fails from now on (with `error` as its
    cause); when each failed."""
    failed: list[float] = []

    async def before_commit(tid: str) -> None:
        if tid.endswith(f".{BAD}"):
            failed.append(time.monotonic())
            raise KafkaUnavailable(f"{tid}: the transaction failed") from error

    log.before_commit = before_commit
    return failed


async def test_a_commit_that_never_passes_backs_off_and_is_not_ready(tmp_path: Path) -> None:
    log = MemoryLog()
    node = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(node.runs)
        failed = fail_commits_of_bad(log)
        began = time.monotonic()
        await schedule(log, OWNER, int(time.time() * 1000) + 3_600_000)

        def not_ready() -> bool:
            h = node.node.health()
            return not h["ready"] and h["failing"][str(BAD)]["failures"] >= FAILING_IN_A_ROW

        await wait_until(not_ready, within=10, what=lambda: f"{node.node.health()}")
        # Retaken at once, then after 0.5 s, then 1 s: not hundreds of retakes a second
        # (each a fence and a restore).
        assert len(failed) <= FAILING_IN_A_ROW + 1
        assert time.monotonic() - began >= 0.5
        assert "failed" not in node.node.health()  # it may pass: the node goes on
    finally:
        await node.stop()


async def test_a_commit_refused_fails_its_partition_not_the_node(tmp_path: Path) -> None:
    """A topic this principal may not write (another context's commands, say): the record
    that writes it is read again by whichever node takes the partition next, so stopping
    the node would stop every node of the group in turn. The partition backs off instead,
    and `/healthz` says so."""
    log = MemoryLog()
    node = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(node.runs)
        fail_commits_of_bad(log, TopicAuthorizationFailedError("other.commands"))
        await schedule(log, OWNER, int(time.time() * 1000) + 3_600_000)

        def failing() -> bool:
            failures: int = (
                node.node.health().get("failing", {}).get(str(BAD), {}).get("failures", 0)
            )
            return failures >= FAILING_IN_A_ROW

        await wait_until(failing, within=10)
        h = node.node.health()
        assert not h["ready"] and "failed" not in h
    finally:
        await node.stop()


@pytest.mark.parametrize(
    "refusal",
    [
        TopicAuthorizationFailedError({"mem.counter.timers"}),
        TopicAuthorizationFailedError("mem.dead-letters"),
        GroupAuthorizationFailedError("g"),
    ],
    ids=["its own changelog", "its own dead letters", "its group"],
)
async def test_a_commit_refused_on_the_nodes_own_topics_or_group_stops_it(
    tmp_path: Path, refusal: BaseException
) -> None:
    """An ACL of the node's own taken away mid-run: no retake passes it, on this node or
    another of the group (a take only reads, so it never meets the refusal, and the
    partition would be restored every 10 s for ever). The node stops, saying so."""
    log = MemoryLog()
    node = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(node.runs)
        failed = fail_commits_of_bad(log, refusal)
        await schedule(log, OWNER, int(time.time() * 1000) + 3_600_000)
        said = await failure_of(node)
        assert (
            "was refused (an ACL this node needs)" in said
            and f"partition {BAD} of mem.counter" in said
        )
        assert len(failed) == 1
    finally:
        await node.stop()


def test_only_a_refusal_of_the_nodes_own_is_for_good() -> None:
    own = {"mem.counter.timers", "mem.counter.commands", "mem.dead-letters"}
    for_good = functools.partial(refused_for_good, own_topics=own)
    wrapped = KafkaUnavailable("the transaction failed")
    wrapped.__cause__ = TopicAuthorizationFailedError("mem.counter.timers")
    assert for_good(wrapped)
    assert not for_good(TopicAuthorizationFailedError({"other.commands"}))
    # Another service's aggregate in a context of the node's own: not the node's topic.
    assert not for_good(TopicAuthorizationFailedError({"mem.cart.commands"}))
    assert not for_good(TopicAuthorizationFailedError("Broker: Topic authorization failed"))
    assert for_good(TransactionalIdAuthorizationFailed("g.mem.counter.timers.0"))
    assert not for_good(KafkaUnavailable("a timeout"))


def forgotten(node: RunningNode) -> bool:
    h = node.node.health()
    return bool(h["ready"]) and "failing" not in h


async def test_a_commit_that_failed_once_is_forgotten_once_one_lands(tmp_path: Path) -> None:
    """One failure, then commits landing (after the retake, and after later ones too): no
    partition left `failing`, nor counting up over the node's life to not ready."""
    log = MemoryLog()
    node = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(node.runs)
        for _ in range(3):
            failed = fail_commits_of_bad(log)
            await schedule(log, OWNER, int(time.time() * 1000) + 3_600_000)
            await wait_until(functools.partial(bool, failed), within=10)  # failed once, or more
            log.before_commit = None
            await schedule(log, OWNER, int(time.time() * 1000) + 3_600_000)
            await wait_until(functools.partial(forgotten, node), within=10)
    finally:
        await node.stop()


async def test_the_owned_gauge_follows_a_partition_that_failed(tmp_path: Path) -> None:
    """`tickwheel_owned_partitions` said 2 while the node owned 1 (the failed partition
    being taken again): it was set only when a task ran."""
    log = MemoryLog()
    node = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(node.runs)
        fail_commits_of_bad(log)
        await schedule(log, OWNER, int(time.time() * 1000) + 3_600_000)

        def failed_and_told() -> bool:
            h = node.node.health()
            owned = node.node.metrics.owned._value.get()
            return BAD not in h["owned"] and owned == len(h["owned"])

        await wait_until(failed_and_told, within=10, what=lambda: f"{node.node.health()}")
    finally:
        log.before_commit = None
        await node.stop()
