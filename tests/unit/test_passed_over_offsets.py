"""The group's committed offsets never move back (found by a lifecycle hunt). A cycle that
read p's log and wrote nothing (its own event read back) left its offset a for the poll
loop to commit; before the poll loop took it, the task's next cycle committed a
transaction carrying b > a of the same partition; the poll loop then committed a, and
the group's offset went from b back to a: a hand-off read and applied a..b again."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import cast

import pytest
from fakes import RunningNode, wait_until
from test_node_memory import TOPICS, results, schedule, start, task_of

from app.kafka import TransactionalWriter
from app.kafka.memory import MemoryLog
from app.node.partition_commits import PartitionCommits
from app.node.partition_input import Batch
from app.node.partition_transaction import PartitionTransaction
from app.protocol.wire import EventEnvelope, encode
from tables import AggregateRef
from tables.partitioner import partition_of

__all__ = ["log", "nodes"]  # the fixtures, imported for pytest

from test_node_memory import log, nodes

P = 1
OWNERS = [f"o{i}" for i in range(1, 99) if partition_of(f"o{i}", 2) == P]
KEY = (TOPICS.events, P)


def test_an_offset_passed_over_below_what_the_transaction_carries_is_not_committed() -> None:
    txn = PartitionTransaction(cast(TransactionalWriter, None), TOPICS.timers_changelog, P, "g")
    own = PartitionCommits(task_of(P), lambda *a: None, lambda: txn)
    own.pass_over(KEY, 5)
    txn.stage([], {KEY: 9})
    assert own.take_offsets() == {}
    own.pass_over(KEY, 9)  # read again (a lost membership): committed already
    own.pass_over((TOPICS.commands, P), 3)
    assert own.take_offsets() == {(TOPICS.commands, P): 3}
    own.pass_over(KEY, 12)
    own.pass_over(KEY, 10)
    assert own.take_offsets() == {KEY: 12}


async def test_the_poll_loop_never_commits_an_offset_a_later_transaction_passed(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = await start(nodes, log, tmp_path, "a")
    await wait_until(node.runs)
    went_back: list[tuple[int, int]] = []
    commit_group_offsets = log.commit_group_offsets

    def committing(group_id: str, offsets: dict[tuple[str, int], int]) -> None:
        for (topic, q), offset in offsets.items():
            if (now := log.committed(group_id, topic, q)) is not None and offset < now:
                went_back.append((now, offset))
        commit_group_offsets(group_id, offsets)

    monkeypatch.setattr(log, "commit_group_offsets", committing)
    # Cycle A (its own event read back) waits before its lock, until the gate opens.
    cycles = node.node.cycles
    backlogs, gate, entered = cycles._backlogs, asyncio.Event(), asyncio.Event()

    async def held(q: int, part: list[Batch]) -> dict[str, int]:
        if q == P and not entered.is_set() and any(t == TOPICS.events for t, _ in part):
            entered.set()
            await gate.wait()
        return await backlogs(q, part)

    monkeypatch.setattr(cycles, "_backlogs", held)
    far = int(time.time() * 1000) + 3_600_000
    await schedule(log, OWNERS[0], far)
    await wait_until(entered.is_set)
    # Meanwhile, another writer's event of p and a command of p: cycle B's.
    ref = AggregateRef(context="mem", aggregate="counter", id=OWNERS[1])
    other = EventEnvelope(id="x1", type="Other", aggregate=ref, version=1, created_at=far, body={})
    await log.publisher().send(TOPICS.events, OWNERS[1].encode(), encode(other), P)
    command = await schedule(log, OWNERS[2], far)
    member = log.groups["g"].members[0]

    async def handed_over() -> bool:  # the poll loop hands a batch over as it polls it
        behind = [await member.backlog(t, P) for t in (TOPICS.events, TOPICS.commands)]
        return behind == [0, 0]

    await wait_until(handed_over)
    # The poll loop takes no offset passed over until B's transaction committed: then it
    # takes A's at once, before a poll hands B's own event back (its cycle passing over a
    # later offset).
    commits, taken = node.node.commits, [0]
    take_offsets = commits.take_offsets

    def take() -> dict[tuple[str, int], int]:
        if command.request_id not in results(log):
            return {}
        taken[0] += 1
        return take_offsets()

    monkeypatch.setattr(commits, "take_offsets", take)
    gate.set()  # A passes over its event, B commits past it in a transaction
    await wait_until(lambda: taken[0] >= 2)  # the poll loop committed what it took first
    carried = log.committed("g", TOPICS.events, P)
    assert went_back == [], "the group's committed offset moved back"
    other_at = next(r.offset for r in log.records(*KEY) if r.key == OWNERS[1].encode())
    assert carried is not None and carried > other_at, "B's transaction carried it past"
    assert node.node._failure is None


class _Producer:
    """A transactional writer whose commits wait for `go`, each told in `commits`."""

    broken = None

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.commits: list[dict[tuple[str, int], int]] = []

    async def commit(
        self, records: list[object], offsets: dict[tuple[str, int], int], group_id: str
    ) -> list[int]:
        self.commits.append(dict(offsets))
        await self.go.wait()
        return list(range(len(records)))


def _commits() -> tuple[_Producer, PartitionTransaction, PartitionCommits]:
    producer = _Producer()
    txn = PartitionTransaction(cast(TransactionalWriter, producer), TOPICS.timers_changelog, P, "g")
    return producer, txn, PartitionCommits(task_of(P), lambda *a: None, lambda: txn)


async def test_an_offset_passed_over_while_a_transaction_is_in_flight_waits_for_it() -> None:
    """Its transaction's offset b lands at its end: the group's commit of a > b landing
    before that would be moved back to b."""
    producer, txn, own = _commits()
    txn.stage([], {KEY: 4})
    commit = own.start(5.0)
    assert commit is not None
    await wait_until(lambda: producer.commits == [{KEY: 4}])
    own.pass_over(KEY, 7)
    assert own.offsets_to_commit() == {}, "committed to the group before b landed"
    producer.go.set()
    assert await commit
    await wait_until(lambda: own.running() is None)
    assert own.offsets_to_commit() == {KEY: 7}


async def test_an_offset_passed_over_rides_with_staged_work_of_its_partition() -> None:
    producer, txn, own = _commits()
    producer.go.set()
    txn.stage([], {KEY: 4})
    own.pass_over(KEY, 7)
    own.pass_over((TOPICS.commands, P), 2)
    assert own.offsets_to_commit() == {(TOPICS.commands, P): 2}
    commit = own.start(5.0)
    assert commit is not None and await commit
    assert producer.commits == [{KEY: 7}]


async def test_a_transaction_waits_for_the_groups_commit_of_its_partition_in_flight() -> None:
    """The group's commit of a in flight, a transaction carrying b > a sent meanwhile would
    land first and be moved back to a."""
    producer, txn, own = _commits()
    producer.go.set()
    own.pass_over(KEY, 3)
    assert own.offsets_to_commit() == {KEY: 3}  # the poll loop's commit goes
    txn.stage([], {KEY: 6})
    commit = own.start(5.0)
    assert commit is not None
    for _ in range(5):
        await asyncio.sleep(0)
    assert producer.commits == [], "sent while the group's commit of a was in flight"
    own.offsets_ended()
    assert await commit
    assert producer.commits == [{KEY: 6}]
