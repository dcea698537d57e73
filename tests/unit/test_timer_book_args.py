"""What `timer_book` and `Service` take: names a topic can have and a retention a book can
keep, refused where they are declared with a `ConfigError` saying why (as the faust client
and the workers refuse a bad name), never a book that misbehaves later."""

from __future__ import annotations

import math
from typing import Any

import pytest

from app import Service, timer_book
from app.clients.book_state import BookState, BookTimer
from app.clients.timer_book import BOOK_RETENTION, MAX_BOOK_RETENTION, MAX_BOOK_TIMERS, SET_TIMER
from app.errors import ConfigError
from app.model.aggregate import AggregateType
from app.model.decide import StoredAggregate, decide
from app.protocol.wire import CommandEnvelope, ResultCode
from tables import AggregateRef, CommandSpec

NOW = 10**13
TARGET = AggregateRef(context="rem", aggregate="order", id="o-1")
BAD_NAMES = [
    ("Bad Ctx", "b"),
    ("rem", ""),
    ("rem", "a b"),
    ("rem", "x.y"),
    (5, "b"),
    ("rem", None),
    # Names whose topics Kafka refuses (249 at most): `<type>.timer-ops`, `<ctx>.failure-ledger`
    ("rem", "a" * 236),
    ("c" * 235, "b"),
]


@pytest.mark.parametrize(("context", "name"), BAD_NAMES)
def test_a_book_named_as_no_topic_can_be_is_refused(context: Any, name: Any) -> None:
    with pytest.raises(ConfigError, match="aggregate type"):
        timer_book(context, name)


@pytest.mark.parametrize(("context", "name"), BAD_NAMES)
def test_a_service_of_a_type_named_as_no_topic_can_be_is_refused(context: Any, name: Any) -> None:
    with pytest.raises(ConfigError, match="aggregate type"):
        Service(aggregates=(AggregateType(context, name, BookState),))


@pytest.mark.parametrize("context", ["Bad Ctx", "", 5, "c" * 231])
def test_a_service_with_jobs_in_a_context_named_as_no_topic_can_be_is_refused(
    context: Any,
) -> None:
    with pytest.raises(ConfigError, match="aggregate type"):
        Service(aggregates=(), jobs={context: ()})


@pytest.mark.parametrize(
    "retention",
    [math.nan, math.inf, 0.5, 7.0 * 24 * 3_600_000, "7", True, 0, -1, MAX_BOOK_RETENTION + 1],
)
def test_a_retention_that_is_no_whole_number_of_ms_in_bounds_is_refused(retention: Any) -> None:
    with pytest.raises(ConfigError, match=r"retention must be an integer of ms from 1 to"):
        timer_book("rem", "b", retention=retention)


@pytest.mark.parametrize("retention", [1, BOOK_RETENTION, MAX_BOOK_RETENTION])
def test_a_book_forgets_its_ended_timers_past_a_retention_it_takes(retention: int) -> None:
    """With NaN taken, no ended timer was ever forgotten (every comparison false): past
    `MAX_BOOK_TIMERS` of them, every set of a new key was REJECTED."""
    book = timer_book("rem", "b", retention=retention)
    ended = BookTimer(target=TARGET, command=CommandSpec(type="x"), ends=1_000)
    state = BookState(timers={f"t{i}": ended for i in range(MAX_BOOK_TIMERS)})
    ref = AggregateRef(context="rem", aggregate="b", id="k")
    body = {
        "key": "new",
        "rule": {"kind": "once", "at": NOW + 1_000},
        "target": TARGET.model_dump(),
        "command": {"type": "x", "body": {}},
    }
    cmd = CommandEnvelope(request_id="r", type=SET_TIMER, aggregate=ref, body=body, issued_at=NOW)
    stored = StoredAggregate(version=MAX_BOOK_TIMERS, state=state.model_dump())
    assert decide(book, stored, cmd, now=NOW, seen=False).code == ResultCode.COMMITTED


def test_a_type_at_the_longest_name_kafka_takes_for_its_topics_is_taken() -> None:
    topics = Service(aggregates=(AggregateType("c" * 234, "b" * 4, BookState),)).aggregates[0]
    assert len(topics.type_name) == 239
