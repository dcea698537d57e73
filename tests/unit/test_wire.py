"""The wire envelopes: round trips, unknown fields kept, clear errors, published schemas."""

from __future__ import annotations

import orjson
import pytest

from app.errors import BadRecord
from app.protocol.schemas import render_schemas, stale_schemas
from app.protocol.wire import (
    MAX_RECORD_BYTES,
    CommandEnvelope,
    CommandResult,
    EventEnvelope,
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
