"""What 0.2.0 stored with a body past the new-input bounds loads, folds and fires.

0.2.0 bounded no body: it took a timer's command body, an event's body or an unknown field
holding an integer past signed 64 bits (up to 2**64-1 in what orjson wrote, any size in
a row pydantic wrote) or nesting deeper than `MAX_DEPTH`, and stored them (timer rows on
the changelog and in RocksDB, events on the log). Since, `tables.bounds.check_json`
refuses such bodies as new input; what is read back as stored is held to
`check_stored` only (`STORED_BODIES`): such a row loads, restores and fires with its
body as stored; such an event folds as 0.2.0 folded it. New input is refused as before.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from fakes import running, wait_until
from pydantic import BaseModel, ValidationError
from test_node_fuzz import (
    PARTITIONS,
    TOPICS,
    fired,
    fuzz_node,
    letters,
    now_ms,
    owners,
    ref,
    tombstoned,
)

from app.clients.timer_book import SET_TIMER, timer_book
from app.errors import BadRecord
from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType, Event
from app.model.decide import StoredAggregate, decide, fold
from app.node import node_topics
from app.protocol.wire import (
    SCHEDULE_SET,
    CommandEnvelope,
    EventEnvelope,
    ScheduleSet,
    decode,
    decode_event,
    encode,
)
from app.timers.sender import timer_command
from tables import AggregateRef, CommandSpec, OnceRule, Timer
from tables.bounds import MAX_STORED_DEPTH, STORED_INPUT, StoredObject, check_stored
from tables.exceptions import StoreError
from tables.keys import decode_timer, encode_timer, restored_row, row_key
from tables.memory_store import MemoryTimerStore
from tables.refs import NEW_INPUT
from tables.rowcheck import restored_index, restored_index_as_is
from tables.rowload import load_timer, load_timers

T0 = 1_800_000_000_000
OWNER = AggregateRef(context="shop", aggregate="order", id="o-1")


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


PAST = {
    "u64": {"n": (1 << 64) - 1},
    "i64+1": {"n": 1 << 63, "m": [-(1 << 63)]},
    "deep70": nested(70),
}
"""Bodies 0.2.0 took and stored, which new input may not hold."""


def old_row(body: dict[str, Any], owner: AggregateRef = OWNER, key: str = "k") -> bytes:
    """A timer row as 0.2.0 wrote it: orjson of the row's dict, its body as given (one
    orjson cannot write, as pydantic's serializer, which 0.2.0 wrote rows with, wrote it)."""
    timer = Timer(
        id="e-1",
        owner=owner,
        key=key,
        version=1,
        partition=0,
        rule=OnceRule(at=T0),
        target=owner,
        command=CommandSpec(type="Pay"),
        slot_due_at=T0,
        due_at=T0,
    )
    row = timer.model_dump(mode="json", exclude_none=True)
    row["command"]["body"] = body
    try:
        return orjson.dumps(row)
    except TypeError:
        return json.dumps(row, separators=(",", ":")).encode()


@pytest.mark.parametrize("name", list(PAST))
def test_a_0_2_0_row_past_the_new_input_bounds_loads(name: str) -> None:
    body = PAST[name]
    raw = old_row(body)
    key = row_key(OWNER, "k")
    loaded = load_timer(raw, key, 0)
    assert loaded.command.body == body and type(loaded.command.body) is StoredObject
    assert load_timers([(key, raw, 0)]) == [loaded]
    # pydantic's own read (the fallback of every read, and of a restore's odd row) agrees.
    assert decode_timer(raw) == loaded and type(decode_timer(raw).command.body) is StoredObject
    # Written back as it was read (a settle, a retry), and read back the same.
    assert load_timer(encode_timer(loaded)) == loaded


@pytest.mark.parametrize("name", list(PAST))
def test_a_0_2_0_row_past_the_new_input_bounds_passes_a_restore(name: str) -> None:
    raw = old_row(PAST[name])
    key = row_key(OWNER, "k")
    assert restored_index_as_is(0, key, raw) is not None  # the restore's quick check
    _index, value = restored_index(0, key, raw)
    assert value == raw
    assert restored_row(0, key, raw).command.body == PAST[name]  # pydantic's


async def test_a_memory_store_restores_0_2_0_rows() -> None:
    store = MemoryTimerStore(1)
    await store.assign({0})
    owners_ = [OWNER.model_copy(update={"id": f"o-{name}"}) for name in PAST]
    records = [
        (i, row_key(o, "k"), old_row(body, o))
        for i, (o, body) in enumerate(zip(owners_, PAST.values(), strict=True))
    ]
    assert await store.apply_changelog(0, records) == []


def test_a_row_no_encoder_writes_back_is_still_refused() -> None:
    """A body no JSON encoder writes (an integer past 2**64-1, which no 0.2.0 node could
    send either: its encoder was orjson), or nested past `MAX_STORED_DEPTH`: no row."""
    key = row_key(OWNER, "k")
    for body in ({"n": 1 << 64}, {"n": -(1 << 63) - 1}, nested(MAX_STORED_DEPTH + 1)):
        raw = old_row(body)
        assert restored_index_as_is(0, key, raw) is None
        with pytest.raises(ValueError):
            restored_index(0, key, raw)
        with pytest.raises(StoreError, match="corrupt"):
            load_timer(raw)
    # As deep as a row's body can be read at all: a row, read alike by both.
    raw = old_row(nested(MAX_STORED_DEPTH))
    assert restored_index_as_is(0, key, raw) is not None
    assert load_timer(raw) == decode_timer(raw)


@pytest.mark.parametrize("name", list(PAST))
def test_a_stored_timer_sends_its_command_as_stored(name: str) -> None:
    timer = load_timer(old_row(PAST[name]))
    cmd = timer_command(timer, T0, in_process=True)
    assert cmd.body == PAST[name] and type(cmd.body) is dict  # a plain copy for the handler
    assert orjson.loads(encode(cmd))["body"] == PAST[name]
    # The node's record of it, read back (`in_process` with its header: passed over).
    assert decode(CommandEnvelope, encode(cmd)) == cmd
    # A record of it not in-process is new input: its target refuses it.
    sent = timer_command(timer, T0)
    with pytest.raises(BadRecord, match="not a valid CommandEnvelope"):
        decode(CommandEnvelope, encode(sent))


@pytest.mark.parametrize("name", list(PAST))
def test_new_input_past_the_bounds_is_refused_as_before(name: str) -> None:
    body = PAST[name]
    with pytest.raises(ValidationError):
        CommandSpec(type="Pay", body=body)
    with pytest.raises(ValidationError):
        CommandEnvelope(request_id="r", type="Pay", aggregate=OWNER, issued_at=T0, body=body)
    with pytest.raises(ValidationError):
        EventEnvelope(id="e", type="T", aggregate=OWNER, version=1, created_at=T0, body=body)
    with pytest.raises(ValidationError):
        EventEnvelope(id="e", type="T", aggregate=OWNER, version=1, created_at=T0, x=body)
    schedule = {
        "key": "k",
        "rule": {"kind": "once", "at": T0},
        "command": {"type": "P", "body": body},
    }
    with pytest.raises(ValidationError):
        ScheduleSet.model_validate(schedule, strict=True, context=NEW_INPUT)
    with pytest.raises(ValidationError):
        ScheduleSet.model_validate(schedule)
    # A record read from an input topic, strictly.
    event = old_event(body)
    with pytest.raises(BadRecord):
        decode(EventEnvelope, event)
    command = orjson.loads(event) | {"request_id": "r", "issued_at": T0}
    del command["id"], command["version"], command["created_at"]
    with pytest.raises(BadRecord):
        decode(CommandEnvelope, orjson.dumps(command))
    with pytest.raises(BadRecord):  # `in_process` true: refused unless only stored bounds fail
        sent = command | {"in_process": True, "body": {"x": 1 << 64}}
        decode(CommandEnvelope, json.dumps(sent).encode())


def old_event(body: dict[str, Any], extra: dict[str, Any] | None = None, **fields: Any) -> bytes:
    """An event as 0.2.0 wrote it (orjson of its dict)."""
    event = {
        "id": "e-1",
        "type": "Opened",
        "aggregate": OWNER.model_dump(),
        "version": 1,
        "request_id": "r-1",
        "created_at": T0,
        "body": body,
    }
    return json.dumps(event | fields | (extra or {})).encode()


class Account(BaseModel):
    limit: Any = 0
    balance: int = 0


accounts = AggregateType("shop", "order", Account)


@accounts.applies("Opened")
def _opened(state: Account, e: Event) -> Account:
    return state.model_copy(update={"limit": e.body})


@accounts.applies("Deposited")
def _deposited(state: Account, e: Event) -> Account:
    return state.model_copy(update={"balance": state.balance + e.body["amount"]})


@pytest.mark.parametrize("name", list(PAST))
def test_a_0_2_0_event_past_the_new_input_bounds_folds_as_0_2_0_folded_it(name: str) -> None:
    body = PAST[name]
    log = [old_event(body), old_event({"amount": 5}, type="Deposited", version=2, id="e-2")]
    events = []
    for data in log:
        event, _why = decode_event(data)
        events.append(event)
    assert events[0].body == body
    folded = fold(accounts, None, events)
    assert folded.version == 2 and folded.state == {"limit": body, "balance": 5}
    # An unknown top-level field past the bounds, kept as 0.2.0 kept it.
    event, why = decode_event(old_event({}, {"trace": (1 << 64) - 1}))
    assert why is not None and event.model_extra == {"trace": (1 << 64) - 1}


def test_a_lenient_read_still_refuses_what_no_encoder_writes() -> None:
    for body in ({"n": 1 << 64}, nested(MAX_STORED_DEPTH + 1)):
        with pytest.raises(BadRecord):
            decode_event(old_event(body))


@pytest.mark.parametrize("lax", [False, True], ids=["strict", "only-lenient"])
def test_a_lenient_read_refuses_a_record_over_the_size_bound(lax: bool) -> None:
    """No version took a record past `TICKWHEEL_MAX_RECORD_BYTES`: the lenient read took
    one all the same (the strict read's refusal of its size made its reason), so a fold
    (a restore, the jobs' view) folded what the timers dead-letter."""
    version: object = "1" if lax else 1  # a string: refused by the strict read alone
    data = old_event({"amount": 5}, type="Deposited", version=version)
    event, why = decode_event(data, len(data))
    assert event.version == 1 and (why is not None) == lax
    with pytest.raises(BadRecord, match=f"record of {len(data)} bytes exceeds {len(data) - 1}"):
        decode_event(data, len(data) - 1)


def test_a_book_refolds_its_own_events_as_stored() -> None:
    """A timer book's own `wow.ScheduleSet` events (a key 0.2.0 took with a control
    character, a command body past 64 bits), folded again: the book knows the timer, and
    its state loads again."""
    book = timer_book("shop", "order-timers")
    ref_ = AggregateRef(context="shop", aggregate="order-timers", id="o-1")
    schedule = {
        "key": "remind\n1",
        "rule": {"kind": "interval", "start": T0, "every": 3_600_000},
        "target": OWNER.model_dump(),
        "command": {"type": "Remind", "body": PAST["u64"]},
    }
    event = orjson.dumps(
        {
            "id": "e-1",
            "type": SCHEDULE_SET,
            "aggregate": ref_.model_dump(),
            "version": 1,
            "created_at": T0,
            "body": schedule,
        }
    )
    folded = fold(book, None, [decode_event(event)[0]])
    timers = folded.state["timers"]
    assert list(timers) == ["remind\n1"]
    assert timers["remind\n1"]["command"]["body"] == PAST["u64"]
    # The stored book takes its next command (its state loaded as stored).
    cmd = CommandEnvelope(
        request_id="r-2",
        type=SET_TIMER,
        aggregate=ref_,
        issued_at=T0,
        body=schedule | {"key": "other", "command": {"type": "Remind"}},
    )
    decided = decide(
        book, StoredAggregate.model_validate(folded.model_dump()), cmd, now=T0, seen=False
    )
    assert decided.code == "COMMITTED", decided.message
    # A new wow.SetTimer holding such a body is still refused.
    cmd = cmd.model_copy(update={"body": {**schedule, "key": "third"}, "request_id": "r-3"})
    decided = decide(book, folded, cmd, now=T0, seen=False)
    assert decided.code == "REJECTED" and "64 bits" in decided.message


def test_check_stored_walks_without_recursion() -> None:
    check_stored({"a": nested(MAX_STORED_DEPTH - 1)} | PAST["u64"])
    with pytest.raises(ValueError, match="nested more than"):
        check_stored(nested(100_000))  # iterative: no RecursionError
    with pytest.raises(ValueError, match="finite"):
        check_stored({"x": [float("nan")]})
    assert (
        ScheduleSet.model_validate(
            {
                "key": "k",
                "rule": {"kind": "once", "at": T0},
                "command": {"type": "P", "body": PAST["deep70"]},
            },
            context=STORED_INPUT,
        ).command.body
        == PAST["deep70"]
    )


@pytest.mark.parametrize("name", ["u64", "deep70"])
async def test_a_0_2_0_row_past_the_bounds_is_restored_and_fires(name: str, tmp_path: Path) -> None:
    """On a node: a changelog row 0.2.0 wrote (its command's body past the new-input
    bounds) is restored and fires, as a row beside it does; no letter, no tombstone."""
    log = MemoryLog()
    log.ensure_topics(node_topics([TOPICS], PARTITIONS))
    p = 1
    victim, control = owners(p, 2, prefix="old")
    due = now_ms() + 800
    sent = []
    for owner, body in ((victim, PAST[name]), (control, {"n": 1})):
        aggregate = AggregateRef(**ref(owner))
        row = orjson.loads(old_row(body, aggregate))
        row["partition"] = p
        row["command"]["type"] = "Fire"
        row["rule"]["at"] = row["slot_due_at"] = row["due_at"] = due
        sent.append((TOPICS.timers_changelog, p, row_key(aggregate, "k"), orjson.dumps(row)))
    await log.publisher().send_many(sent)
    async with running(fuzz_node(log, tmp_path, "a")):
        await wait_until(lambda: fired(log)[control] == 1, within=15, what=lambda: f"{fired(log)}")
        await wait_until(lambda: fired(log)[victim] == 1, within=5, what=lambda: f"{fired(log)}")
        await asyncio.sleep(0.5)
        assert letters(log) == {}
        assert not tombstoned(log, p, sent[0][2])
        assert fired(log)[victim] == 1
