"""What the node's own topics take of a record, read at its start
(`app.node.opening.topic_record_bytes`: those that take less than a topic of the broker's
defaults), bounds what it writes: a decision's records (`check_sizes`, an in-process
timer's decision and command too) and a timer's row and command (`timer_sizes.oversized`). Before,
both were bounded by what a topic of the broker's defaults takes (`TOPIC_RECORD_BYTES`)
whatever the topic's own `max.message.bytes`; at the defaults nothing changes."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from pydantic import BaseModel

from app.commands.batch import CommandBatch
from app.commands.processor import CommandProcessor
from app.commands.records import check_sizes
from app.errors import RecordTooLarge
from app.kafka import OutRecord
from app.kafka.producers import transaction_batch_bytes
from app.kafka.records import BROKER_MAX_MESSAGE_BYTES, RECORD_FRAMING, TOPIC_RECORD_BYTES
from app.model.aggregate import AggregateType, Command, Decision, Event
from app.node.opening import topic_record_bytes, transaction_batch_limits, written_topics
from app.protocol.limits import InputLimits
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import CommandEnvelope, EventEnvelope, ResultCode
from app.timers.subscription import CancelTimer, PutTimer, timer_op
from app.timers.timer_sizes import oversized
from tables import AggregateRef, Timer
from tables.aggregate_store import MemoryAggregateStore
from tables.partitioner import partition_of

KIB = 1024
MIB = 1024 * KIB
T = AggregateTopics("shop", "order")
OTHER = AggregateTopics("shop", "invoice")
T0 = 1_800_000_000_000


def record(topic: str, size: int, key: bytes = b"o") -> OutRecord:
    return (topic, 0, key, b"x" * size)


def test_at_the_defaults_a_record_is_bounded_as_ever() -> None:
    """No topic named: each takes what a topic of the broker's defaults takes."""
    limits = InputLimits(max_record_bytes=MIB)
    check_sizes([record(T.events, TOPIC_RECORD_BYTES - 1)], limits)
    with pytest.raises(RecordTooLarge, match="what a topic of the broker's defaults takes"):
        check_sizes([record(T.events, TOPIC_RECORD_BYTES)], limits)


def test_a_record_over_what_its_own_topic_takes_is_too_large() -> None:
    limits = InputLimits(topic_record_bytes={T.events: 64 * KIB - RECORD_FRAMING})
    check_sizes([record(T.events, 64 * KIB - RECORD_FRAMING - 1)], limits)
    with pytest.raises(RecordTooLarge, match=rf"to {T.events}, over 65024 \(what the topic"):
        check_sizes([record(T.commands, 10), record(T.events, 100_000)], limits)
    # Another topic takes what it takes: here, what one of the broker's defaults does.
    check_sizes([record(T.commands, 100_000)], limits)


class S(BaseModel):
    n: int = 0


order = AggregateType("shop", "order", S)


@order.command("Grow")
def _grow(state: S, cmd: Command, d: Decision) -> None:
    d.emit("Grown", {"blob": "x" * int(cmd.body["size"])})


@order.applies("Grown")
def _grown(state: S, e: Event) -> S:
    return state.model_copy(update={"n": state.n + 1})


async def _no_commit(records: Any, offsets: Any) -> list[int]:
    raise AssertionError("not committed here")


def _fired_in_process(
    topic: str, bodies: list[dict[str, object]]
) -> tuple[CommandBatch, list[tuple[CommandEnvelope, ResultCode, str]]]:
    """A processor of `o1`'s partition whose `topic` takes 64 KiB, the batch it began, and
    what `decide_local` answers for in-process commands of `bodies`."""
    p = partition_of("o1", 4)
    limits = InputLimits(topic_record_bytes={topic: 64 * KIB - RECORD_FRAMING})
    proc = CommandProcessor(
        order,
        p,
        partitions=4,
        states=MemoryAggregateStore(),
        commit=_no_commit,
        now=lambda: T0,
        limits=limits,
    )
    batch = proc.begin()
    ref = AggregateRef(context="shop", aggregate="order", id="o1")
    fired = [
        CommandEnvelope(
            request_id=f"t{i}#0",
            type="Grow",
            aggregate=ref,
            body=body,
            issued_at=T0,
            in_process=True,
        )
        for i, body in enumerate(bodies)
    ]
    return batch, proc.decide_local(batch, fired)


def test_an_in_process_timers_event_over_its_topics_limit_is_error() -> None:
    """A timer fired in-process whose decision writes an event over what the events topic
    takes: ERROR (the timer retries it, then parks), nothing of it written but the record
    of what was sent; before, it failed its partition's transaction at every retake."""
    batch, answers = _fired_in_process(T.events, [{"size": 100_000}, {"size": 10}])
    [(_, big, message), (_, small, _)] = answers
    assert (big, small) == ("ERROR", "COMMITTED")
    assert f"to {T.events}, over 65024" in message
    events = [r for r in batch.out if r[0] == T.events]
    assert len(events) == 1 and len(events[0][3] or b"") < 1000


def test_an_in_process_command_over_its_topics_limit_is_error_and_not_written() -> None:
    """A timer stored before its commands topic took less, fired in-process: its command's
    own record is over what the topic takes: ERROR, not decided nor written (the timer
    retries it, then parks); the one after it decided. Before, its record joined the
    partition's transaction unchecked and failed it at every retake."""
    bodies: list[dict[str, object]] = [{"size": 10, "pad": "y" * pad} for pad in (100_000, 10)]
    batch, answers = _fired_in_process(T.commands, bodies)
    [(_, big, message), (_, small, _)] = answers
    assert (big, small) == ("ERROR", "COMMITTED")
    assert f"to {T.commands}, over 65024" in message
    sent = [r for r in batch.out if r[0] == T.commands]
    assert [len(r[3] or b"") < 1000 for r in sent] == [True]
    assert len([r for r in batch.out if r[0] == T.events]) == 1  # the big one's not decided


def timer(pad: int, target: AggregateTopics = T) -> Timer:
    return Timer.model_validate(
        {
            "id": "e",
            "owner": {"context": T.context, "aggregate": T.aggregate, "id": "o1"},
            "key": "k",
            "version": 1,
            "partition": 0,
            "rule": {"kind": "once", "at": T0},
            "target": {"context": target.context, "aggregate": target.aggregate, "id": "o2"},
            "command": {"type": "C", "body": {"pad": "y" * pad}},
            "slot_due_at": T0,
            "due_at": T0,
        }
    )


def test_a_timer_over_what_its_changelog_or_its_targets_commands_take_is_oversized() -> None:
    big = timer(40_000)
    assert oversized(big, 256 * KIB) is None  # the defaults: taken, as ever
    small = {T.timers_changelog: 16 * KIB - RECORD_FRAMING}
    why = oversized(big, 256 * KIB, small)
    assert why is not None and f"what {T.timers_changelog} takes, 15872 bytes" in why
    assert oversized(timer(2_000), 256 * KIB, small) is None
    # The command goes to its target's topic: another type's, of the node's own.
    to_other = timer(40_000, OTHER)
    why = oversized(to_other, 256 * KIB, {OTHER.commands: 32 * KIB - RECORD_FRAMING})
    assert why is not None and f"what {OTHER.commands} takes" in why
    assert oversized(to_other, 256 * KIB, {T.commands: 32 * KIB}) is None


def test_the_subscription_refuses_a_set_whose_row_its_changelog_would_refuse() -> None:
    """A set in the log (another writer's) whose row is over what the changelog takes
    cancels the key's timer, refused (dead-lettered): never a row the broker refuses."""
    event = EventEnvelope(
        id="e",
        type="wow.ScheduleSet",
        aggregate=AggregateRef(context="shop", aggregate="order", id="o1"),
        version=1,
        created_at=T0,
        body={
            "key": "k",
            "rule": {"kind": "once", "at": T0 + 1},
            "command": {"type": "C", "body": {"pad": "y" * 40_000}},
        },
    )
    assert isinstance(timer_op(event, 0), PutTimer)
    op = timer_op(event, 0, topic_bytes={T.timers_changelog: 16 * KIB - RECORD_FRAMING})
    assert isinstance(op, CancelTimer) and op.refused is not None
    assert "its row in the timer table's changelog" in op.refused


def test_topics_at_the_defaults_take_what_they_always_did(
    caplog: pytest.LogCaptureFixture,
) -> None:
    read = {topic: BROKER_MAX_MESSAGE_BYTES for topic in written_topics(T)}
    read[T.events] = 4 * MIB
    with caplog.at_level(logging.INFO):
        assert topic_record_bytes([T], read, MIB) == {}
        kept = topic_record_bytes([T], read, MIB)
        assert transaction_batch_bytes(transaction_batch_limits(T, kept).values()) == 512 * KIB
    assert caplog.records == []


def test_a_topic_that_takes_less_is_named_and_warned_about_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its limit less a record's framing; warned about once (its context's topics are
    its types' all) when less than the node's bound lets through."""
    results = ContextTopics(T.context).results
    read = {topic: BROKER_MAX_MESSAGE_BYTES for t in (T, OTHER) for topic in written_topics(t)}
    read |= {T.events: 64 * KIB, OTHER.timers_changelog: 300 * KIB, results: 32 * KIB}
    with caplog.at_level(logging.WARNING):
        takes = topic_record_bytes([T, OTHER], read, 256 * KIB)
    assert takes == {
        T.events: 64 * KIB - RECORD_FRAMING,
        OTHER.timers_changelog: 300 * KIB - RECORD_FRAMING,
        results: 32 * KIB - RECORD_FRAMING,
    }
    # The changelog takes more than the bound; a result is no record the bound lets through.
    [warned] = [r.getMessage() for r in caplog.records]
    assert warned.startswith(f"{T.events} takes records of 65024 bytes at most")
