"""A partition's commit that ends by a CancelledError leaked out of the client library
(`TransactionalProducer._fail` breaks the producer and re-raises it as it came), although
nobody cancelled the commit, is a failed commit: its task is told (closed dirty, taken
afresh), never a commit that ends quietly with what it took lost while the task runs on.
A commit its task's close abandons is still cancelled, and nobody is told. And a clean
close never counts as committed while the transaction's producer is broken or a row
written to it did not land (found by a hunt: such a copy was marked clean)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from app.errors import Fenced, KafkaUnavailable
from app.node.failing import A_COMMIT
from app.node.kept import is_fenced
from app.node.partition_commits import PartitionCommits
from app.node.partition_transaction import PartitionTransaction
from app.node.task_id import TaskId
from tables.timer import Timer

KEY = TaskId("mem.counter", 0)


class Leaking:
    """A taken transaction whose commit ends by a CancelledError from inside."""

    def __init__(self, txn: Txn) -> None:
        self._txn = txn

    async def send(self) -> list[int]:
        await asyncio.sleep(0)
        # As `TransactionalProducer._fail`: the producer broken, the error re-raised.
        self._txn.broken = self._txn.breaks
        raise asyncio.CancelledError


class Hanging:
    """A taken transaction whose commit never ends (until cancelled)."""

    async def send(self) -> list[int]:
        await asyncio.Event().wait()
        return []


class Txn:
    """A partition's transaction, as its task's commits see it."""

    abandoned = False

    def __init__(self, taken: Any, breaks: KafkaUnavailable | None = None) -> None:
        self.taken = taken
        self.takes = 0
        self.breaks = breaks
        self.broken: KafkaUnavailable | None = None
        self.rows: dict[bytes, Timer | None] = {}
        self.waiting_work = False

    def take(self) -> Any:
        self.takes += 1
        self.waiting_work = False
        return self.taken(self) if callable(self.taken) else self.taken

    def waits(self) -> bool:
        return self.waiting_work

    def waiting(self) -> int:
        return 0

    def unlanded(self) -> dict[bytes, Timer | None]:
        return self.rows


def commits_of(txn: Txn, failures: list[tuple[str, BaseException]]) -> PartitionCommits:
    return PartitionCommits(
        KEY, lambda what, exc: failures.append((what, exc)), lambda: cast(PartitionTransaction, txn)
    )


async def test_a_commit_cancelled_from_inside_is_its_tasks_failure() -> None:
    failures: list[tuple[str, BaseException]] = []
    txn = Txn(Leaking, breaks=KafkaUnavailable("p0: transaction failed"))
    commits = commits_of(txn, failures)
    commit = commits.start(30.0)
    assert commit is not None
    await asyncio.wait([commit])
    # Not a commit that ended cancelled: a failed one, its task told.
    assert not commit.cancelled() and commit.result() is False
    assert txn.takes == 1 and commits.landed == 0
    assert [what for what, _ in failures] == [A_COMMIT]
    exc = failures[0][1]
    assert isinstance(exc, KafkaUnavailable) and not is_fenced(exc)
    assert exc.__cause__ is txn.broken
    # Its close does not count it committed.
    loop = asyncio.get_running_loop()
    assert await commits.settle(until=loop.time() + 1, rest=False) is False
    assert await commits.settle(until=loop.time() + 1) is False


async def test_a_commit_cancelled_from_inside_by_a_fence_fails_its_task_as_fenced() -> None:
    failures: list[tuple[str, BaseException]] = []
    txn = Txn(Leaking, breaks=Fenced("p0 was fenced by a newer owner"))
    commits = commits_of(txn, failures)
    commit = commits.start(30.0)
    assert commit is not None
    await asyncio.wait([commit])
    assert commit.result() is False
    assert len(failures) == 1 and is_fenced(failures[0][1])


async def test_a_commit_cancelled_with_no_broken_producer_is_a_failure_too() -> None:
    failures: list[tuple[str, BaseException]] = []
    txn = Txn(Leaking)
    commits = commits_of(txn, failures)
    commit = commits.start(30.0)
    assert commit is not None
    await asyncio.wait([commit])
    assert commit.result() is False
    assert len(failures) == 1
    assert isinstance(failures[0][1].__cause__, asyncio.CancelledError)


async def test_a_commit_its_close_abandons_is_cancelled_and_fails_nothing() -> None:
    failures: list[tuple[str, BaseException]] = []
    txn = Txn(Hanging())
    commits = commits_of(txn, failures)
    commit = commits.start(30.0)
    assert commit is not None
    await asyncio.sleep(0.01)
    assert commits.abandon() is commit
    await asyncio.wait([commit])
    assert commit.cancelled()
    assert failures == []


async def test_a_close_with_a_broken_producer_is_not_committed() -> None:
    """A failure no commit reported (none was in flight): never counted committed."""
    failures: list[tuple[str, BaseException]] = []
    txn = Txn(Hanging())
    commits = commits_of(txn, failures)
    loop = asyncio.get_running_loop()
    assert await commits.settle(until=loop.time() + 1) is True  # nothing was to commit
    txn.broken = KafkaUnavailable("p0: transaction failed")
    assert await commits.settle(until=loop.time() + 1, rest=False) is False
    assert await commits.settle(until=loop.time() + 1) is False


async def test_a_close_with_rows_not_landed_is_not_committed() -> None:
    failures: list[tuple[str, BaseException]] = []
    txn = Txn(Hanging())
    commits = commits_of(txn, failures)
    txn.rows = {b"k": None}  # a row written whose commit never landed
    loop = asyncio.get_running_loop()
    # The commit in flight alone is waited for first: the rest commits next.
    assert await commits.settle(until=loop.time() + 1, rest=False) is True
    assert await commits.settle(until=loop.time() + 1) is False
