"""A cluster short of in-sync replicas for minutes: a partition's commit misses its deadline,
and its retake's producer gets no producer id (the coordinator holds it behind the abort
markers of the failed transaction, which it cannot write either). Each attempt took the
open's deadline, ten of them stopped the node, and the next owner met the same. Such a
take now waits the cluster out, not counted, the partition not ready and /healthz saying
why; the node runs it once the cluster gives the id. Any other failure keeps its limit,
counted across such waits."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest
from aiokafka.errors import (
    KafkaConnectionError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    TopicAuthorizationFailedError,
)
from fakes import RunningNode, wait_until
from test_commit_failing import BAD, OWNER
from test_node_memory import PARTITIONS, SERVICE, schedule

from app.errors import KafkaUnavailable
from app.kafka.memory import MemoryLog
from app.kafka.memory_clients import MemoryWriter
from app.kafka.oauth_token import TokenRefused, TokenUnavailable
from app.node import partition_take, type_transactions
from app.node.failing import RETAKE_BACKOFF_MAX_S
from app.node.partition_take import (
    CLUSTER_WAIT_MAX_S,
    TAKE_ATTEMPTS,
    ChangelogLost,
    TakeFailure,
    take_failure,
    take_retry,
)
from app.node.type_transactions import NoProducerId


def _from(cause: BaseException, said: str = "transaction failed") -> KafkaUnavailable:
    error = KafkaUnavailable(said)
    error.__cause__ = cause
    return error


def _short_and(cause: BaseException) -> KafkaUnavailable:
    short = NotEnoughReplicasError()
    short.__cause__ = cause
    return _from(short)


@pytest.mark.parametrize(
    ("exc", "failure"),
    [
        (_from(NotEnoughReplicasError()), "cluster"),
        (_from(NotEnoughReplicasAfterAppendError()), "cluster"),
        (NoProducerId("g.t.0: its producer did not start within 15 s"), "cluster"),
        (_from(NoProducerId("no producer id"), "open failed"), "cluster"),
        (_from(TopicAuthorizationFailedError({"shop.order.events"})), "final"),
        # A refusal beside a shortage of replicas: an operator must act all the same.
        (_short_and(TopicAuthorizationFailedError()), "final"),
        (ChangelogLost("rows gone"), "final"),
        (_from(KafkaConnectionError("Unable to bootstrap")), "counted"),
        # No OAUTHBEARER token now (the identity provider away): a broker away's kind.
        (_from(TokenUnavailable("the token endpoint answered HTTP 503")), "counted"),
        (_from(TokenRefused("refused the grant (HTTP 401, error 'invalid_client')")), "final"),
        (KafkaUnavailable("g.t.0: no commit within 30 s"), "counted"),
        (RuntimeError("a bug"), "counted"),
    ],
)
def test_how_a_take_failed(exc: BaseException, failure: TakeFailure) -> None:
    assert take_failure(exc) == failure


def test_a_take_failed_by_the_cluster_counts_no_attempt_and_waits_at_most_the_retakes_longest() -> (
    None
):
    waits = [take_retry("cluster", 0, n) for n in range(1, 200)]
    assert all(w is not None and 0 < w <= RETAKE_BACKOFF_MAX_S for w in waits)
    assert waits[-1] == RETAKE_BACKOFF_MAX_S
    assert waits == sorted(w for w in waits if w is not None)
    # Counted attempts before it do not make it give up either.
    assert take_retry("cluster", TAKE_ATTEMPTS, 1) is not None


@pytest.mark.parametrize("waited_s", [0.0, CLUSTER_WAIT_MAX_S - 1, CLUSTER_WAIT_MAX_S, 1e9])
def test_a_take_failed_by_the_cluster_is_given_up_after_the_clusters_longest_wait(
    waited_s: float,
) -> None:
    # The state may be this node's alone (a broker out of its reach): stopped, the node
    # lets the group give the partition to one that can take it.
    given_up = take_retry("cluster", 0, 40, waited_s) is None
    assert given_up == (waited_s >= CLUSTER_WAIT_MAX_S)


@pytest.mark.parametrize("attempts", range(1, TAKE_ATTEMPTS + 3))
def test_other_failures_keep_their_limit(attempts: int) -> None:
    assert take_retry("final", attempts, 0) is None
    delay = take_retry("counted", attempts, 0)
    assert (delay is None) == (attempts >= TAKE_ATTEMPTS)


async def test_a_retake_held_by_the_cluster_past_the_attempts_runs_once_it_is_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(type_transactions, "OPEN_DEADLINE_S", 0.05)
    monkeypatch.setattr(partition_take, "TAKE_BACKOFF_S", 0.001)
    monkeypatch.setattr(partition_take, "RETAKE_BACKOFF_MAX_S", 0.01)
    log = MemoryLog()
    node = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(node.runs)
        starts: list[str] = []
        back = asyncio.Event()
        start = MemoryWriter.start

        async def no_producer_id(writer: MemoryWriter) -> None:
            if writer.transactional_id.endswith(f".{BAD}"):
                starts.append(writer.transactional_id)
                await back.wait()  # the client library retries InitProducerId silently
            await start(writer)

        async def once(tid: str) -> None:  # p's commit misses its deadline: taken afresh
            if tid.endswith(f".{BAD}") and not starts:
                monkeypatch.setattr(MemoryWriter, "start", no_producer_id)
                raise KafkaUnavailable(f"{tid}: no commit within 30 s")

        log.before_commit = once
        await schedule(log, OWNER, int(time.time() * 1000) + 3_600_000)
        await wait_until(lambda: len(starts) > TAKE_ATTEMPTS + 2, within=20)
        health = node.node.health()
        assert "failed" not in health and not health["ready"]
        assert BAD in health["restoring"]
        assert "waiting for the cluster" in health["stalled"][str(BAD)]
        back.set()  # the replicas are back: the coordinator gives the id
        await wait_until(node.runs, within=10)
        assert "failed" not in node.node.health()
    finally:
        await node.stop()


async def test_a_take_the_cluster_refuses_past_its_longest_wait_stops_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(type_transactions, "OPEN_DEADLINE_S", 0.05)
    monkeypatch.setattr(partition_take, "TAKE_BACKOFF_S", 0.001)
    monkeypatch.setattr(partition_take, "RETAKE_BACKOFF_MAX_S", 0.01)
    monkeypatch.setattr(partition_take, "CLUSTER_WAIT_MAX_S", 0.5)
    log = MemoryLog()
    node = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(node.runs)
        start = MemoryWriter.start

        async def no_producer_id(writer: MemoryWriter) -> None:
            if writer.transactional_id.endswith(f".{BAD}"):
                await asyncio.Event().wait()  # never: a coordinator out of this node's reach
            await start(writer)

        async def once(tid: str) -> None:
            if tid.endswith(f".{BAD}") and MemoryWriter.start is start:
                monkeypatch.setattr(MemoryWriter, "start", no_producer_id)
                raise KafkaUnavailable(f"{tid}: no commit within 30 s")

        log.before_commit = once
        await schedule(log, OWNER, int(time.time() * 1000) + 3_600_000)
        await wait_until(lambda: "failed" in node.node.health(), within=20)
        failed = node.node.health()["failed"]
        assert "could not be taken for" in failed and "the cluster refusing it" in failed
    finally:
        with contextlib.suppress(Exception):
            await node.stop()


async def test_counted_attempts_add_up_across_a_wait_for_the_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wait for the cluster does not give the take its attempts back: reset by it, a
    take whose attempts failed by turns counted and by the cluster's state (a broker
    flapping) would be tried for ever, each kind resetting the other's count."""
    monkeypatch.setattr(partition_take, "TAKE_BACKOFF_S", 0.001)
    monkeypatch.setattr(partition_take, "TAKE_BACKOFF_MAX_S", 0.01)
    monkeypatch.setattr(partition_take, "RETAKE_BACKOFF_MAX_S", 0.01)
    log = MemoryLog()
    node = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    try:
        await wait_until(node.runs)
        start = MemoryWriter.start
        script = ["counted", "counted", "cluster", "cluster", "cluster"]
        counted: list[str] = []

        async def failing(writer: MemoryWriter) -> None:
            tid = writer.transactional_id
            if tid.endswith(f".{BAD}"):
                if (script.pop(0) if script else "counted") == "cluster":
                    raise NoProducerId(f"{tid}: its producer did not start within 15 s")
                counted.append(tid)
                raise KafkaUnavailable(f"{tid}: Unable to bootstrap")
            await start(writer)

        async def once(tid: str) -> None:  # p's commit fails: taken afresh, and failing
            if tid.endswith(f".{BAD}") and MemoryWriter.start is start:
                monkeypatch.setattr(MemoryWriter, "start", failing)
                raise KafkaUnavailable(f"{tid}: no commit within 30 s")

        log.before_commit = once
        await schedule(log, OWNER, int(time.time() * 1000) + 3_600_000)
        await wait_until(lambda: "failed" in node.node.health(), within=20)
        assert f"could not be taken in {TAKE_ATTEMPTS} attempts" in node.node.health()["failed"]
        assert len(counted) == TAKE_ATTEMPTS and not script  # 2 before the wait, 8 after
    finally:
        with contextlib.suppress(Exception):
            await node.stop()
