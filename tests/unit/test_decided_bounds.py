"""What a decision writes stays within a record's bound (`TICKWHEEL_MAX_RECORD_BYTES`).

A handler's exception text, a refusal's reason or an event's body has no bound of its own:
written whole, a record over Kafka's limit fails the partition's transaction, the partition
is taken afresh and the same command fails again, for ever. Error texts are cut where they
are built; a decision that would still write too large a record is answered ERROR and
dead-lettered, the aggregate as it was, and the batch goes on. So is one whose aggregate
holds a number JSON cannot (NaN, infinity): written as null, it could not be read back.
"""

from __future__ import annotations

from typing import Any

import pytest
from fakes import CommitLog
from pydantic import BaseModel

from app.commands.processor import CommandProcessor, state_key
from app.jobs import (
    RUN_FAILED,
    TICK,
    Job,
    JobRun,
    JobScope,
    disable_command,
    enable_command,
    ref_of,
    schedule_aggregate,
    trigger_command,
)
from app.kafka import Record
from app.model.aggregate import AggregateType, Command, Decision
from app.model.decide import StoredAggregate, fold
from app.protocol.limits import InputLimits
from app.protocol.wire import CommandEnvelope, EventEnvelope, ResultCode, encode
from tables import AggregateRef, IntervalRule
from tables.aggregate_store import MemoryAggregateStore
from tables.partitioner import partition_of
from tables.slots import first_slot
from tables.timer import CUT_MARKER, MAX_ERROR_TEXT

T0 = 1_800_000_000_000
PARTITIONS = 4
HUGE = "x" * 1_500_000
LIMIT = InputLimits().max_record_bytes


def within_bounds(log: CommitLog) -> None:
    for records in log.commits:
        for r in records:
            assert r[3] is None or len(r[3]) <= LIMIT, (r[0], len(r[3]))


def failing(run: JobRun) -> None:
    raise ValueError("upstream said: " + HUGE)


JOB = Job("nightly", JobScope.SYSTEM, IntervalRule(start=0, every=60_000), failing)
REF = ref_of("ops", JOB)
P = partition_of(REF.id, PARTITIONS)


def job_processor() -> tuple[CommandProcessor, CommitLog]:
    log = CommitLog()
    agg = schedule_aggregate("ops", [JOB], PARTITIONS)
    states = MemoryAggregateStore()
    return CommandProcessor(
        agg, P, partitions=PARTITIONS, states=states, commit=log, now=lambda: T0
    ), log


def record(cmd: CommandEnvelope, offset: int) -> Record:
    topic = f"{cmd.aggregate.context}.{cmd.aggregate.aggregate}.commands"
    p = partition_of(cmd.aggregate.id, PARTITIONS)
    return Record(topic, p, offset, cmd.aggregate.id.encode(), encode(cmd), T0)


async def test_a_failing_job_handler_writes_its_error_cut() -> None:
    proc, log = job_processor()
    await proc.handle([record(enable_command("ops", JOB, now=T0, request_id="en-1"), 0)])
    stored = proc._states.stored(state_key(REF))
    assert stored is not None
    timer_id = stored.state["timer_id"]
    # The timer's own send of its slot due at T0 (a tick off its slots is refused).
    slot = first_slot(JOB.rule, T0)
    assert slot is not None and slot.due_at == T0
    tick = CommandEnvelope(
        request_id=f"{timer_id}#{slot.index}",
        type=TICK,
        aggregate=REF,
        issued_at=T0,
        not_before=slot.due_at,
    )
    await proc.handle([record(tick, 1)])
    within_bounds(log)
    [failed] = [e for e in log.last("events") if e["type"] == RUN_FAILED]
    assert len(failed["body"]["error"]) <= MAX_ERROR_TEXT
    assert failed["body"]["error"].startswith("ValueError('upstream said: xxx")
    assert failed["body"]["error"].endswith(CUT_MARKER)
    [result] = log.last("results")
    assert result["code"] == ResultCode.COMMITTED

    # Its triggered run fails too: answered ERROR, with the error cut.
    await proc.handle([record(trigger_command("ops", JOB, now=T0, request_id="tr-1"), 2)])
    within_bounds(log)
    [result] = log.last("results")
    assert result["code"] == ResultCode.ERROR
    assert "failed on its triggered run: ValueError('upstream said" in result["message"]
    assert len(result["message"]) <= MAX_ERROR_TEXT

    # The instance goes on.
    await proc.handle([record(disable_command("ops", JOB, now=T0, request_id="dis-1"), 3)])
    [result] = log.last("results")
    assert result["code"] == ResultCode.COMMITTED


class Note(BaseModel):
    text: str = ""


notes = AggregateType("shop", "note", Note)


@notes.command("shop.Write")
def write(state: Note, cmd: Command, d: Decision) -> None:
    d.emit("shop.Written", {"text": cmd.body.get("text", "")})


@notes.command("shop.Grow")
def grow(state: Note, cmd: Command, d: Decision) -> None:
    # A small command whose decision writes a large event.
    d.emit("shop.Written", {"text": "z" * int(cmd.body["n"])})


@notes.command("shop.Refuse")
def refuse(state: Note, cmd: Command, d: Decision) -> None:
    d.reject("no: " + HUGE)


@notes.command("shop.Crash")
def crash(state: Note, cmd: Command, d: Decision) -> None:
    raise RuntimeError(HUGE)


@notes.applies("shop.Written")
def written(state: Note, e: Any) -> Note:
    return Note(text=state.text + e.body["text"])


NOTE = AggregateRef(context="shop", aggregate="note", id="n-1")


def note(request_id: str, type_: str, **body: Any) -> CommandEnvelope:
    return CommandEnvelope(
        request_id=request_id, type=type_, aggregate=NOTE, issued_at=T0, body=body
    )


def note_processor() -> tuple[CommandProcessor, CommitLog, MemoryAggregateStore]:
    log, states = CommitLog(), MemoryAggregateStore()
    p = partition_of(NOTE.id, PARTITIONS)
    proc = CommandProcessor(
        notes, p, partitions=PARTITIONS, states=states, commit=log, now=lambda: T0
    )
    return proc, log, states


async def test_refusal_and_failure_texts_are_cut_in_results() -> None:
    proc, log, _ = note_processor()
    await proc.handle(
        [
            record(note("r-1", "shop.Refuse"), 0),
            record(note("r-2", "shop.Crash"), 1),
            record(note("r-3", "shop.Write", text="ok"), 2),
        ]
    )
    within_bounds(log)
    results = log.last("results")
    assert [(r["request_id"], r["code"]) for r in results] == [
        ("r-1", ResultCode.REJECTED),
        ("r-2", ResultCode.ERROR),
        ("r-3", ResultCode.COMMITTED),
    ]
    assert results[0]["message"].startswith("no: xxx")
    assert results[0]["message"].endswith(CUT_MARKER)
    assert results[1]["message"].startswith("RuntimeError: xxx")
    assert all(len(r["message"]) <= MAX_ERROR_TEXT for r in results)


async def test_an_event_over_the_record_bound_is_answered_error_and_dead_lettered() -> None:
    proc, log, _ = note_processor()
    await proc.handle(
        [
            record(note("r-1", "shop.Grow", n=1_500_000), 0),
            record(note("r-2", "shop.Write", text="ok"), 1),
        ]
    )
    within_bounds(log)
    results = log.last("results")
    assert [(r["request_id"], r["code"]) for r in results] == [
        ("r-1", ResultCode.ERROR),
        ("r-2", ResultCode.COMMITTED),
    ]
    assert "TICKWHEEL_MAX_RECORD_BYTES" in results[0]["message"]
    assert results[1]["version"] == 1  # the refused decision left the aggregate as it was
    assert len(log.last("dead-letters")) == 1
    assert [e["request_id"] for e in log.last("events")] == ["r-2"]
    stored = proc._states.stored(state_key(NOTE))
    assert stored is not None and stored.state == {"text": "ok"}


async def test_an_aggregate_grown_over_the_record_bound_still_takes_commands() -> None:
    """No record holds an aggregate (it is folded from its events), so its size is not a
    record's: one larger than the bound, by events each within it, is stored and takes
    its next command."""
    proc, log, _ = note_processor()
    third = LIMIT // 3 + 100
    cmds = [note(f"r-{i}", "shop.Grow", n=third) for i in range(4)]
    await proc.handle([record(c, i) for i, c in enumerate(cmds)])
    within_bounds(log)
    assert [r["code"] for r in log.last("results")] == [ResultCode.COMMITTED] * 4
    stored = proc._states.stored(state_key(NOTE))
    assert stored is not None and stored.version == 4


class Tally(BaseModel):
    n: int = 0
    deep: list[Any] = []
    seen: int = 0


tallies = AggregateType("shop", "tally", Tally)


@tallies.applies("shop.Seen")
def seen(state: Tally, e: Any) -> Tally:
    return state.model_copy(update={"seen": state.seen + 1})


async def test_a_stored_state_a_record_could_not_hold_takes_its_next_event() -> None:
    """An integer past signed 64 bits (orjson writes up to 2**64) or deep nesting, which a
    record's body may not hold: stored before, the aggregate takes further events."""
    deep: list[Any] = []
    for _ in range(80):
        deep = [deep]
    stored = StoredAggregate(version=3, state={"n": (1 << 64) - 1, "deep": deep, "seen": 0})
    event = EventEnvelope(
        id="e-4",
        type="shop.Seen",
        aggregate=AggregateRef(context="shop", aggregate="tally", id="t-1"),
        version=4,
        created_at=T0,
    )
    folded = fold(tallies, stored, [event])
    assert folded.version == 4 and folded.state["seen"] == 1
    assert folded.state["n"] == (1 << 64) - 1
    assert len(encode(folded)) > 0  # written as before


class Account(BaseModel):
    ratio: float = 0.0


accounts = AggregateType("bank", "account", Account)


@accounts.command("bank.Set")
def set_ratio(state: Account, cmd: Command, d: Decision) -> None:
    d.emit("bank.Set", cmd.body)


@accounts.applies("bank.Set")
def ratio_set(state: Account, e: Any) -> Account:
    # pydantic takes "nan" and "inf" for a float: JSON holds neither.
    return state.model_copy(update={"ratio": float(e.body["ratio"])})


ACCOUNT = AggregateRef(context="bank", aggregate="account", id="a-1")


@pytest.mark.parametrize("ratio", ["nan", "inf", "-inf"])
async def test_a_state_with_a_number_json_cannot_hold_is_not_stored(ratio: str) -> None:
    log, states = CommitLog(), MemoryAggregateStore()
    p = partition_of(ACCOUNT.id, PARTITIONS)
    proc = CommandProcessor(
        accounts, p, partitions=PARTITIONS, states=states, commit=log, now=lambda: T0
    )

    def set_to(request_id: str, value: str) -> CommandEnvelope:
        return CommandEnvelope(
            request_id=request_id,
            type="bank.Set",
            aggregate=ACCOUNT,
            issued_at=T0,
            body={"ratio": value},
        )

    await proc.handle([record(set_to("r-1", ratio), 0), record(set_to("r-2", "0.5"), 1)])
    results = log.last("results")
    assert [(r["request_id"], r["code"]) for r in results] == [
        ("r-1", ResultCode.ERROR),
        ("r-2", ResultCode.COMMITTED),
    ]
    assert "is not a finite number" in results[0]["message"]
    assert len(log.last("dead-letters")) == 1
    stored = proc._states.stored(state_key(ACCOUNT))
    assert stored is not None and stored.state == {"ratio": 0.5} and stored.version == 1
