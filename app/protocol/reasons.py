"""A validation error of a record, an HTTP body or a command line as a reason a person
reads (`error_reason`): where, what, and the value of the wrong type it got, cut short."""

from __future__ import annotations

from typing import Final

import orjson
from pydantic_core import ErrorDetails

__all__ = ["error_reason"]

_JSON_KINDS: Final = {str: "string", bool: "boolean", int: "integer", float: "number"}


def error_reason(err: ErrorDetails, whole: str = "body") -> str:
    """One validation error as a reason: where, what, and for a value of the wrong type
    (which strict validation refuses: `"3"` for an integer) what it was, as `"3"` alone
    reads like an integer to a producer looking for the fault."""
    where = ".".join(str(p) for p in err["loc"]) or whole
    reason = f"{where}: {err['msg']}"
    value = err.get("input")
    kind = _JSON_KINDS.get(type(value))
    if err["type"].endswith("_type") and kind is not None:
        reason += f" (got the {kind} {_shown(value)})"
    return reason


def _shown(value: str | bool | int | float) -> str:
    """A JSON scalar as its JSON, cut short: a record's value may be any size (an integer
    of thousands of digits, past what orjson or `str` writes)."""
    if isinstance(value, str):
        return orjson.dumps(value[:40]).decode() + ("..." if len(value) > 40 else "")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and value.bit_length() > 64:
        return f"of {value.bit_length()} bits"
    return repr(value)
