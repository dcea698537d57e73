"""A result code this version does not know (a newer Tickwheel's, another implementation's):
read as ERROR with the code kept, not dropped as unreadable; the published schema takes it."""

from __future__ import annotations

import re

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.errors import BadRecord
from app.ops.job_answers import command_outcome
from app.ops.page_actions import _said
from app.ops.timer_api import answer_of
from app.protocol.schemas import render_schemas
from app.protocol.wire import CommandEnvelope, CommandResult, ResultCode, decode, encode
from app.timers.runner.decisions import SendResult, Verdict, classify, error_of

RESULT = {
    "request_id": "t-1#0",
    "code": "COMMITTED",
    "aggregate": {"context": "shop", "aggregate": "order", "tenant": "(0)", "id": "o-2"},
    "message": "held for review",
    "version": 4,
    "decided_at": 1_700_000_000_000,
}
KNOWN = {c.value for c in ResultCode}


@pytest.mark.parametrize("code", ["DEFERRED", "X", "COMMITTED_2", "A" * 64])
def test_a_newer_writers_code_reads_as_error_with_the_code_kept(code: str) -> None:
    result = decode(CommandResult, orjson.dumps(RESULT | {"code": code}))
    assert (result.code, result.unknown_code) == (ResultCode.ERROR, code)
    assert result.model_extra == {}, "not an unknown field: the code is read"
    assert result.reason == (
        f"result code {code} (unknown to this version, read as ERROR): held for review"
    )
    assert (result.request_id, result.version) == ("t-1#0", 4), "the rest read as written"


def test_a_known_code_has_no_unknown_code_and_its_reason_is_its_message() -> None:
    result = decode(CommandResult, orjson.dumps(RESULT))
    assert (result.code, result.unknown_code, result.reason) == (
        ResultCode.COMMITTED,
        None,
        "held for review",
    )
    bare = decode(CommandResult, orjson.dumps(RESULT | {"code": "LATER", "message": ""}))
    assert bare.reason == "result code LATER (unknown to this version, read as ERROR)"


def test_an_unknown_code_is_a_failed_attempt_never_a_fired_slot() -> None:
    """The send it answers is retried by the timer's policy, the code on the row."""
    result = decode(CommandResult, orjson.dumps(RESULT | {"code": "SENT"}))
    sent = SendResult(result.code.value, result.reason)
    assert classify(sent.code) is Verdict.FAILED, "SENT is the runner's code of a fired slot"
    assert error_of(sent) == {"error_code": "ERROR", "error_text": result.reason}


@pytest.mark.parametrize("bad", ["committed", "", "A" * 65, "NEW CODE", 7, True, None, [], {}])
def test_a_code_no_writer_makes_is_still_a_bad_record(bad: object) -> None:
    with pytest.raises(BadRecord, match="code"):
        decode(CommandResult, orjson.dumps(RESULT | {"code": bad}))


def _schema_takes(code: object) -> bool:
    """Whether the published schema's `code` takes `code` (its anyOf, read by hand: no
    JSON Schema validator is a dependency)."""
    schema = orjson.loads(render_schemas()["command-result.schema.json"])
    known = schema["$defs"]["ResultCode"]["enum"]
    for alternative in schema["properties"]["code"]["anyOf"]:
        if alternative.get("$ref") == "#/$defs/ResultCode" and code in known:
            return True
        if (
            alternative.get("type") == "string"
            and isinstance(code, str)
            and re.search(alternative["pattern"], code)
        ):
            return True
    return False


@pytest.mark.parametrize("code", [*sorted(KNOWN), "DEFERRED", "X", "A" * 64])
def test_the_schema_takes_every_code_a_reader_takes(code: str) -> None:
    """Additive: every code written before still validates, and a client validating
    against the schema does not refuse a newer writer's result."""
    assert _schema_takes(code)
    schema = orjson.loads(render_schemas()["command-result.schema.json"])
    assert "code" in schema["required"]


@pytest.mark.parametrize("bad", ["committed", "", "A" * 65, "NEW CODE", 7, True, None, [], {}])
def test_the_schema_refuses_what_a_reader_refuses(bad: object) -> None:
    assert not _schema_takes(bad)


_JSON = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.text()
    | st.lists(st.text(), max_size=2)
)


@settings(max_examples=300, deadline=None)
@given(
    value=st.from_regex(r"[A-Z][A-Z0-9_]{0,70}", fullmatch=True)
    | st.sampled_from(sorted(KNOWN))
    | _JSON
)
def test_any_code_reads_as_itself_as_error_or_as_a_bad_record(value: object) -> None:
    """Whatever a writer puts in `code`, a reader never takes it for a code it is not: a
    code it knows is that code, a well-formed one it does not know ERROR (kept), anything
    else a `BadRecord`."""
    try:
        result = decode(CommandResult, orjson.dumps(RESULT | {"code": value}))
    except BadRecord as exc:
        assert str(exc).startswith("not a valid CommandResult: code"), exc
        assert not (isinstance(value, str) and re.fullmatch(r"[A-Z][A-Z0-9_]{0,63}", value))
        return
    assert isinstance(value, str)
    if value in KNOWN:
        assert (result.code, result.unknown_code) == (value, None)
    else:
        assert (result.code, result.unknown_code) == (ResultCode.ERROR, value)
    assert orjson.loads(encode(result))["code"] == result.code.value


def test_the_operator_edges_answer_it_as_error_naming_the_code() -> None:
    """The HTTP answers and the operator page's confirmation of a command answered with a
    newer writer's code: ERROR (a failure, as a node of this version would act on it), the
    code in the message."""
    result = decode(CommandResult, orjson.dumps(RESULT | {"code": "DEFERRED"}))
    cmd = CommandEnvelope(
        request_id="t-1#0",
        type="wow.Pause",
        aggregate=result.aggregate,
        body={"key": "remind", "slot": 3},
        issued_at=1_700_000_000_000,
    )
    timer = answer_of(cmd, result)
    assert (timer.code, timer.message) == (ResultCode.ERROR, result.reason)
    job = command_outcome(cmd, result)
    assert (job.code, job.message) == (ResultCode.ERROR, result.reason)
    said = _said("Pause", "r-1", [result], 5)
    assert said == f"Pause: ERROR (request r-1); {result.reason}."
