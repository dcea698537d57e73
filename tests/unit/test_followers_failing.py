"""The followers a node's sends and parks depend on (each context's results reader and
ledger follower) retry what may pass by itself, but not for ever: their polls failing,
none passing, make the node not ready after `FOLLOWER_FAILING_S` (`/healthz` says which
follower, for how long, and why), and stop it loudly after `POLL_FAILING_S`, as the
group's polls do. Retried for ever (a corrupt batch fails every fetch of it), every
remote send would wait out its timeout and park while the node said it was ready."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import TopicAuthorizationFailedError
from fakes import RunningNode, wait_until
from test_node_memory import PARTITIONS, SERVICE

from app.errors import KafkaUnavailable, NodeFailed
from app.kafka import Record
from app.kafka.memory import MemoryLog
from app.kafka.memory_clients import MemoryFollower
from app.node import health, polling
from app.node.health import node_health
from app.protocol.topics import ContextTopics
from app.timers import sender
from app.timers.sender import FollowerPolls

RESULTS, LEDGER = ContextTopics("mem").results, ContextTopics("mem").ledger


@pytest.mark.parametrize(
    ("topic", "what"),
    [(RESULTS, "the results reader of mem"), (LEDGER, "the ledger of mem")],
    ids=["results", "ledger"],
)
async def test_a_follower_failing_for_good_makes_the_node_not_ready_then_stops_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, topic: str, what: str
) -> None:
    monkeypatch.setattr(polling, "POLL_FAILING_S", 2.0)  # read by the node's start
    monkeypatch.setattr(health, "FOLLOWER_FAILING_S", 0.3)
    monkeypatch.setattr(sender, "FOLLOW_RETRY_S", 0.05)
    log = MemoryLog()
    node = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    poll = MemoryFollower.poll

    async def corrupt(self: MemoryFollower, timeout_ms: int = 200) -> list[Record]:
        if self.topic == topic:
            # What a corrupt batch gives every fetch of it, for good (CorruptRecordError is
            # a KafkaError, not a refusal: `PartitionReader.poll` wraps it so).
            await asyncio.sleep(0.01)
            raise KafkaUnavailable(f"reading {topic} failed: CorruptRecordError")
        return await poll(self, timeout_ms)

    try:
        await wait_until(node.runs)
        assert "followers_failing" not in node.node.health()
        monkeypatch.setattr(MemoryFollower, "poll", corrupt)
        # Not ready, saying which follower fails and why, before the node stops.
        await wait_until(lambda: not node.node.health()["ready"], within=2)
        h = node.node.health()
        assert "failed" not in h, h
        failing = h["followers_failing"][what]
        assert failing["for_s"] >= 0.3 and "CorruptRecordError" in failing["error"], h
        assert node.task is not None
        with pytest.raises(NodeFailed, match=f"{what} failed: .*polls of {topic} failed for"):
            await asyncio.wait_for(node.task, 5)
        assert "CorruptRecordError" in node.node.health()["failed"]
    finally:
        monkeypatch.setattr(MemoryFollower, "poll", poll)
        with contextlib.suppress(NodeFailed):
            await node.stop()


class _Follower:
    """A follower whose polls raise `errors` in turn, then pass (empty); each poll moves
    the fake monotonic clock on by a second and notes what `polls.failing` said then."""

    topic = "shop.results"

    def __init__(self, errors: list[KafkaUnavailable]) -> None:
        self.errors = errors
        self.now = 100.0
        self.polls: FollowerPolls | None = None
        self.seen: list[tuple[float, str] | None] = []

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def add(self, partition: int) -> None: ...

    async def remove(self, partition: int) -> None: ...

    async def poll(self, timeout_ms: int = 200) -> list[Record]:
        assert self.polls is not None
        self.seen.append(self.polls.failing)
        self.now += 1.0
        if self.errors:
            raise self.errors.pop(0)
        return []


def _polls(follower: _Follower, failing_s: float) -> FollowerPolls:
    follower.polls = FollowerPolls(follower, failing_s=failing_s, monotonic=lambda: follower.now)
    return follower.polls


async def test_polls_failing_a_while_are_said_then_forgotten_once_one_passes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sender, "FOLLOW_RETRY_S", 0)
    follower = _Follower([KafkaUnavailable(f"down {n}") for n in range(3)])
    polls = _polls(follower, failing_s=10)
    assert polls.failing is None
    assert await polls.poll() == []
    # Before each poll: how long they had failed (by the injected clock), and the last error.
    assert follower.seen == [None, (0.0, "down 0"), (1.0, "down 1"), (2.0, "down 2")]
    assert polls.failing is None


async def test_polls_failing_for_failing_s_none_passing_raise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sender, "FOLLOW_RETRY_S", 0)
    follower = _Follower([KafkaUnavailable("CorruptRecordError") for _ in range(10)])
    polls = _polls(follower, failing_s=5)
    with pytest.raises(KafkaUnavailable, match="failed for 5 s, none passing: CorruptRecord"):
        await polls.poll()
    assert len(follower.errors) == 4  # the first failed at 101, the sixth at 106


async def test_a_refused_poll_raises_at_once() -> None:
    refusal = KafkaUnavailable("reading shop.results failed")
    refusal.__cause__ = TopicAuthorizationFailedError("shop.results")
    follower = _Follower([refusal])
    with pytest.raises(KafkaUnavailable) as raised:
        await _polls(follower, failing_s=60).poll()
    assert raised.value is refusal and len(follower.seen) == 1


def _health(following: dict[str, tuple[float, str]]) -> dict[str, Any]:
    return node_health(
        {},
        closing={},
        given=set(),
        suspended=None,
        broker={"reachable": True},
        commit_lags={},
        failure=None,
        following=following,
    )


def test_health_says_the_failing_followers_and_is_not_ready_past_the_bound() -> None:
    quiet = _health({})
    assert quiet["ready"] is True and "followers_failing" not in quiet
    blip = _health({"the ledger of shop": (1.0, "reset")})
    assert blip["ready"] is True
    assert blip["followers_failing"] == {"the ledger of shop": {"for_s": 1.0, "error": "reset"}}
    failing = _health(
        {
            "the ledger of shop": (1.0, "reset"),
            "the results reader of shop": (health.FOLLOWER_FAILING_S, "CorruptRecordError"),
        }
    )
    assert failing["ready"] is False
    assert list(failing["followers_failing"]) == [
        "the ledger of shop",
        "the results reader of shop",
    ]
