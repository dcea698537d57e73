"""AggregateRef: which aggregate a timer belongs to or is sent to."""

from __future__ import annotations

import re
from typing import Annotated, Final

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo

__all__ = [
    "DEFAULT_TENANT",
    "NEW_IDENTIFIER_PATTERN",
    "NEW_INPUT",
    "AggregateRef",
    "Identifier",
    "control_character",
    "unusable_request_id",
]

DEFAULT_TENANT = "(0)"

_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$"

NEW_INPUT: Final = {"new_input": True}
"""The validation context of input taken now: a record read from a topic, an HTTP request,
a command line. An `Identifier` there refuses C0 control characters; validated without
it (a row or state a node stored, maybe an older version's), it takes them as it always
did, so nothing stored stops loading."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def control_character(text: str) -> str | None:
    """Why `text` is no identifier, or None: it holds a C0 control character or DEL.

    Refused in new tenants, aggregate ids and timer keys: the store keeps any text (its
    keys are length-prefixed), but a NUL ends the text for a C reader (librdkafka's key
    printing, a shell's argument), and a newline or escape forges or garbles a log line,
    a terminal's `tickwheel` output, kcat's `%k`, the operator page's copy. None of them
    is typed in a name on purpose. Other Unicode (C1 controls, bidi marks) is left alone.
    """
    found = _CONTROL.search(text)
    if found is None:
        return None
    return (
        f"holds the control character U+{ord(found.group()):04X} at index {found.start()} "
        "(U+0000-U+001F and U+007F are refused in a tenant, an aggregate id or a timer key)"
    )


def unusable_request_id(given: str) -> bool:
    """Whether a request id given now cannot name a change: blank (taken for none, a fresh
    id, so a retry of it changed twice), with surrounding spaces, or holding a control
    character (`control_character`). The CLI's, the HTTP edge's and the jobs' one rule."""
    return not given or given.strip() != given or _CONTROL.search(given) is not None


def _refused_when_new(text: str, info: ValidationInfo) -> str:
    context = info.context
    if context is not None and context.get("new_input") is True and _CONTROL.search(text):
        raise ValueError(control_character(text))
    return text


NEW_IDENTIFIER_PATTERN: Final = r"^[^\u0000-\u001F\u007F]*(?![\s\S])"
"""`control_character`'s refusal as a JSON Schema pattern, for the published schemas
alone: validation is `_refused_when_new`'s, as a name stored before (read without
`NEW_INPUT`) may hold one, and `app.protocol.schemas` leaves it out of the schemas of
records that name what is stored. ECMA 262, read alike by Python's `re` (the lookahead
ends it, not `$`, which Python's `re.search` lets match before a trailing newline)."""

Identifier = Annotated[
    str,
    AfterValidator(_refused_when_new),
    Field(json_schema_extra={"pattern": NEW_IDENTIFIER_PATTERN}),
]
"""A tenant, an aggregate id or a timer key: text without C0 controls when it is new input
(validated with the `NEW_INPUT` context), any text otherwise."""


class AggregateRef(BaseModel):
    """An aggregate: `(context, aggregate, tenant, id)`, compared field by field.

    `aggregate` is the aggregate type's name inside its context (`order` in `shop`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    context: str = Field(min_length=1, max_length=100, pattern=_NAME)
    aggregate: str = Field(min_length=1, max_length=100, pattern=_NAME)
    tenant: Identifier = Field(default=DEFAULT_TENANT, min_length=1, max_length=200)
    id: Identifier = Field(min_length=1, max_length=500)

    @property
    def type_name(self) -> str:
        """`context.aggregate`, the name of the aggregate type and the prefix of its topics."""
        return f"{self.context}.{self.aggregate}"

    def __str__(self) -> str:
        return f"{self.context}.{self.aggregate}/{self.tenant}/{self.id}"
