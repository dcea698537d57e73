"""Ids derived from a request id fit their bounds, or the command is refused: an event's
id (`<request id>/<i>`, at most 200, while a request id may be 300) and a decision's sent
command (`<request id>>n`, at most 300). A timer book's trigger whose sent id would not
fit is REJECTED (a producer other than the edge may write any request id), not a raise
(ERROR and a dead letter). Pure: `decide` with the clock given as `now`."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from app.clients.timer_book import SET_TIMER, TRIGGER_TIMER, timer_book
from app.model.aggregate import (
    AggregateType,
    Command,
    Decision,
    aggregate_digest,
    send_fits,
    sent_request_id,
    sent_suffix_length,
)
from app.model.decide import StoredAggregate, decide, event_id
from app.protocol.wire import MAX_EVENT_ID, MAX_REQUEST_ID, CommandEnvelope, ResultCode
from tables import AggregateRef

CTX = "rem"
NOW = 1_800_000_000_000
BOOK = timer_book(CTX, "order-timers")
OWNER = AggregateRef(context=CTX, aggregate="order-timers", id="o-1")
TARGET = {"context": CTX, "aggregate": "order", "id": "o-1"}
# Every length as likely: plain `st.text` seldom draws the long ones the bounds are about.
_REQUEST_ID = st.integers(1, MAX_REQUEST_ID).flatmap(lambda n: st.text(min_size=n, max_size=n))


def command(type_: str, body: dict[str, Any], request_id: str) -> CommandEnvelope:
    return CommandEnvelope(
        request_id=request_id, type=type_, aggregate=OWNER, body=body, issued_at=NOW
    )


@settings(max_examples=300, deadline=None)
@given(a=_REQUEST_ID, b=_REQUEST_ID, i=st.integers(0, 50))
def test_an_event_id_fits_is_the_same_on_a_retry_and_differs_by_request_id(
    a: str, b: str, i: int
) -> None:
    made = event_id(OWNER, a, i)
    assert 0 < len(made) <= MAX_EVENT_ID
    assert made == event_id(OWNER, a, i)
    digest = aggregate_digest(OWNER)
    assert made == f"{a}/{i}@{digest}" or len(f"{a}/{i}@{digest}") > MAX_EVENT_ID
    if a != b:
        assert made != event_id(OWNER, b, i)
    assert made != event_id(OWNER, a, i + 1)


@settings(max_examples=300, deadline=None)
@given(a=_REQUEST_ID, i=st.integers(0, 50), tenant=st.text(min_size=1, max_size=20))
def test_an_event_id_differs_by_aggregate(a: str, i: int, tenant: str) -> None:
    # A request id is unique per aggregate alone: two aggregates' commands of one request id
    # make events of different ids (their timers' request ids at a shared target differ).
    others = [
        OWNER.model_copy(update={"id": OWNER.id + "x"}),
        OWNER.model_copy(update={"aggregate": OWNER.aggregate + "x"}),
        OWNER.model_copy(update={"context": OWNER.context + "x"}),
        OWNER.model_copy(update={"tenant": tenant}),
    ]
    made = event_id(OWNER, a, i)
    for other in others:
        if other != OWNER:
            assert event_id(other, a, i) != made


class Counter(BaseModel):
    n: int = 0


COUNTER = AggregateType(CTX, "counter", Counter)


@COUNTER.command("rem.Bump")
def _bump(state: Counter, cmd: Command, d: Decision) -> None:
    d.emit("rem.Bumped", {"n": state.n + 1})
    d.emit("rem.Bumped", {"n": state.n + 2})


def test_a_command_with_the_longest_request_id_commits_its_events() -> None:
    """It was an ERROR and a dead letter from 198 characters: `<request id>/0` is an event
    id, and an event id may be 200 characters only."""
    cmd = CommandEnvelope(
        request_id="r" * MAX_REQUEST_ID,
        type="rem.Bump",
        aggregate=AggregateRef(context=CTX, aggregate="counter", id="c"),
        issued_at=NOW,
    )
    d = decide(COUNTER, None, cmd, now=NOW, seen=False)
    assert d.code is ResultCode.COMMITTED, d.message
    first, second = d.events
    assert first.id != second.id and first.request_id == cmd.request_id
    again = decide(COUNTER, None, cmd, now=NOW, seen=False)
    assert [e.id for e in again.events] == [first.id, second.id]


def booked() -> StoredAggregate:
    body = {
        "key": "k",
        "rule": {"kind": "once", "at": NOW + 60_000},
        "target": TARGET,
        "command": {"type": "reminders.Remind", "body": {}},
    }
    d = decide(BOOK, None, command(SET_TIMER, body, "set-1"), now=NOW, seen=False)
    assert d.code is ResultCode.COMMITTED and d.stored is not None, d.message
    return d.stored


@pytest.mark.parametrize("length", [MAX_REQUEST_ID - 1, MAX_REQUEST_ID])
def test_a_books_trigger_longer_than_a_triggers_request_id_is_rejected(length: int) -> None:
    d = decide(
        BOOK, booked(), command(TRIGGER_TIMER, {"key": "k"}, "t" * length), now=NOW, seen=False
    )
    assert d.code is ResultCode.REJECTED, (d.code, d.message)
    assert f"a trigger's request id is at most {MAX_REQUEST_ID - 2} characters" in d.message
    assert d.events == [] and d.commands == []


def test_a_books_trigger_with_the_longest_id_that_leaves_room_sends_once() -> None:
    rid = "t" * (MAX_REQUEST_ID - sent_suffix_length(0))  # 298: as long as before
    d = decide(BOOK, booked(), command(TRIGGER_TIMER, {"key": "k"}, rid), now=NOW, seen=False)
    assert d.code is ResultCode.COMMITTED, d.message
    (sent,) = d.commands
    assert sent.request_id == sent_request_id(OWNER, rid, 0)
    # `<request id>>0@<digest>` would be 317 characters: hashed, the sender's digest kept
    assert sent.request_id.startswith("sha256:")
    assert sent.request_id.endswith(f">0@{aggregate_digest(OWNER)}")
    (triggered,) = d.events
    assert triggered.body["request_id"] == sent.request_id


@given(rid=_REQUEST_ID, n=st.integers(0, 2000))
def test_a_decision_sends_whatever_its_request_ids_length(rid: str, n: int) -> None:
    # Whole while `<request id>>n@<digest>` fits a request id, hashed past it: a chain of
    # sends (each hop's handler sending again) never runs out of room.
    d = Decision(aggregate=OWNER, now=NOW, request_id=rid)
    d.commands.extend([command(TRIGGER_TIMER, {}, "x")] * n)  # its n-th send comes next
    d.send(OWNER, "rem.Remind")
    sent = d.commands[-1].request_id
    whole = f"{rid}>{n}@{aggregate_digest(OWNER)}"
    assert sent == (whole if len(whole) <= MAX_REQUEST_ID else sent)
    assert len(sent) <= MAX_REQUEST_ID
    if len(whole) > MAX_REQUEST_ID:
        assert sent.startswith("sha256:") and sent.endswith(f">{n}@{aggregate_digest(OWNER)}")
    assert sent == sent_request_id(OWNER, rid, n)  # the same on a retried decision
    if send_fits(rid, n):
        assert len(f"{rid}>{n}") <= MAX_REQUEST_ID


def test_a_chain_of_sends_never_runs_out_of_room() -> None:
    rid = uuid_like = "0" * 36
    for _hop in range(200):
        d = Decision(aggregate=OWNER, now=NOW, request_id=rid)
        d.send(OWNER, "rem.Remind")
        rid = d.commands[-1].request_id
    assert len(rid) <= MAX_REQUEST_ID and rid != uuid_like


def test_an_aggregates_digest_is_the_same_in_every_release() -> None:
    """Ids derived from it are stored (events, request ids sent, de-duplication): a node of
    another release must make the same ones (length-prefixed parts, so none are alike)."""
    ref = AggregateRef(context="shop", aggregate="order", tenant="acme", id="o-1:x")
    assert aggregate_digest(ref) == "4a3ddbfc2146247d"
    moved = AggregateRef(context="shop", aggregate="order", tenant="acme:o", id="-1:x")
    assert aggregate_digest(moved) != aggregate_digest(ref)
