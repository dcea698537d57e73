"""The ranges every stored number must stay within: what the store's keys (8-byte
big-endian due times), Python's datetime and any other reader's signed 64-bit integers can
hold. A record outside them is bad input at the edge, never a row."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Annotated, Any, Final

from pydantic import AfterValidator, Field

__all__ = [
    "MAX_DEPTH",
    "MAX_INSTANT",
    "MAX_INT64",
    "Count",
    "Deadline",
    "Instant",
    "Interval",
    "JsonObject",
    "Version",
    "check_finite",
    "check_json",
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
    back: integers within signed 64 bits, finite numbers, nesting at most `MAX_DEPTH`."""
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
        for item in container.values() if type(container) is dict else container:
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


def _checked(value: dict[str, Any]) -> dict[str, Any]:
    # `check_json` inlined: every body of every record comes through here.
    if not _plainly_json(value, 0):
        _check_json(value, "body", 0)
    return value


JsonObject = Annotated[dict[str, Any], AfterValidator(_checked)]
"""A JSON object within `check_json`'s bounds (a command's or an event's body)."""
