"""A `wow.ScheduleSet` is taken only if its timer's records can be written and read back
(`app.timers.timer_sizes.oversized`): the command it sends within the record bound (and,
with its key, what a topic of the broker's defaults takes), its changelog row within what
such a topic takes. Before, an event within the bound was stored whatever its timer's
records came to: its in-process command record dead-lettered on every firing, its remote
command refused by its target, a row over 1 MiB failing its partition's transaction at
every retake."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from fakes import CommitLog
from pydantic import BaseModel

from app.commands.intake import read_command
from app.commands.processor import CommandProcessor
from app.errors import BadRecord
from app.kafka import Record
from app.kafka.records import BROKER_MAX_MESSAGE_BYTES, RECORD_FRAMING, TOPIC_RECORD_BYTES
from app.model.aggregate import AggregateType, Command, Decision
from app.protocol.limits import DEFAULT_MAX_RECORD_BYTES, InputLimits
from app.protocol.topics import ContextTopics
from app.protocol.wire import (
    IN_PROCESS_HEADERS,
    MAX_PARTITION,
    CommandEnvelope,
    ResultCode,
    decode_event,
    encode,
)
from app.timers.sender import timer_command
from app.timers.subscription import CancelTimer, PutTimer, timer_op
from app.timers.timer_sizes import NOT_BODY, ROW_GROWTH, oversized
from tables import AggregateRef, Timer, TimerStatus
from tables.aggregate_store import MemoryAggregateStore
from tables.bounds import MAX_INSTANT, MAX_INT64
from tables.keys import encode_timer, row_key
from tables.partitioner import partition_of
from tables.rules import MAX_JITTER
from tables.timer import MAX_ERROR_TEXT

MIB = 1 << 20
WIDE = "\x01"  # written `\u0001`: six bytes of JSON, the most a character takes


def ref(id: str = "o", **fields: str) -> dict[str, str]:
    return {"context": "shop", "aggregate": "order", "id": id, **fields}


def event(pad: int, owner: dict[str, str] | None = None, **body: Any) -> bytes:
    command = {"type": "C", "body": {"x": "a" * pad}}
    schedule = {"key": "k", "rule": {"kind": "once", "at": 1}, "command": command, **body}
    return orjson.dumps(
        {
            "id": "e",
            "type": "wow.ScheduleSet",
            "aggregate": owner or ref(),
            "version": 1,
            "created_at": 0,
            "body": schedule,
        }
    )


def padded_to(size: int, **kw: Any) -> bytes:
    raw = event(size - len(event(0, **kw)), **kw)
    assert len(raw) == size
    return raw


def op_of(raw: bytes, bound: int = DEFAULT_MAX_RECORD_BYTES) -> PutTimer:
    """The set's timer; `BadRecord` with why when it is refused (its key's timer then
    cancelled, `CancelTimer.refused`)."""
    op = timer_op(decode_event(raw, bound)[0], 0, bound)
    if isinstance(op, CancelTimer) and op.refused is not None:
        raise BadRecord(op.refused)
    assert isinstance(op, PutTimer)
    return op


def widest() -> Timer:
    """A timer with every field but its command's body at its widest."""
    wide = {"context": "c" * 100, "aggregate": "a" * 100, "tenant": WIDE * 200, "id": WIDE * 500}
    return Timer.model_validate(
        {
            "id": WIDE * 200,
            "owner": wide,
            "key": WIDE * 200,
            "version": MAX_INT64,
            "partition": MAX_PARTITION,
            "status": "PARKED",
            "rule": {
                "kind": "cron",
                "expr": ",".join(str(m) for m in range(60)) + " * * * *",
                "zone": "America/Argentina/ComodRivadavia",
                "start": MAX_INSTANT,
                "until": MAX_INSTANT,
                "count": MAX_INT64,
                "jitter": MAX_JITTER,
                "coalesce": False,
            },
            "target": {**wide, "context": "t" * 100},
            "command": {"type": WIDE * 200, "body": {}},
            "slot": MAX_INT64,
            "slot_due_at": MAX_INSTANT,
            "due_at": MAX_INT64,
            "attempts": MAX_INT64,
            "skipped": MAX_INT64,
            "outcome": "DUPLICATE",
            "error_code": WIDE * 100,
            "error_text": WIDE * MAX_ERROR_TEXT,
            "parked_when_paused": True,
            "retry_until": MAX_INT64,
            "cancel_id": WIDE * 200,
        }
    )


def test_the_widest_timer_besides_its_body_is_within_not_body() -> None:
    t = widest()
    command = timer_command(
        t,
        MAX_INSTANT,
        reply_to=ContextTopics(t.target.context).results,
        reply_partition=MAX_PARTITION,
    )
    assert len(encode_timer(t)) + len(row_key(t.owner, t.key)) < NOT_BODY
    assert len(encode(command)) + len(t.target.id.encode()) < NOT_BODY


def test_what_a_row_gains_after_it_is_set_is_within_row_growth() -> None:
    t = widest()
    fresh = t.model_copy(
        update={
            "status": TimerStatus.PENDING,
            "version": 0,
            "slot": 0,
            "due_at": 0,
            "attempts": 0,
            "skipped": 0,
            "outcome": None,
            "error_code": None,
            "error_text": None,
            "parked_when_paused": False,
            "retry_until": None,
            "cancel_id": None,
        }
    )
    assert len(encode_timer(t)) - len(encode_timer(fresh)) <= ROW_GROWTH


def test_a_record_with_its_key_is_what_a_default_topic_takes() -> None:
    assert TOPIC_RECORD_BYTES == BROKER_MAX_MESSAGE_BYTES - RECORD_FRAMING


def test_a_set_at_the_bound_whose_command_is_over_it_is_refused() -> None:
    """Its target the owner: its command holds the owner's ref and more than the event."""
    raw = padded_to(DEFAULT_MAX_RECORD_BYTES)
    with pytest.raises(BadRecord, match="the command its timer sends would be a record of"):
        op_of(raw)
    # The key's timer cancelled at the set's version, as the set would have replaced it.
    event = decode_event(raw)[0]
    op = timer_op(event, 0)
    assert isinstance(op, CancelTimer)
    assert (op.owner, op.key, op.version) == (event.aggregate, "k", event.version)


def test_every_set_taken_sends_a_command_its_node_reads_back() -> None:
    """The largest event taken: its in-process record, and its send, are read back."""
    lo, hi = 0, DEFAULT_MAX_RECORD_BYTES
    while lo < hi:  # the largest event size taken
        mid = (lo + hi + 1) // 2
        try:
            op_of(padded_to(mid))
            lo = mid
        except BadRecord:
            hi = mid - 1
    assert DEFAULT_MAX_RECORD_BYTES - 200 < lo < DEFAULT_MAX_RECORD_BYTES
    t = op_of(padded_to(lo)).timer
    sent = [
        timer_command(t, MAX_INSTANT, in_process=True),
        timer_command(t, MAX_INSTANT, reply_to="shop.results", reply_partition=MAX_PARTITION),
    ]
    for cmd, headers in zip(sent, [IN_PROCESS_HEADERS, ()], strict=True):
        record = Record("shop.order.commands", 0, 0, b"o", encode(cmd), 0, headers)
        assert read_command(record, "shop.order", InputLimits(), 1).request_id == "e#0"


def test_a_set_whose_row_is_over_what_a_default_topic_takes_is_refused() -> None:
    """At the largest bound (1 MiB), a command within it whose row (the owner's long
    fields twice, its target the owner) is not."""
    owner = {**ref("i" * 400), "tenant": "t" * 200, "context": "c" * 100}
    raw = padded_to(1_040_000, owner=owner)
    with pytest.raises(BadRecord, match="its row in the timer table's changelog would be"):
        op_of(raw, MIB)
    t = op_of(padded_to(1_030_000, owner=owner), MIB).timer
    assert oversized(t, MIB) is None


class Note(BaseModel):
    grown: int = 0


notes = AggregateType("shop", "note", Note)


@notes.command("Grow")
def _grow(state: Note, cmd: Command, d: Decision) -> None:
    d.emit("Grown", {"text": "z" * int(cmd.body["n"])})


@notes.applies("Grown")
def _grown(state: Note, e: Any) -> Note:
    return Note(grown=state.grown + 1)


async def test_a_decisions_record_with_its_key_over_a_default_topic_is_refused() -> None:
    """At the largest bound, an event within it whose aggregate's id (its key: 500
    characters of four bytes) takes it past what a topic of the broker's defaults takes:
    answered ERROR, nothing written (before, the partition's commit failed for good)."""
    note = AggregateRef(context="shop", aggregate="note", id="\U0001d11e" * 500)
    p = partition_of(note.id, 4)
    log = CommitLog()
    limits = InputLimits(max_record_bytes=MIB)
    proc = CommandProcessor(
        notes,
        p,
        partitions=4,
        states=MemoryAggregateStore(),
        commit=log,
        now=lambda: 0,
        limits=limits,
    )
    records = []
    for offset, n in enumerate([MIB - 4000, 1000]):
        cmd = CommandEnvelope(
            request_id=f"r-{offset}", type="Grow", aggregate=note, issued_at=0, body={"n": n}
        )
        value = encode(cmd)
        records.append(Record("shop.note.commands", p, offset, note.id.encode(), value, 0))
    await proc.handle(records)
    results = log.last("results")
    assert [r["code"] for r in results] == [ResultCode.ERROR, ResultCode.COMMITTED]
    assert "what a topic of the broker's defaults takes" in results[0]["message"]
    assert [e["request_id"] for e in log.last("events")] == ["r-1"]
