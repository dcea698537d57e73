"""A decision's system events (`wow.*`) are checked as the node's own subscription will take
them (`app.timers.decided_ops.decided_timer_op`, bound by the node): one it would refuse
(a key or target holding a control character, a raw body it cannot read, a timer too large
to store, a `wow.` type the aggregate has no place for) once was answered COMMITTED, then
dead-lettered with no timer set, the timer it replaced left firing by its old rule. It is
answered ERROR now, nothing of the decision written."""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from fakes import T0, CommitLog, RunningNode, wait_until
from pydantic import BaseModel
from test_timer_sizes import padded_to

from app.commands.processor import CommandProcessor
from app.errors import BadRecord
from app.kafka import Record
from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType, Command, Decision
from app.protocol.limits import DEFAULT_MAX_RECORD_BYTES, InputLimits
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import CommandEnvelope, CommandResult, decode, decode_event, encode
from app.service import Service
from app.timers.decided_ops import decided_timer_op
from app.timers.subscription import CancelTimer, PutTimer, timer_op
from tables import AggregateRef, CommandSpec, IntervalRule, OnceRule
from tables.aggregate_store import MemoryAggregateStore
from tables.partitioner import partition_of

N = 4
OWNER_FIELDS = {"context": "dx", "aggregate": "thing", "id": "o1"}
OWNER = AggregateRef(**OWNER_FIELDS)
P = partition_of(OWNER.id, N)


class S(BaseModel):
    n: int = 0


thing = AggregateType("dx", "thing", S)


@thing.command("Sched")
def _sched(state: S, cmd: Command, d: Decision) -> None:
    body = cmd.body
    target = (
        None if "target" not in body else AggregateRef(**{**OWNER_FIELDS, "id": body["target"]})
    )
    rule: Any = OnceRule(at=body["at"])
    if "until" in body:
        rule = IntervalRule(every=1000, start=body["at"], until=body["until"])
    command = CommandSpec(type="Noop")
    d.schedule(body["key"], rule, command, target)


@thing.command("Emit")
def _emit(state: S, cmd: Command, d: Decision) -> None:
    d.emit("Nooped", {})
    d.emit(cmd.body["type"], cmd.body["body"])


@thing.command("Noop")
def _noop(state: S, cmd: Command, d: Decision) -> None:
    d.emit("Nooped", {})


def processor(max_record_bytes: int = 256 * 1024) -> CommandProcessor:
    """A partition's processor as the node makes it (`app.node.partition_open`)."""
    check = functools.partial(decided_timer_op, partition=P, max_record_bytes=max_record_bytes)
    return CommandProcessor(
        thing,
        P,
        partitions=N,
        states=MemoryAggregateStore(),
        commit=CommitLog(),
        now=lambda: T0,
        limits=InputLimits(max_record_bytes=max_record_bytes),
        timer_op=check,
    )


def record(type_: str, body: dict[str, Any], offset: int = 0) -> Record:
    cmd = CommandEnvelope(
        request_id=f"r-{offset}", type=type_, aggregate=OWNER, body=body, issued_at=T0
    )
    return Record("dx.thing.commands", P, offset, b"o1", encode(cmd), T0, ())


def decided(proc: CommandProcessor, type_: str, body: dict[str, Any]) -> tuple[str, str, list[str]]:
    """The command's code and message, and the topics its batch wrote."""
    batch = proc.begin()
    proc.decide_records(batch, [record(type_, body)])
    [result] = [orjson.loads(r[3] or b"") for r in batch.out if r[0] == "dx.results"]
    return result["code"], result.get("message", ""), [r[0] for r in batch.out]


LATER = T0 + 3_600_000


@pytest.mark.parametrize(
    ("type_", "body", "why"),
    [
        ("Sched", {"key": "k\n2", "at": LATER}, "key: Value error, holds the control character"),
        ("Sched", {"key": "k", "at": LATER, "target": "o\x01"}, "target.id: Value error"),
        ("Emit", {"type": "wow.ScheduleSet", "body": {"key": "k"}}, "rule: Field required"),
        ("Emit", {"type": "wow.ScheduleCancelled", "body": {}}, "key: Field required"),
        ("Emit", {"type": "wow.Foo", "body": {}}, "unknown system event type 'wow.Foo'"),
    ],
)
def test_a_decision_whose_timer_event_the_node_would_refuse_is_answered_error(
    type_: str, body: dict[str, Any], why: str
) -> None:
    code, message, topics = decided(processor(), type_, body)
    assert code == "ERROR" and why in message, message
    assert topics == ["dx.results", "dx.dead-letters"], "no event of it written"


def test_a_timer_too_large_to_store_is_refused_not_committed_then_cancelled() -> None:
    """The subscription would cancel the key's timer and dead-letter the set: refused as it
    is decided, the old timer stays as it was and the sender hears why."""
    event = decode_event(padded_to(DEFAULT_MAX_RECORD_BYTES))[0]
    refused = timer_op(event, 0)
    assert isinstance(refused, CancelTimer) and refused.refused is not None
    with pytest.raises(BadRecord, match="the command its timer sends would be a record of"):
        decided_timer_op(event, T0, partition=0, max_record_bytes=DEFAULT_MAX_RECORD_BYTES)


def test_what_the_subscription_takes_is_committed_its_op_carried_with_the_batch() -> None:
    proc = processor()
    batch = proc.begin()
    ended = {"key": "e", "at": T0 - 10_000, "until": T0 - 5_000}  # set again, ended: a cancel
    proc.decide_records(
        batch, [record("Sched", {"key": "k", "at": LATER}, 0), record("Sched", ended, 1)]
    )
    codes = [orjson.loads(r[3] or b"")["code"] for r in batch.out if r[0] == "dx.results"]
    assert codes == ["COMMITTED", "COMMITTED"]
    [(_, put), (_, cancel)] = batch.take_timer_events()
    assert isinstance(put, PutTimer) and put.timer.key == "k"
    assert isinstance(cancel, CancelTimer) and cancel.key == "e" and cancel.refused is None


def test_a_timer_fired_in_process_whose_decision_the_node_would_refuse_is_error() -> None:
    proc = processor()
    batch = proc.begin()
    cmd = CommandEnvelope(
        request_id="t#0",
        type="Sched",
        aggregate=OWNER,
        body={"key": "\x7f", "at": LATER},
        issued_at=T0,
        in_process=True,
    )
    [(_, code, message)] = proc.decide_local(batch, [cmd])
    assert code == "ERROR" and "control character" in message
    assert [r[0] for r in batch.out] == ["dx.thing.commands"], "the record of what was sent"
    assert batch.take_timer_events() == []


async def test_a_node_answers_a_reschedule_it_would_refuse_error_and_keeps_the_old_timer(
    tmp_path: Path,
) -> None:
    log = MemoryLog()
    topics = AggregateTopics("dx", "thing")
    node = await RunningNode(log, tmp_path, "a", Service(aggregates=(thing,)), 2).start()
    try:
        await wait_until(node.runs)
        p = partition_of("o1", 2)
        later = int(time.time() * 1000) + 3_600_000
        for rid, body in [
            ("r-1", {"key": "k", "at": later}),
            ("r-2", {"key": "k", "at": later + 1, "target": "o\x01"}),
        ]:
            cmd = CommandEnvelope(
                request_id=rid,
                type="Sched",
                aggregate=OWNER,
                body=body,
                issued_at=int(time.time() * 1000),
            )
            await log.publisher().send(topics.commands, b"o1", encode(cmd), p)

        def codes() -> dict[str, str]:
            return {
                (res := decode(CommandResult, r.value)).request_id: res.code.value
                for q in range(2)
                for r in log.records(ContextTopics("dx").results, q)
            }

        await wait_until(lambda: len(codes()) == 2)
        assert codes() == {"r-1": "COMMITTED", "r-2": "ERROR"}
        assert len(log.records(topics.events, p)) == 1, "r-2 wrote no event"
        rows = [orjson.loads(r.value) for r in log.records(topics.timers_changelog, p) if r.value]
        timers = [(t["key"], t["target"]["id"], t["status"]) for t in rows if "key" in t]
        assert timers[-1] == ("k", "o1", "PENDING")
    finally:
        await node.stop()
