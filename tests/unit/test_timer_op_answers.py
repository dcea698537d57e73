"""`tickwheel timers retry|skip` says what each partition's owner did with the request:
each owner answers its copy on the context's results topic, in the transaction that
commits the copy's offset (DONE with its counts, DUPLICATE, FAILED), and the command waits
for every partition's answer (`--wait`, 30 s), prints a line per partition that changed
timers or failed and a total, and exits 1 naming the partitions that did not answer. A
node on the in-memory log, a fake clock, run inside the command's own event loop.

Before, the command said the request was sent, and only the owners' logs said what came of
it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson
import pytest
from fakes import T0, FakeClock, RunningNode, running, wait_until
from pydantic import BaseModel
from typer.testing import CliRunner, Result

import app.cli.timers
from app.cli import cli
from app.errors import BadRecord
from app.kafka import TopicSpec
from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType, Command, Decision
from app.node.kept import node_topics
from app.ops.op_answers import REFUSED_WHY, Answered, request_answered
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import (
    CommandEnvelope,
    CommandResult,
    OpOutcome,
    TimerAction,
    TimerOp,
    decode,
    encode,
)
from app.service import Service
from app.timers.op_answers import answer_record
from app.timers.operator import new_op
from app.timers.runner import RetryPolicy, TimerOptions
from app.timers.sender import ResultsReader
from tables import AggregateRef, CommandSpec, OnceRule, Timer, TimerStatus
from tables.partitioner import partition_of

P = 2
ORDERS = AggregateTopics("shop", "order")
RESULTS = ContextTopics("shop").results
OWNER = AggregateRef(context="shop", aggregate="order", id="o-1")
OTHER = AggregateRef(context="shop", aggregate="order", id="o-2")
DAY = 24 * 3_600_000


class Order(BaseModel):
    pass


order = AggregateType("shop", "order", Order)


@order.command("Start")
def _start(state: Order, cmd: Command, d: Decision) -> None:
    d.schedule(cmd.body["key"], OnceRule(at=cmd.body["at"]), CommandSpec(type="Nudge"))


@order.command("Nudge")
def _nudge(state: Order, cmd: Command, d: Decision) -> None:
    raise RuntimeError("the shop is closed")  # ERROR: a failed attempt, parked at once


SERVICE = Service(aggregates=(order,))
OPTIONS = TimerOptions(retry=RetryPolicy(max_attempts=1))


def status(log: MemoryLog, key: str) -> TimerStatus | None:
    latest: dict[bytes, bytes | None] = {}
    for p in range(P):
        for r in log.records(ORDERS.timers_changelog, p):
            assert r.key is not None
            latest[r.key] = r.value
    rows = [Timer.model_validate_json(v) for v in latest.values() if v is not None]
    return next((t.status for t in rows if t.key == key), None)


async def park(log: MemoryLog, clock: FakeClock, key: str) -> None:
    """The timer `key` of OWNER (which it sends to) set, fired, failed and PARKED."""
    at = clock.now() + 1_000
    cmd = CommandEnvelope(
        request_id=f"start-{key}",
        type="Start",
        aggregate=OWNER,
        body={"key": key, "at": at},
        issued_at=at,
    )
    p = partition_of(OWNER.id, P)
    await log.publisher().send(ORDERS.commands, OWNER.id.encode(), encode(cmd), p)
    await wait_until(lambda: status(log, key) is TimerStatus.PENDING)
    clock.advance(1_000)
    await wait_until(lambda: status(log, key) is TimerStatus.PARKED)


Prepare = Callable[[MemoryLog, FakeClock, TimerOp], Awaitable[None]]


async def nothing(log: MemoryLog, clock: FakeClock, op: TimerOp) -> None:
    pass


def with_node(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, log: MemoryLog, prepare: Prepare
) -> None:
    """The command's clients are `log`, and a node runs on it in the command's own event
    loop while the command sends and waits, `prepare`d first."""
    real = request_answered

    async def answered(*args: object, **kwargs: object) -> Answered:
        # The wall clock's now: the window of a request id runs from its `requested_at`.
        clock = FakeClock(time.time_ns() // 1_000_000)
        node = RunningNode(log, tmp_path, "n", SERVICE, P, clock=clock, timers=OPTIONS)
        async with running(node):
            op = args[2]
            assert isinstance(op, TimerOp)
            await prepare(log, clock, op)
            return await real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(app.cli.timers, "clients_for", lambda settings: log)
    monkeypatch.setattr(app.cli.timers, "request_answered", answered)


def invoke(action: str, target: AggregateRef, *more: str) -> Result:
    args = ["timers", action, "--type", "shop.order", "--target-id", target.id]
    return CliRunner().invoke(cli, [*args, "--partitions", str(P), "--bootstrap", "b:1", *more])


def test_a_retry_says_what_it_retried_where(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async def parked(log: MemoryLog, clock: FakeClock, op: TimerOp) -> None:
        await park(log, clock, "remind")
        await park(log, clock, "pay")

    log = MemoryLog()
    with_node(monkeypatch, tmp_path, log, parked)
    result = invoke("retry", OWNER, "--request-id", "retry-1")
    assert result.exit_code == 0, result.output
    p = partition_of(OWNER.id, P)
    assert result.stdout.splitlines() == [
        f"partition {p}: retried 2 timers",
        f"retried 2 timers of shop.order parked on {OWNER} in 1 of 2 partitions (request retry-1)",
    ]
    # One answer per partition, in the request id's partition of the results topic.
    at = partition_of("retry-1", P)
    records = [orjson.loads(r.value or b"") for r in log.records(RESULTS, at)]
    answers = [a for a in records if a.get("kind") == "timer-op-answer"]
    assert sorted((a["partition"], a["outcome"], a["retried"]) for a in answers) == [
        (0, "DONE", 2 if p == 0 else 0),
        (1, "DONE", 2 if p == 1 else 0),
    ]


def test_a_retry_past_the_window_is_refused_until_asked_past_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A slot parked eight days ago, its target's window a week: the target may have
    applied it (its result lost) and forgotten its request id. Before, the retry sent it
    again under that id, and the target applied it a second time."""

    async def parked_long_ago(log: MemoryLog, clock: FakeClock, op: TimerOp) -> None:
        await park(log, clock, "remind")
        clock.advance(8 * DAY)

    log = MemoryLog()
    with_node(monkeypatch, tmp_path, log, parked_long_ago)
    result = invoke("retry", OWNER, "--request-id", "retry-old")
    assert result.exit_code == 1, result.output
    p = partition_of(OWNER.id, P)
    assert result.stdout.splitlines() == [
        f"partition {p}: retried 0 timers, 1 timer left parked (past the window)",
        f"retried 0 timers of shop.order parked on {OWNER} in 0 of 2 partitions; 1 timer not "
        f"retried, left parked: {REFUSED_WHY} (request retry-old)",
    ]
    assert "run it again with --past-window" in result.stderr
    assert status(log, "remind") is TimerStatus.PARKED

    async def later(log: MemoryLog, clock: FakeClock, op: TimerOp) -> None:
        clock.advance(8 * DAY)  # the node's clock, started again at the wall clock's

    with_node(monkeypatch, tmp_path, log, later)
    result = invoke("retry", OWNER, "--past-window", "--json")
    assert result.exit_code == 0, result.output
    said = orjson.loads(result.stdout)
    assert said["past_window"] is True
    assert sorted((a["retried"], a.get("refused", 0)) for a in said["answers"]) == [(0, 0), (1, 0)]


def test_a_request_sent_again_under_its_id_is_answered_duplicate(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async def carried_out(log: MemoryLog, clock: FakeClock, op: TimerOp) -> None:
        await park(log, clock, "remind")
        first = await request_answered(log, "shop.order", op, P, 10)
        assert [a.outcome for a in first.answers.values()] == [OpOutcome.DONE] * P

    log = MemoryLog()
    with_node(monkeypatch, tmp_path, log, carried_out)
    result = invoke("skip", OWNER, "--request-id", "skip-1", "--json")
    assert result.exit_code == 0, result.output
    [line] = result.stdout.splitlines()
    said = orjson.loads(line)
    assert [a["outcome"] for a in said["answers"]] == ["DUPLICATE"] * P
    assert [a["partition"] for a in said["answers"]] == list(range(P))
    assert said["unanswered"] == []
    # Sent again once more, a node taking the partitions afresh (they read the ids again).
    with_node(monkeypatch, tmp_path, log, nothing)
    result = invoke("skip", OWNER, "--request-id", "skip-1")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"skipped 0 timers of shop.order parked on {OWNER} in 0 of 2 partitions; 2 partitions "
        "had carried it out before under this request id (DUPLICATE: nothing done again) "
        "(request skip-1)"
    ]


def test_a_target_with_nothing_parked_is_answered_by_every_partition(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with_node(monkeypatch, tmp_path, MemoryLog(), nothing)
    result = invoke("skip", OTHER, "--request-id", "skip-2")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"skipped 0 timers of shop.order parked on {OTHER} in 0 of 2 partitions (request skip-2)"
    ]


def test_a_failed_request_is_said_with_its_partitions_escaped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from app.node import cycle_timers

    async def failing(*args: object, **kwargs: object) -> int:
        raise ValueError("refused\x1b[2J")

    monkeypatch.setattr(cycle_timers, "carry_out", failing)
    with_node(monkeypatch, tmp_path, MemoryLog(), nothing)
    result = invoke("retry", OWNER, "--request-id", "retry-3")
    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines()[:2] == [
        "partition 0: FAILED: refused\\x1b[2J",
        "partition 1: FAILED: refused\\x1b[2J",
    ]
    assert "failed in partitions 0, 1 (dead-lettered" in result.stderr
    assert "send it under a new --request-id" in result.stderr


def test_partitions_with_no_owner_are_named_as_not_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = MemoryLog(node_topics([ORDERS], P))  # made by a worker, which is gone
    monkeypatch.setattr(app.cli.timers, "clients_for", lambda settings: log)
    result = invoke("retry", OWNER, "--request-id", "retry 4", "--wait", "0.2")
    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines() == [
        f"retried 0 timers of shop.order parked on {OWNER} in 0 of 2 partitions; 0 of 2 "
        "answered (request retry 4)"
    ]
    line = result.stderr.splitlines()[-1]  # after the log's lines
    assert line == (
        "error: no answer within 0.2 s from partitions 0, 1 of 2: the request may still be "
        "carried out there; send it again with --request-id 'retry 4' to learn it (each "
        "partition carries it out at most once: a copy it carried out answers DUPLICATE)"
    )
    sent = [decode(TimerOp, r.value) for p in range(P) for r in log.records(ORDERS.timer_ops, p)]
    assert [op.request_id for op in sent] == ["retry 4"] * P


def test_no_results_topic_is_said_and_the_request_is_sent_all_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = MemoryLog([TopicSpec(ORDERS.events, P), TopicSpec(ORDERS.timer_ops, P)])
    monkeypatch.setattr(app.cli.timers, "clients_for", lambda settings: log)
    result = invoke("skip", OWNER, "--request-id", "skip-5", "--wait", "5")
    assert result.exit_code == 1, result.output
    assert f"(topic {RESULTS} does not exist: no worker of the context" in result.stderr
    assert sum(len(log.records(ORDERS.timer_ops, p)) for p in range(P)) == P


@pytest.mark.parametrize("action", ["retry", "skip"])
@pytest.mark.parametrize("wait", ["0", "5"])
def test_a_mistyped_type_is_refused_and_no_topic_is_made(
    monkeypatch: pytest.MonkeyPatch, action: str, wait: str
) -> None:
    """`timers retry --type shpo.order`: its timer-ops topic was made (of
    TICKWHEEL_PARTITIONS) and the request said sent, exit 0."""
    log = MemoryLog(node_topics([ORDERS], P))
    before = log.topic_names()
    monkeypatch.setattr(app.cli.timers, "clients_for", lambda settings: log)
    args = ["timers", action, "--type", "shpo.order", "--target-id", "x", "--wait", wait]
    result = CliRunner().invoke(cli, [*args, "--bootstrap", "b:1"])
    assert result.exit_code == 1, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith(
        "error: unknown type shpo.order: topics shpo.order.events and shpo.order.timer-ops "
        "do not exist at "
    ), line
    assert line.endswith("nothing was created or sent"), line  # not "sent or not, …"
    assert log.topic_names() == before


def test_no_wait_sends_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    log = MemoryLog(node_topics([ORDERS], P))
    monkeypatch.setattr(app.cli.timers, "clients_for", lambda settings: log)
    result = invoke("retry", OWNER, "--request-id", "retry-6", "--wait", "0")
    assert result.exit_code == 0, result.output
    assert "requested (request retry-6, 2 partition(s))" in result.stdout


# --- readers of the results topic -----------------------------------------------------------


def an_answer() -> bytes:
    op = new_op(TimerAction.RETRY, OWNER, now=T0, request_id="r-1")
    value = answer_record("shop.order", op, 0, 7, OpOutcome.DONE, partitions=1, now=T0, changed=1)[
        3
    ]
    assert value is not None
    return value


def test_an_answer_is_no_commands_result() -> None:
    """Whatever its request id, a reader of results never takes it for a send's answer."""
    with pytest.raises(BadRecord, match="aggregate"):
        decode(CommandResult, an_answer())


async def test_a_nodes_results_reader_passes_answers_over_in_silence(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = MemoryLog([TopicSpec(RESULTS, 1)])
    reader = ResultsReader(log.follower, "shop")
    await reader.start()
    await reader.add_partition(0)
    try:
        waiting = reader.expect("r-1", OWNER)
        with caplog.at_level(logging.WARNING, "app.timers.sender"):
            await log.publisher().send(RESULTS, b"r-1", an_answer(), 0)
            await log.publisher().send(RESULTS, b"r-1", b"{not json", 0)
            await wait_until(lambda: "unreadable result" in caplog.text)
    finally:
        await reader.stop()
    assert not waiting.done() or waiting.cancelled()
    said = [r.getMessage() for r in caplog.records if "unreadable result" in r.getMessage()]
    assert len(said) == 1 and "@1: " in said[0], said


async def test_answers_wait_cut_keeps_what_came() -> None:
    """Without an owner, the wait ends at its bound with no answer, the request sent."""
    log = MemoryLog(node_topics([ORDERS], P))
    op = new_op(TimerAction.SKIP, OWNER, now=T0, request_id="s-1")
    answered = await asyncio.wait_for(request_answered(log, "shop.order", op, P, 0.1), 5)
    assert answered.missing == [0, 1] and answered.answers == {}


async def test_an_answer_written_after_the_owners_does_not_replace_it() -> None:
    """An owner answers a copy once; another producer's answer after it (a forged DONE
    over a FAILED) is not the one the wait tells, nor one of another action."""
    log = MemoryLog(node_topics([ORDERS], P))
    op = new_op(TimerAction.RETRY, OWNER, now=T0, request_id="r-9")

    async def owners() -> None:
        await wait_until(lambda: all(log.records(ORDERS.timer_ops, p) for p in range(P)))
        publisher = log.publisher()
        for p in range(P):
            at = log.records(ORDERS.timer_ops, p)[0].offset
            first = OpOutcome.FAILED if p == 0 else OpOutcome.DONE
            for outcome, request in ((first, op), (OpOutcome.DONE, op)):
                out = answer_record(
                    "shop.order", request, p, at, outcome, partitions=P, now=T0, changed=p
                )
                await publisher.send(out[0], out[2], out[3], out[1])
        skip = op.model_copy(update={"action": TimerAction.SKIP})
        out = answer_record("shop.order", skip, 1, 0, OpOutcome.FAILED, partitions=P, now=T0)
        await publisher.send(out[0], out[2], out[3], out[1])

    answering = asyncio.create_task(owners())
    answered = await asyncio.wait_for(request_answered(log, "shop.order", op, P, 5), 10)
    await answering
    assert {p: a.outcome for p, a in answered.answers.items()} == {
        0: OpOutcome.FAILED,
        1: OpOutcome.DONE,
    }
