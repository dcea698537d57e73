"""The outcome of a command, on its context's results topic (`CommandResult`): its code
(`ResultCode`) and, for a rejection a client acts on, why (`Refusal`). A code of a newer
writer is read as ERROR (`CommandResult.unknown_code`). May import
`app.protocol.envelope`, `app.errors` and `tables` only."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Final, Self

from pydantic import (
    BeforeValidator,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    model_validator,
)
from pydantic.config import JsonDict

from app.protocol.envelope import Envelope
from tables import AggregateRef
from tables.bounds import MAX_INT64, Instant

__all__ = ["UNKNOWN_CODE_READ_AS", "CommandResult", "Refusal", "ResultCode"]


class ResultCode(StrEnum):
    COMMITTED = "COMMITTED"
    DUPLICATE = "DUPLICATE"
    UNCHANGED = "UNCHANGED"
    REJECTED = "REJECTED"
    BUSY = "BUSY"
    SCHEDULE_NOT_DUE = "SCHEDULE_NOT_DUE"
    SCHEDULE_JOB_INVALID = "SCHEDULE_JOB_INVALID"
    ERROR = "ERROR"


class Refusal(StrEnum):
    """Why a command was REJECTED, when a client acts on the why (`CommandResult.refusal`):
    a code the aggregate's handler gave its refusal (`Decision.reject(..., refusal=)`)."""

    RULE_ENDED = "RULE_ENDED"
    """A timer book refused a trigger of a timer whose rule ended
    (`app.clients.timer_book.ended_refusal`): the web edge answers 409, not 422."""


_CODES: Final = frozenset(ResultCode)
_REFUSALS: Final = frozenset(Refusal)
_CODE_SHAPE: Final = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
"""What a result or refusal code looks like, the codes newer writers may add included."""

UNKNOWN_CODE_READ_AS: Final = ResultCode.ERROR
"""What a result of a code this version does not know is read as: a failure of the command
(a timer's send retried by its policy, then parked), never its success. A newer writer's
code may mean anything, applied or not; a retry of a request id its target applied is
answered DUPLICATE, so retrying is safe where taking it for done could drop a slot."""


def _known_refusal(value: object) -> object:
    # A well-formed code this version does not know comes from a newer writer: the command
    # is a plain rejection here (as it is to a reader without the field), not a bad record.
    if (
        isinstance(value, str)
        and value not in _REFUSALS
        and _CODE_SHAPE.fullmatch(value) is not None
    ):
        return None
    return value


def _newer_code(meaning: str) -> JsonDict:
    """The schema of a well-formed code this version does not write, read as `meaning`."""
    return {
        "type": "string",
        "pattern": f"^{_CODE_SHAPE.pattern}$",
        "description": f"a code a newer writer may give: {meaning} to this version",
    }


def _refusal_schema(schema: JsonDict) -> None:
    # The schema names the codes this version writes, and also takes any well-formed code:
    # a client validating against it must not refuse a newer writer's result.
    alternatives = schema["anyOf"]
    assert isinstance(alternatives, list)
    alternatives.insert(1, _newer_code("a plain rejection"))


def _code_schema(schema: JsonDict) -> None:
    # As a refusal's: the codes this version writes, or any well-formed one (an addition,
    # so a result valid before is valid still).
    description = schema.pop("description")
    known = dict(schema)
    schema.clear()
    schema.update(anyOf=[known, _newer_code(UNKNOWN_CODE_READ_AS.value)], description=description)


class CommandResult(Envelope):
    """The outcome of one command, on the results topic, keyed by request id."""

    request_id: str = Field(min_length=1, max_length=300)
    code: ResultCode = Field(
        description="what came of the command. A reader takes a code it does not know "
        "(upper-case letters, digits and `_`, at most 64) as ERROR: a failure, retried by "
        "a timer's policy, never a success; readers of 0.2.0 and before drop such a result "
        "as unreadable (their send times out)",
        json_schema_extra=_code_schema,
    )
    aggregate: AggregateRef
    message: str = ""
    version: int | None = Field(
        default=None, ge=0, le=MAX_INT64, description="the aggregate's version after it"
    )
    decided_at: Instant
    refusal: Annotated[Refusal | None, BeforeValidator(_known_refusal)] = Field(
        default=None,
        description="with REJECTED: the refusal's code, when it has one a client acts on "
        "(absent: a plain rejection). A reader takes a code it does not know (upper-case "
        "letters, digits and `_`, at most 64) as a plain rejection; readers of 0.2.0 and before "
        "keep the field and ignore it",
        json_schema_extra=_refusal_schema,
    )

    _unknown_code: str | None = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _newer_writers_code(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        # A well-formed code this version does not know comes from a newer writer: its
        # result is read (as ERROR, the code kept), not dropped as a bad record, so that a
        # send it answers fails now instead of waiting out its timeout at every attempt.
        code = data.get("code") if isinstance(data, dict) else None
        if not isinstance(code, str) or code in _CODES or _CODE_SHAPE.fullmatch(code) is None:
            return handler(data)
        result = handler({**data, "code": UNKNOWN_CODE_READ_AS.value})
        result._unknown_code = code
        return result

    @property
    def unknown_code(self) -> str | None:
        """The code the result was written with when this version does not know it (its
        `code` reads `UNKNOWN_CODE_READ_AS`), else None. Written again, the result says
        ERROR: only a node that decided a command writes its result."""
        return self._unknown_code

    @property
    def reason(self) -> str:
        """The result's message, with the code it was written with when this version does
        not know it: what a person reads of a failure."""
        if self._unknown_code is None:
            return self.message
        said = f": {self.message}" if self.message else ""
        return f"result code {self._unknown_code} (unknown to this version, read as ERROR){said}"
