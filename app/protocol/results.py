"""The outcome of a command, on its context's results topic (`CommandResult`): its code
(`ResultCode`) and, for a rejection a client acts on, why (`Refusal`). May import
`app.protocol.envelope`, `app.errors` and `tables` only."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Final

from pydantic import BeforeValidator, Field
from pydantic.config import JsonDict

from app.protocol.envelope import Envelope
from tables import AggregateRef
from tables.bounds import MAX_INT64, Instant

__all__ = ["CommandResult", "Refusal", "ResultCode"]


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
    """A timer book refused a pause or trigger of a running timer whose rule ended
    (`app.clients.timer_book.ended_refusal`): the web edge answers 409, not 422."""


_REFUSALS: Final = frozenset(Refusal)
_REFUSAL_SHAPE: Final = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
"""What a refusal code looks like, the codes newer writers may add included."""


def _known_refusal(value: object) -> object:
    # A well-formed code this version does not know comes from a newer writer: the command
    # is a plain rejection here (as it is to a reader without the field), not a bad record.
    if (
        isinstance(value, str)
        and value not in _REFUSALS
        and _REFUSAL_SHAPE.fullmatch(value) is not None
    ):
        return None
    return value


def _refusal_schema(schema: JsonDict) -> None:
    # The schema names the codes this version writes, and also takes any well-formed code:
    # a client validating against it must not refuse a newer writer's result.
    alternatives = schema["anyOf"]
    assert isinstance(alternatives, list)
    alternatives.insert(
        1,
        {
            "type": "string",
            "pattern": f"^{_REFUSAL_SHAPE.pattern}$",
            "description": "a code a newer writer may give: a plain rejection to this version",
        },
    )


class CommandResult(Envelope):
    """The outcome of one command, on the results topic, keyed by request id."""

    request_id: str = Field(min_length=1, max_length=300)
    code: ResultCode
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
