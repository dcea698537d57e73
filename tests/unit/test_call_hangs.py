"""A Kafka call that never answers, where the node waits on it: bounded by the node too,
not by its adapter alone (the ports promise no bound, and the memory log has none). Each
was found by a fault-injection hunt to hold its work for good: the broker watch's verdict
frozen, every remote send's result (a results poll), a partition's worker (its backlog)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from fakes import RunningNode, wait_until
from test_commit_failing import OWNER
from test_node_memory import PARTITIONS, SERVICE, results, schedule

from app.kafka import Record
from app.kafka.broker_watch import BrokerWatch
from app.kafka.memory import MemoryLog
from app.kafka.memory_group import MemoryGroupMember
from app.node import cycles
from app.timers import sender
from app.timers.sender import FollowerPolls


async def _never() -> None:
    await asyncio.get_running_loop().create_future()


async def test_a_probe_that_never_answers_is_a_failed_probe() -> None:
    answers: list[str | None] = []

    async def probe() -> str | None:
        if not answers:
            answers.append("hung")
            await _never()
        return None

    watch = BrokerWatch(
        "localhost:1", probe=probe, timeout=0.05, probe_within=0.1, failures_to_down=1
    )
    assert not await asyncio.wait_for(watch.check(), 5)
    assert await asyncio.wait_for(watch.check(), 5)  # answered again: the verdict moves


class _Hanging:
    """A follower whose first poll never answers, the next give one record each."""

    topic = "shop.results"

    def __init__(self) -> None:
        self.polls = 0

    async def poll(self, timeout_ms: int = 200) -> list[Record]:
        self.polls += 1
        if self.polls == 1:
            await _never()
        return [Record(self.topic, 0, self.polls, None, b"{}", 0)]


async def test_a_results_poll_that_never_answers_fails_and_is_polled_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sender, "POLL_WITHIN_S", 0.1)
    monkeypatch.setattr(sender, "FOLLOW_RETRY_S", 0)
    follower = _Hanging()
    polls = FollowerPolls(follower, failing_s=10)  # type: ignore[arg-type]
    [record] = await asyncio.wait_for(polls.poll(), 5)
    assert record.offset == 2 and polls.failing is None


async def test_a_backlog_that_never_answers_counts_0_and_the_partition_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cycles, "BACKLOG_WITHIN_S", 0.1)
    backlog, hung = MemoryGroupMember.backlog, [False]

    async def hanging(self: MemoryGroupMember, topic: str, partition: int) -> int:
        if not hung[0]:
            hung[0] = True
            await _never()
        return await backlog(self, topic, partition)

    monkeypatch.setattr(MemoryGroupMember, "backlog", hanging)
    log = MemoryLog()
    node = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(node.runs)
        cmd = await schedule(log, OWNER, int(time.time() * 1000) + 3_600_000)
        await wait_until(lambda: cmd.request_id in results(log), within=10)
        assert hung[0] and results(log)[cmd.request_id].code == "COMMITTED"
    finally:
        await node.stop()


async def test_a_probe_of_several_addresses_has_its_timeout_for_each() -> None:
    """The probe tries each bootstrap address in turn, `timeout` each: the bound is not
    shorter than that, or a broker answering at the last address was said away."""

    async def slow_answer() -> str | None:
        await asyncio.sleep(0.5)
        return None

    bootstrap = ",".join(f"h{i}:9092" for i in range(5))
    watch = BrokerWatch(
        bootstrap, probe=slow_answer, timeout=0.2, probe_within=0.1, failures_to_down=1
    )
    assert await asyncio.wait_for(watch.check(), 5)
