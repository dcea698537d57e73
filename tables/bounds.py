"""The ranges every stored number must stay within: what the store's keys (8-byte
big-endian due times), Python's datetime and any other reader's signed 64-bit integers can
hold. A record outside them is bad input at the edge, never a row.

A body (`JsonObject`, `CommandBody`) is held to `check_json` as new input: what a client, a
handler or a producer writes now. Read back as stored (a timer row, an event folded again,
a book's own events: the validation context `STORED_BODIES`, or a `Timer` and a book's
timer by default), it is held to `check_stored` alone: 0.2.0 bounded no body, and what it
wrote must still load, fold and fire."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Annotated, Any, Final

from pydantic import Field, GetCoreSchemaHandler, ValidationInfo, ValidatorFunctionWrapHandler
from pydantic_core import CoreSchema, core_schema

__all__ = [
    "JSON_BOUNDS",
    "MAX_DEPTH",
    "MAX_INSTANT",
    "MAX_INT64",
    "MAX_STORED_DEPTH",
    "MAX_UINT64",
    "STORED_BODIES",
    "STORED_INPUT",
    "CommandBody",
    "Count",
    "Deadline",
    "Instant",
    "Interval",
    "JsonObject",
    "StoredObject",
    "Version",
    "check_finite",
    "check_json",
    "check_stored",
    "stored_bodies",
]

MAX_INT64: Final = (1 << 63) - 1
"""The largest signed 64-bit integer: what Java, Go and a JSON reader of another service hold."""

MAX_INSTANT: Final = int(datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC).timestamp() * 1000)
"""The last epoch millisecond Python's datetime can represent (9999-12-31T23:59:59.999Z)."""

Instant = Annotated[int, Field(ge=0, le=MAX_INSTANT)]
"""An epoch millisecond (UTC) from 1970 to the end of year 9999."""

Deadline = Annotated[int, Field(ge=0, le=MAX_INT64)]
"""When the store next hands a row out: an instant, or an instant plus a claim's or a
retry's delay (so a little past `MAX_INSTANT` is possible, never past 64 bits)."""

Interval = Annotated[int, Field(gt=0, le=MAX_INT64)]
"""A positive number of milliseconds."""

Version = Annotated[int, Field(ge=0, le=MAX_INT64)]
"""A version, slot index or count: not negative, within signed 64 bits."""

Count = Version


MIN_INT64: Final = -(1 << 63)

MAX_DEPTH: Final = 64
"""How deep a body's JSON may nest: far past any command's, well within what every JSON
encoder writes back (orjson stops at 255)."""


def check_json(value: Any, where: str = "body", depth: int = 0) -> None:
    """`ValueError` unless `value` is JSON that any reader holds and every encoder writes
    back: integers within signed 64 bits, finite numbers, string keys, nesting at most
    `MAX_DEPTH`."""
    # Every event's body is checked on its way in: the plain walk below passes a body at
    # a fraction of the cost; anything it does not pass is walked again to say why.
    if not _plainly_json(value, depth):
        _check_json(value, where, depth)


_FINE = frozenset({str, bool, type(None)})


def _plainly_json(value: Any, depth: int) -> bool:
    """Whether `value` passes `check_json` as seen by an iterative walk of the exact JSON
    types (dict, list, str, int, float, bool, None); False for anything else (a subclass,
    a value out of bounds), which `_check_json` then decides."""
    fine, isfinite = _FINE, math.isfinite
    t = type(value)
    if t is not dict and t is not list:
        if t in fine:
            return True
        if t is int:
            return bool(MIN_INT64 <= value <= MAX_INT64)
        return t is float and isfinite(value)
    stack: list[tuple[Any, int]] = [(value, depth)]
    while stack:
        container, level = stack.pop()
        if level >= MAX_DEPTH:
            return False
        if type(container) is dict:
            for key in container:
                if type(key) is not str:
                    return False
            items = container.values()
        else:
            items = container
        for item in items:
            t = type(item)
            if t in fine:
                continue
            if t is int:
                if not MIN_INT64 <= item <= MAX_INT64:
                    return False
            elif t is dict or t is list:
                stack.append((item, level + 1))
            elif t is not float or not isfinite(item):
                return False
    return True


def _check_json(value: Any, where: str, depth: int) -> None:
    if value is None or isinstance(value, bool | str):
        return
    if isinstance(value, int):
        if not MIN_INT64 <= value <= MAX_INT64:
            raise ValueError(f"{where}: integer {value} is outside signed 64 bits")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where}: {value} is not a finite number")
    elif isinstance(value, dict | list):
        if depth >= MAX_DEPTH:
            raise ValueError(f"{where}: nested more than {MAX_DEPTH} deep")
        if isinstance(value, dict):
            for key in value:
                if not isinstance(key, str):
                    # JSON's keys are strings: written as "1", it is read back another
                    # body than the one decided with (and {1: .., "1": ..} as one key).
                    raise ValueError(f"{where}: key {key!r} is not a string")
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            _check_json(item, f"{where}.{key}", depth + 1)
    else:
        raise ValueError(f"{where}: {type(value).__name__} is not JSON")


def check_finite(value: Any, where: str = "state") -> None:
    """`ValueError` where `value` holds a float that JSON cannot (NaN, an infinity: orjson
    writes it as null). Only that: a stored aggregate holding a number past 64 bits or
    nested deep (which `check_json` refuses in a record) was written and read back before,
    and must still be."""
    stack: list[Any] = [value]
    while stack:  # a plain walk first: a state is checked at every command
        item = stack.pop()
        t = type(item)
        if t is dict:
            stack.extend(item.values())
        elif t is list:
            stack.extend(item)
        elif t is float and not math.isfinite(item):
            _say_not_finite(value, where)


def _say_not_finite(value: Any, where: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where}: {value} is not a finite number")
    if isinstance(value, dict | list):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            _say_not_finite(item, f"{where}.{key}")


MAX_UINT64: Final = (1 << 64) - 1
"""The largest integer orjson writes (and so 0.2.0 wrote in a record)."""

MAX_STORED_DEPTH: Final = 198
"""How deep a stored body may nest: as deep as a timer row's body can be at all (pydantic's
JSON parser reads 200 levels, the row and its command take two), so every row's body read
back passes and a check of the body alone (`tables.rowcheck`) decides as the row's; orjson
writes 254 levels, so any record holding one is written back."""

STORED_BODIES: Final = "stored_bodies"
"""The validation context's key that makes a body one read back (`check_stored`), not new
input (`check_json`): set beside `tables.refs.NEW_INPUT`'s own key or alone."""

STORED_INPUT: Final = {STORED_BODIES: True}
"""The validation context of what a node reads back as stored: an event folded again (the
lenient read of `app.protocol.wire.decode_event`), a book's own events. Its names are not
held to `tables.refs.NEW_INPUT` either."""


class StoredObject(dict[str, Any]):
    """A command's body read back past `check_json`'s bounds (0.2.0 wrote such rows), within
    `check_stored`'s. Validated again as it is (a timer's command built from its row, an
    operator's copy of it), it is held to `check_stored` only: a stored timer fires with
    the body it holds, and its target decides what to make of it. Made only for such a
    body: every other one is a plain dict."""

    __slots__ = ()


def check_stored(value: Any, where: str = "body") -> None:
    """`ValueError` unless `value` (a JSON value read back) is one every encoder writes
    back: finite numbers, integers orjson writes (-2**63 to 2**64-1), nested at most
    `MAX_STORED_DEPTH`. No 64-bit or depth bound of `check_json`'s: 0.2.0 took and
    stored bodies without them. An iterative walk (no recursion, however deep), after
    `check_json`'s quick one: what it passes (nearly every body) passes."""
    if not _plainly_json(value, 0):
        _check_stored(value, where)


def _check_stored(value: Any, where: str) -> None:
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            if level >= MAX_STORED_DEPTH:
                raise ValueError(f"{where}: nested more than {MAX_STORED_DEPTH} deep")
            items = item.values() if isinstance(item, dict) else item
            stack.extend((v, level + 1) for v in items)
        elif item is None or isinstance(item, bool | str):
            continue
        elif isinstance(item, int):
            if not MIN_INT64 <= item <= MAX_UINT64:
                raise ValueError(f"{where}: integer {item} is outside what JSON encoders write")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise ValueError(f"{where}: {item} is not a finite number")
        else:
            raise ValueError(f"{where}: {type(item).__name__} is not JSON")


def stored_bodies(info: ValidationInfo) -> bool:
    """Whether `info`'s validation reads bodies back as stored (`STORED_BODIES`)."""
    context = info.context
    return context is not None and context.get(STORED_BODIES) is True


def _checked(value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
    # `check_json` inlined: every body of every record comes through here. The context is
    # looked at only for a body past its bounds.
    if not _plainly_json(value, 0):
        if stored_bodies(info):
            _check_stored(value, "body")
        else:
            _check_json(value, "body", 0)
    return value


def _checked_command(value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
    if _plainly_json(value, 0):
        return value
    if not stored_bodies(info):
        _check_json(value, "body", 0)
        return value
    _check_stored(value, "body")
    try:
        _check_json(value, "body", 0)  # (recurses at most `MAX_DEPTH` deep)
    except ValueError:
        return StoredObject(value)
    return value


class _Body:
    """A body's validation: `check` after the dict's (JSON: a record, a row). From Python,
    a `StoredObject` given (a stored timer's body, as its command is built to be sent) is
    validated as read back as stored, whatever the context."""

    def __init__(self, check: Any) -> None:
        self.check = check

    def _python(
        self, value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo
    ) -> Any:
        body = handler(value)
        if type(value) is StoredObject:
            return self.check(body, _STORED_INFO)
        return self.check(body, info)

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        inner = handler(source)
        return core_schema.json_or_python_schema(
            json_schema=core_schema.with_info_after_validator_function(self.check, inner),
            python_schema=core_schema.with_info_wrap_validator_function(self._python, inner),
        )


class _StoredInfo:
    """What `_checked` and `_checked_command` read of a stored validation's info."""

    context = STORED_INPUT


_STORED_INFO: Any = _StoredInfo()


JSON_BOUNDS: Final = (
    "an integer outside signed 64 bits (-9223372036854775808 to 9223372036854775807), a "
    "number past a 64-bit float's range (1e400: JSON has no infinity or NaN), or more than "
    f"{MAX_DEPTH} levels of objects and arrays"
)
"""What `check_json` refuses, said in the published schemas (JSON Schema cannot say it)."""

_BODY_SCHEMA: Final = Field(
    description="a JSON object; the readers refuse a new record whose body holds "
    f"{JSON_BOUNDS} (this object the first level)"
)

JsonObject = Annotated[dict[str, Any], _Body(_checked), _BODY_SCHEMA]
"""A JSON object within `check_json`'s bounds (an event's or a command record's body); read
back as stored (`STORED_BODIES`, or a `StoredObject` given), within `check_stored`'s."""

CommandBody = Annotated[dict[str, Any], _Body(_checked_command), _BODY_SCHEMA]
"""A timer's command's body (`tables.timer.CommandSpec`): a `JsonObject`, but one read back
as stored past `check_json`'s bounds is kept as a `StoredObject`."""
