"""What the published schemas say of the bounds the readers hold new input to: a name's
control characters (`tables.refs.control_character`), and a body's numbers and depth
(`tables.bounds.check_json`)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.errors import BadRecord
from app.protocol.schemas import render_schemas
from app.protocol.wire import EventEnvelope, ScheduleSet, decode
from tables import AggregateRef
from tables.bounds import JSON_BOUNDS, MAX_DEPTH, MAX_INT64
from tables.refs import NEW_INPUT, control_character

SCHEMAS: dict[str, Any] = {
    name.removesuffix(".schema.json"): orjson.loads(text) for name, text in render_schemas().items()
}
NAMES_AS_STORED = {"timer", "timer-op", "timer-op-answer"}
"""Records read with any names (`new_names=False`, or a node's stored row)."""


def _names(schema: object) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every tenant, aggregate id and timer key of `schema`: `(field, its schema)`."""
    if isinstance(schema, dict):
        properties = schema.get("properties")
        if isinstance(properties, dict):
            if schema.get("title") == "AggregateRef":
                yield "tenant", properties["tenant"]
                yield "id", properties["id"]
            if schema.get("title") == "ScheduleSet":
                yield "key", properties["key"]
        for value in schema.values():
            yield from _names(value)


NAMED = sorted(n for n in SCHEMAS if any(True for _ in _names(SCHEMAS[n])))
NEW = [n for n in NAMED if n not in NAMES_AS_STORED]


def test_the_records_of_new_input_hold_their_names_to_a_pattern() -> None:
    assert {"event", "command", "command-result", "wow.ScheduleSet"} <= set(NEW)
    assert set(NAMED) >= NAMES_AS_STORED
    for name in NAMED:
        patterns = {(field, s.get("pattern")) for field, s in _names(SCHEMAS[name])}
        fields = {field for field, _ in patterns}
        assert fields == (
            {"tenant", "id", "key"} if name == "wow.ScheduleSet" else {"tenant", "id"}
        )
        if name in NAMES_AS_STORED:
            # Stored names (an older version took one with a control character) stay
            # readable there: a retry of its parked timer is valid.
            assert {p for _, p in patterns} == {None}, name
        else:
            assert len({p for _, p in patterns}) == 1 and None not in {p for _, p in patterns}


_NAME_PATTERN: str = next(s.get("pattern", "") for _, s in _names(SCHEMAS["wow.ScheduleSet"]))


@pytest.mark.parametrize("char", [chr(c) for c in [*range(0x20), 0x7F]])
@pytest.mark.parametrize("where", ["alone", "first", "inside", "last"])
def test_the_pattern_refuses_each_control_character_wherever_it_is(char: str, where: str) -> None:
    """As JSON Schema reads it (a search, ECMA 262) and as Python's `jsonschema` does: a
    trailing newline too, which a `$` would have let through."""
    text = {"alone": char, "first": char + "ab", "inside": "a" + char + "b", "last": "ab" + char}
    assert re.search(_NAME_PATTERN, text[where]) is None


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=20) | st.text(alphabet=st.characters(max_codepoint=0x2030), max_size=8))
def test_the_pattern_takes_a_name_exactly_when_the_reader_does(text: str) -> None:
    assert (re.search(_NAME_PATTERN, text) is not None) == (control_character(text) is None)


def test_a_name_stored_before_still_reads_without_the_new_input_context() -> None:
    """The pattern is the schemas' alone: a row or state an older version stored with a
    control character in a name loads as it did."""
    ref = AggregateRef.model_validate({"context": "shop", "aggregate": "order", "id": "o\n1"})
    assert ref.id == "o\n1"
    with pytest.raises(ValueError, match="U\\+000A"):
        AggregateRef.model_validate(ref.model_dump(), context=NEW_INPUT)
    body = {"key": "k\x7f", "rule": {"kind": "once", "at": 1}, "command": {"type": "T"}}
    assert ScheduleSet.model_validate(body).key == "k\x7f"
    with pytest.raises(ValueError, match="U\\+007F"):
        ScheduleSet.model_validate(body, context=NEW_INPUT)
    event = {
        "id": "e",
        "type": "T",
        "aggregate": {"context": "shop", "aggregate": "order", "tenant": "t\x00", "id": "o"},
        "version": 1,
        "created_at": 1,
    }
    with pytest.raises(BadRecord, match="U\\+0000"):
        decode(EventEnvelope, orjson.dumps(event))


def _bodies(schema: object) -> Iterator[dict[str, Any]]:
    """Every body (an event's, a command's, a timer's command's) of `schema`."""
    if isinstance(schema, dict):
        properties = schema.get("properties")
        if isinstance(properties, dict) and isinstance(body := properties.get("body"), dict):
            yield body
        for value in schema.values():
            yield from _bodies(value)


def test_the_schemas_say_the_bounds_of_a_body_and_of_unknown_fields() -> None:
    """`type: object` took what the readers refuse (an integer past 64 bits, 1e400, 65
    levels): the schemas say so where they cannot check it."""
    bodies = [(name, b) for name, s in SCHEMAS.items() for b in _bodies(s)]
    assert {name for name, _ in bodies} >= {"event", "command", "wow.ScheduleSet", "timer"}
    for name, body in bodies:
        assert body["type"] == "object", name
        assert JSON_BOUNDS in body["description"], name
    open_ = [n for n, s in SCHEMAS.items() if s.get("additionalProperties") is not False]
    assert {"event", "command", "wow.ScheduleSet", "command-result", "timer-op"} <= set(open_)
    for name in open_:
        assert JSON_BOUNDS in SCHEMAS[name]["additionalProperties"]["description"], name
    for said in (str(MAX_INT64), str(-MAX_INT64 - 1), f"{MAX_DEPTH} levels"):
        assert said in JSON_BOUNDS


@pytest.mark.parametrize(
    ("value", "refused"),
    [
        (str(MAX_INT64), False),
        (str(-MAX_INT64 - 1), False),
        (str(MAX_INT64 + 1), True),
        (str(-MAX_INT64 - 2), True),
        ("1.5e308", False),
        ("1e400", True),
        # in a body, 64 levels with the body the first (as the top of the record)
        ("[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1), False),
        ("[" * MAX_DEPTH + "]" * MAX_DEPTH, True),
    ],
)
@pytest.mark.parametrize("where", ["body", "unknown field"])
def test_the_bounds_said_are_the_readers(value: str, refused: bool, where: str) -> None:
    event: dict[str, Any] = {
        "id": "e",
        "type": "T",
        "aggregate": {"context": "shop", "aggregate": "order", "id": "o"},
        "version": 1,
        "created_at": 1,
    }
    event |= {"body": {"v": "V"}} if where == "body" else {"v": "V"}
    raw = orjson.dumps(event).replace(b'"V"', value.encode())
    if refused:
        with pytest.raises(BadRecord):
            decode(EventEnvelope, raw)
    else:
        decode(EventEnvelope, raw)
