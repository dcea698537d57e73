"""A partition's commit that has not landed for longer than half its deadline makes the
node not ready, naming the partition, before the commit is given up and the partition let
go: a transaction's in flight, or the poll loop's group commit of its offsets passed over
(which holds every partition's reading, up to 30 s a poll). The bound was 60 s, above the
30 s commit deadline, and the group's commit was not counted: neither ever showed."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from fakes import wait_until
from test_commits_lag import HangingTransaction, Kept, Running, Transactions

from app.errors import KafkaUnavailable
from app.kafka.group_consumer import GROUP_CALL_S
from app.kafka.ports import GroupMember
from app.node import polling
from app.node.commits import COMMIT_DEADLINE_S, Commits
from app.node.health import MAX_COMMIT_LAG_S, node_health
from app.node.kept import KeptType
from app.node.partition_commits import PartitionCommits
from app.node.partition_task import PartitionTask
from app.node.partition_transaction import PartitionTransaction
from app.node.polling import poll_loop
from app.node.task_id import TaskId

STUCK_S = COMMIT_DEADLINE_S * 0.6
"""Stuck, and not given up yet."""


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def health(lags: dict[int, float]) -> dict[str, Any]:
    return node_health(
        cast(dict[TaskId, PartitionTask], {}),
        closing={},
        given=set(),
        suspended=None,
        broker={"reachable": True},
        commit_lags=lags,
        failure=None,
    )


def test_the_bound_is_below_every_commits_deadline() -> None:
    assert MAX_COMMIT_LAG_S < COMMIT_DEADLINE_S and MAX_COMMIT_LAG_S < GROUP_CALL_S


async def test_a_transaction_stuck_short_of_its_deadline_makes_the_node_not_ready() -> None:
    clock, key = Clock(), TaskId(Kept.name, 3)
    hanging = HangingTransaction()
    txn = cast(PartitionTransaction, Transactions(hanging))
    own = PartitionCommits(key, lambda *a: None, lambda: txn, clock=clock)
    commits = Commits(10, {key: Running(own)}, clock=clock)
    task = commits.start(cast(KeptType, Kept()), 3)
    assert task is not None
    clock.now += 1.0
    assert health(commits.lags())["ready"]
    clock.now += STUCK_S
    body = health(commits.lags())
    assert not body["ready"] and body["commit_lag_s"] == pytest.approx(STUCK_S + 1.0)
    assert body["not_ready"] == (
        f"partition 3: the oldest write waiting to commit is {STUCK_S + 1.0:.1f} s old "
        f"(more than {MAX_COMMIT_LAG_S:g} s; given up at {COMMIT_DEADLINE_S:g} s)"
    )
    hanging.release.set()
    assert await task
    await asyncio.sleep(0)  # its done callback forgets it
    assert commits.lags() == {} and health(commits.lags())["ready"]


def test_several_partitions_late_are_all_named() -> None:
    late = MAX_COMMIT_LAG_S + 1
    body = health({0: 0.5, 2: late, 7: late + 2})
    assert body["not_ready"].startswith("partitions 2, 7: the oldest write waiting to commit is")
    assert body["commit_lag_s"] == pytest.approx(late + 2)


class StuckGroup:
    """A group member with nothing to poll whose offset commits hang until `answer` is
    set, then fail (the adapter's timeout) or land; once one landed, its polls wait (the
    landing alone clears the lag, not the loop's next round)."""

    def __init__(self) -> None:
        self.commits = 0  # those with offsets, begun
        self.answer = asyncio.Event()
        self.fail = True
        self.committed: list[dict[tuple[str, int], int]] = []

    def assignment(self) -> set[tuple[str, int]]:
        return set()

    async def poll(self, timeout_ms: int = 500) -> dict[tuple[str, int], list[Any]]:
        await asyncio.sleep(0)
        if self.committed:
            await asyncio.Event().wait()
        return {}

    async def commit(self, offsets: dict[tuple[str, int], int]) -> None:
        if not offsets:
            return
        self.commits += 1
        await self.answer.wait()
        self.answer.clear()
        if self.fail:
            raise KafkaUnavailable(f"no offset commit within {GROUP_CALL_S:g} s")
        self.committed.append(offsets)


async def test_a_group_commit_stuck_makes_the_node_not_ready_across_the_polls_between(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(polling, "POLL_RETRY_S", 0.0)
    clock, key = Clock(), TaskId(Kept.name, 2)
    own = PartitionCommits(key, lambda *a: None, lambda: None, clock=clock)
    commits = Commits(10, {key: Running(own)}, clock=clock)
    group, failures = StuckGroup(), list[str]()
    own.pass_over(("shop.order.events", 2), 10)
    loop = asyncio.create_task(
        poll_loop(cast(GroupMember, group), {}, commits, failures.append, {})
    )
    try:
        await wait_until(lambda: group.commits == 1)
        clock.now += MAX_COMMIT_LAG_S - 1
        assert health(commits.lags())["ready"]
        # Given up (its adapter's deadline), and the next offsets of p wait behind it: the
        # wait counts from the first, through the poll that passed in between.
        clock.now += 1.5
        own.pass_over(("shop.order.events", 2), 11)
        group.answer.set()
        await wait_until(lambda: group.commits == 2)
        clock.now += 0.5
        body = health(commits.lags())
        assert not body["ready"] and body["not_ready"].startswith("partition 2: ")
        assert body["commit_lag_s"] == pytest.approx(MAX_COMMIT_LAG_S + 1)
        group.fail = False
        group.answer.set()
        await wait_until(lambda: bool(group.committed))
        assert group.committed == [{("shop.order.events", 2): 11}]
        assert commits.lags() == {} and health(commits.lags())["ready"]
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    assert failures == []
