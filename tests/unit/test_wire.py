"""The wire envelopes: round trips, unknown fields kept, clear errors, published schemas."""

from __future__ import annotations

import re
from collections.abc import Iterator

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from app.errors import BadRecord
from app.model.aggregate import Rejected
from app.protocol.schemas import SCHEMA_DIR, SHIPPED_DIR, render_schemas, stale_schemas
from app.protocol.wire import (
    MAX_RECORD_BYTES,
    CommandEnvelope,
    CommandResult,
    EventEnvelope,
    Refusal,
    ResultCode,
    ScheduleSet,
    decode,
    encode,
)

EVENT = {
    "id": "e-1",
    "type": "wow.ScheduleSet",
    "aggregate": {"context": "shop", "aggregate": "order", "tenant": "t1", "id": "o-1"},
    "version": 3,
    "created_at": 1_700_000_000_000,
    "body": {
        "key": "deadline",
        "rule": {"kind": "once", "at": 1_700_000_060_000},
        "command": {"type": "shop.CancelUnpaid", "body": {"why": "unpaid"}},
    },
}


def test_event_round_trip_keeps_unknown_fields() -> None:
    raw = orjson.dumps({**EVENT, "trace": {"span": "abc"}, "schema_version": 7})
    event = decode(EventEnvelope, raw)
    again = orjson.loads(encode(event))
    assert again["trace"] == {"span": "abc"}
    assert again["schema_version"] == 7
    assert decode(EventEnvelope, encode(event)) == event


def test_schedule_set_body_parses_rule_and_defaults_target() -> None:
    body = ScheduleSet.model_validate(EVENT["body"])
    assert body.target is None
    assert body.rule.kind == "once"


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"{not json", "not a valid EventEnvelope"),
        (orjson.dumps({**EVENT, "version": 0}), "version"),
        (orjson.dumps({k: v for k, v in EVENT.items() if k != "aggregate"}), "aggregate"),
        (None, "tombstone"),
        (b"x" * (MAX_RECORD_BYTES + 1), "exceeds"),
    ],
)
def test_bad_records_get_a_clear_reason(raw: bytes | None, reason: str) -> None:
    with pytest.raises(BadRecord, match=reason):
        decode(EventEnvelope, raw)


def test_command_and_result_envelopes() -> None:
    cmd = CommandEnvelope(
        request_id="e-1#0",
        type="shop.CancelUnpaid",
        aggregate=EventEnvelope.model_validate(EVENT).aggregate,
        not_before=5,
        issued_at=4,
    )
    assert decode(CommandEnvelope, encode(cmd)) == cmd
    res = CommandResult(
        request_id="e-1#0", code=ResultCode.SCHEDULE_NOT_DUE, aggregate=cmd.aggregate, decided_at=4
    )
    assert orjson.loads(encode(res))["code"] == "SCHEDULE_NOT_DUE"


def test_published_schemas_match_the_models() -> None:
    # `tickwheel schemas` rewrites them; this fails when a model changed and they did not.
    assert stale_schemas() == [], "run `tickwheel schemas` and commit docs/schemas/"


def test_schemas_cover_every_envelope() -> None:
    names = set(render_schemas())
    assert {"event.schema.json", "wow.ScheduleSet.schema.json", "command.schema.json"} <= names
    schema = orjson.loads(render_schemas()["wow.ScheduleSet.schema.json"])
    assert set(schema["required"]) == {"key", "rule", "command"}


def _discriminated(schema: object) -> Iterator[tuple[str, str]]:
    """Every `(property, $ref)` a schema's discriminators pick a variant by, anywhere in it."""
    if isinstance(schema, dict):
        if isinstance(found := schema.get("discriminator"), dict):
            for ref in found["mapping"].values():
                yield found["propertyName"], ref
        for value in schema.values():
            yield from _discriminated(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from _discriminated(value)


@pytest.mark.parametrize("copy", ["rendered", "docs", "shipped"])
def test_every_rule_variant_requires_its_kind_in_every_published_schema(copy: str) -> None:
    """A rule without `kind` passed the schemas (it had a default, for Python's sake) and
    was dead-lettered: the reader picks the variant by it ("Unable to extract tag using
    discriminator 'kind'")."""
    texts = render_schemas()
    if copy != "rendered":
        where = SCHEMA_DIR if copy == "docs" else SHIPPED_DIR
        texts = {name: (where / name).read_bytes() for name in texts}
    seen = set()
    for name, text in texts.items():
        schema = orjson.loads(text)
        for tag, ref in _discriminated(schema):
            variant = schema["$defs"][ref.removeprefix("#/$defs/")]
            assert tag in variant["required"], f"{name}: {ref} does not require {tag!r}"
            assert "default" not in variant["properties"][tag], f"{name}: {ref}"
            seen.add(variant["title"])
    assert {"OnceRule", "IntervalRule", "CronRule"} <= seen
    # What the schemas say: the reader refuses such a rule.
    body = dict(EVENT["body"])  # type: ignore[call-overload]
    body["rule"] = {"at": 1_700_000_060_000}
    with pytest.raises(ValidationError, match="Unable to extract tag using discriminator 'kind'"):
        ScheduleSet.model_validate(body, strict=True)


@pytest.mark.parametrize(
    "body",
    [
        b'{"n": 1180591620717411303424}',
        b'{"n": -9223372036854775809}',
        b'{"n": 1e400}',
        b'{"n": ' + b"[" * 70 + b"]" * 70 + b"}",
    ],
)
def test_a_body_no_reader_holds_or_encoder_writes_back_is_bad_input(body: bytes) -> None:
    """Integers past signed 64 bits, non-finite numbers and nesting past 64 levels: refused
    where they come in, not when the node writes them back (orjson refuses the first)."""
    event = (
        b'{"id":"e","type":"x.Y","aggregate":{"context":"c","aggregate":"a","id":"i"},'
        b'"version":1,"created_at":0,"body":' + body + b"}"
    )
    with pytest.raises(BadRecord):
        decode(EventEnvelope, event)
    with pytest.raises(BadRecord):
        decode(EventEnvelope, event.replace(b'"body":', b'"extra":'))


RESULT = {
    "request_id": "r-1",
    "code": "REJECTED",
    "aggregate": {"context": "shop", "aggregate": "reminders", "tenant": "(0)", "id": "o-1"},
    "message": "shop.reminders/(0)/o-1's timer 'k': its rule ended at ...",
    "version": None,
    "decided_at": 1_700_000_000_000,
}


def test_a_result_written_before_the_refusal_was_typed_still_reads() -> None:
    """A 0.2.0 result, as records already in the results topics hold it: no `refusal`
    (its RULE_ENDED was the message's prefix then): a plain rejection."""
    old = orjson.dumps(RESULT | {"message": "RULE_ENDED: " + str(RESULT["message"])})
    result = decode(CommandResult, old)
    assert (result.code, result.refusal, result.model_extra) == (ResultCode.REJECTED, None, {})
    assert result.message.startswith("RULE_ENDED: ")  # the text is not read for a code


def test_the_refusal_round_trips_and_the_schema_lists_every_code() -> None:
    result = decode(CommandResult, orjson.dumps(RESULT | {"refusal": "RULE_ENDED"}))
    assert result.refusal is Refusal.RULE_ENDED
    assert orjson.loads(encode(result))["refusal"] == "RULE_ENDED"
    assert decode(CommandResult, encode(result)) == result
    schema = orjson.loads(render_schemas()["command-result.schema.json"])
    assert schema["$defs"]["Refusal"]["enum"] == [r.value for r in Refusal]
    assert "refusal" not in schema["required"]


@pytest.mark.parametrize("code", ["A_NEWER_REFUSAL", "X", "RULE_ENDED_2", "A" * 64])
def test_a_refusal_code_from_a_newer_writer_is_a_plain_rejection(code: str) -> None:
    result = decode(CommandResult, orjson.dumps(RESULT | {"refusal": code}))
    assert (result.code, result.refusal) == (ResultCode.REJECTED, None)


def _schema_takes(code: object) -> bool:
    """Whether the published schema's `refusal` takes `code` (its anyOf, read by hand: no
    JSON Schema validator is a dependency)."""
    schema = orjson.loads(render_schemas()["command-result.schema.json"])
    known = schema["$defs"]["Refusal"]["enum"]
    for alternative in schema["properties"]["refusal"]["anyOf"]:
        if alternative.get("$ref") == "#/$defs/Refusal" and code in known:
            return True
        if alternative.get("type") == "null" and code is None:
            return True
        if (
            alternative.get("type") == "string"
            and isinstance(code, str)
            and re.search(alternative["pattern"], code)
        ):
            return True
    return False


@pytest.mark.parametrize("code", ["A_NEWER_REFUSAL", "X", "A" * 64, "RULE_ENDED", None])
def test_the_schema_takes_every_code_a_reader_takes(code: str | None) -> None:
    """A client validating against the schema does not refuse a newer writer's code."""
    assert _schema_takes(code)


@pytest.mark.parametrize("bad", ["rule_ended", "", "A" * 65, "RULE ENDED", 7, True, [], {}])
def test_the_schema_refuses_what_a_reader_refuses(bad: object) -> None:
    assert not _schema_takes(bad)


@pytest.mark.parametrize("bad", ["rule_ended", "", "A" * 65, "RULE ENDED", 7, True, [], {}])
def test_a_refusal_no_writer_makes_is_a_bad_record(bad: object) -> None:
    with pytest.raises(BadRecord, match="refusal"):
        decode(CommandResult, orjson.dumps(RESULT | {"refusal": bad}))


_CODE_LIKE = st.from_regex(r"[A-Z][A-Z0-9_]{0,70}", fullmatch=True)
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)  # orjson writes those as null
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(value=_CODE_LIKE | st.sampled_from([r.value for r in Refusal]) | _JSON)
def test_any_refusal_reads_as_a_known_code_a_plain_rejection_or_a_bad_record(
    value: object,
) -> None:
    """Whatever a writer puts in `refusal`, a reader never fails otherwise: a code it knows
    is that code, a well-formed one it does not know none, anything else a `BadRecord`."""
    raw = orjson.dumps(RESULT | {"refusal": value})
    try:
        result = decode(CommandResult, raw)
    except BadRecord as exc:
        assert str(exc).startswith("not a valid CommandResult: refusal"), exc
        assert not (isinstance(value, str) and value in {r.value for r in Refusal})
        return
    if isinstance(value, str) and value in {r.value for r in Refusal}:
        assert result.refusal == value
    else:
        assert result.refusal is None
        assert value is None or (isinstance(value, str) and len(value) <= 64), value
    assert decode(CommandResult, encode(result)) == result


def test_a_refusal_code_goes_with_rejected_only() -> None:
    assert Rejected("no", refusal=Refusal.RULE_ENDED).refusal is Refusal.RULE_ENDED
    with pytest.raises(ValueError, match="goes with REJECTED"):
        Rejected("no", ResultCode.ERROR, refusal=Refusal.RULE_ENDED)
