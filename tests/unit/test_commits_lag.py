"""A commit that hangs shows as commit lag (readiness), and none in flight is no lag."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from app.node.commits import Commits
from app.node.kept import KeptType
from app.node.partition_commits import PartitionCommits
from app.node.partition_transaction import PartitionTransaction
from app.node.task_id import TaskId


class HangingTransaction:
    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def send(self) -> list[int]:
        await self.release.wait()
        return []


class Transactions:
    """A partition's transaction of one type, as its task's commits use it."""

    abandoned = False

    def __init__(self, taken: HangingTransaction) -> None:
        self.taken: HangingTransaction | None = taken

    def take(self) -> HangingTransaction | None:
        taken, self.taken = self.taken, None
        return taken


class Running:
    """A running partition task's commits and lock, as `Commits` finds them."""

    def __init__(self, commits: PartitionCommits) -> None:
        self.commits = commits
        self.lock = asyncio.Lock()
        self.cut_short = False


class Kept:
    name = "shop.order"


async def test_a_hanging_commit_is_lag_until_it_ends() -> None:
    failures: list[Any] = []
    hanging = HangingTransaction()
    transaction = cast(PartitionTransaction, Transactions(hanging))
    key = TaskId(Kept.name, 0)
    own = PartitionCommits(key, lambda *a: failures.append(a), lambda: transaction)
    commits = Commits(10, {key: Running(own)})
    assert commits.lag() == 0.0
    kept = cast(KeptType, Kept())
    task = commits.start(kept, 0)
    assert task is not None
    await asyncio.sleep(0.05)
    assert commits.lag() >= 0.04
    hanging.release.set()
    assert await task
    await asyncio.sleep(0)
    assert commits.lag() == 0.0 and failures == []


class InstantTransaction:
    async def send(self) -> list[int]:
        return []  # committed in the commit task's first step


class Queue:
    """A partition's transaction with `n` to take, one after the other."""

    abandoned = False

    def __init__(self, n: int) -> None:
        self.left = n

    def take(self) -> InstantTransaction | None:
        if self.left == 0:
            return None
        self.left -= 1
        return InstantTransaction()

    def waiting(self) -> int:
        return self.left


async def test_claims_after_a_commit_that_ended_in_this_loop_iteration_do_not_spin() -> None:
    """A commit task that ended in this iteration of the loop is done, while its done
    callback (which forgets it) waits for the next: claims that took it for one in flight
    awaited it without yielding and took it again, for ever, and the worker's whole loop
    (its group heartbeats too) stood still (seen on a three-broker cluster as a leader
    moved)."""
    queue = Queue(2)
    key = TaskId(Kept.name, 0)
    own = PartitionCommits(key, lambda *a: None, lambda: cast(PartitionTransaction, queue))
    commits = Commits(10, {key: Running(own)})
    kept = cast(KeptType, Kept())
    first = commits.start(kept, 0)
    assert first is not None
    await asyncio.sleep(0)  # the commit's step ran before this one: done, not yet forgotten
    assert first.done() and own._in_flight is first  # the window

    calls = 0
    start = commits.start

    def counted(k: KeptType, p: int) -> asyncio.Task[bool] | None:
        nonlocal calls
        calls += 1
        if calls > 20:
            raise RuntimeError("commit_claims spins on a commit that has ended")
        return start(k, p)

    setattr(commits, "start", counted)  # noqa: B010 (a method replaced on one instance)
    await commits.commit_claims(kept, {0})
    assert calls <= 2  # the second transaction taken and committed, once
    assert queue.left == 0
